//! `switchyard key …`: API keys through a running gateway's admin API (`/admin/keys`), plus the
//! offline `new` (print a config entry) and `hash`.

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use switchyard_schemas::tenancy::{new_api_key, sha256_hex, valid_id};

/// Where the admin API is and the admin key to call it with.
#[derive(Args, Clone)]
pub(crate) struct AdminApi {
    /// The gateway's base URL.
    #[arg(long, env = "SWITCHYARD_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Admin key (sent as `Authorization: Bearer`); prefer the variable (flags show in `ps`).
    #[arg(long, env = "SWITCHYARD_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
}

/// `switchyard key …`.
#[derive(Subcommand)]
pub(crate) enum KeyAction {
    /// Create a key through the admin API; prints it (shown once) and its JSON record. Only its
    /// SHA-256 is stored.
    Create {
        /// Tenant the key belongs to.
        #[arg(long)]
        tenant: Option<String>,
        /// Key id (default `key-<uuid>`).
        #[arg(long)]
        id: Option<String>,
        /// Unix seconds from which the key is refused.
        #[arg(long)]
        expires_at: Option<u64>,
        #[command(flatten)]
        api: AdminApi,
    },
    /// List keys (JSON lines: id, tenant, status, expiry).
    List {
        /// Only this tenant's keys.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        api: AdminApi,
    },
    /// Print one key's record.
    Get {
        /// Key id.
        id: String,
        #[command(flatten)]
        api: AdminApi,
    },
    /// Revoke a key (401 on every replica within a second).
    Revoke {
        /// Key id.
        id: String,
        #[command(flatten)]
        api: AdminApi,
    },
    /// Replace a key's secret; prints the new key (shown once).
    Rotate {
        /// Key id.
        id: String,
        #[command(flatten)]
        api: AdminApi,
    },
    /// Set (Unix seconds) or clear (`none`) a key's expiry.
    Expire {
        /// Key id.
        id: String,
        /// Unix seconds, or `none`.
        at: String,
        #[command(flatten)]
        api: AdminApi,
    },
    /// Delete a key's entry.
    Delete {
        /// Key id.
        id: String,
        #[command(flatten)]
        api: AdminApi,
    },
    /// Offline: print a new random key (`sk-sy-` + 40 letters/digits) and the `keys:` entry for
    /// it. Only its SHA-256 goes in the config; the key itself is shown once.
    New {
        /// Key id (`[A-Za-z0-9_-]`, ≤ 64), recorded on usage and naming budgets.
        #[arg(long)]
        id: String,
        /// Tenant the key belongs to.
        #[arg(long)]
        tenant: String,
    },
    /// Offline: print the SHA-256 (`key_sha256`) of the key read from standard input.
    Hash,
}

/// Calls the admin API; the JSON answer, or the error's message and status.
pub(crate) async fn call(
    api: &AdminApi,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let key = api
        .admin_key
        .as_deref()
        .ok_or("pass --admin-key (or set SWITCHYARD_ADMIN_KEY)")?;
    let url = format!("{}{path}", api.url.trim_end_matches('/'));
    let mut rb = reqwest::Client::new()
        .request(method, &url)
        .bearer_auth(key);
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let resp = rb.send().await.map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    let v: Value = resp
        .json()
        .await
        .map_err(|e| format!("{url}: {status}: {e}"))?;
    if !status.is_success() {
        let m = v["error"]["message"].as_str().unwrap_or("(no message)");
        return Err(format!("{status}: {m}"));
    }
    Ok(v)
}

fn print_key(v: &Value) {
    if let Some(k) = v["key"].as_str() {
        println!("key (shown once): {k}");
    }
    let mut rec = v.clone();
    if let Some(o) = rec.as_object_mut() {
        o.remove("key");
    }
    println!("{rec}");
}

/// Runs the action; the output goes to stdout.
pub(crate) async fn run(action: KeyAction) -> Result<(), String> {
    use reqwest::Method;
    // Every admin call but `list` answers one key's record: the call, then that record printed.
    let (api, method, path, body) = match action {
        KeyAction::Create {
            tenant,
            id,
            expires_at,
            api,
        } => {
            let body = json!({"tenant": tenant, "id": id, "expires_at": expires_at});
            let body: serde_json::Map<String, Value> = body
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let body = Some(Value::Object(body));
            (api, Method::POST, "/admin/keys".to_owned(), body)
        }
        KeyAction::List { tenant, api } => return list(&api, tenant).await,
        KeyAction::Get { id, api } => (api, Method::GET, format!("/admin/keys/{id}"), None),
        KeyAction::Revoke { id, api } => {
            (api, Method::POST, format!("/admin/keys/{id}/revoke"), None)
        }
        KeyAction::Rotate { id, api } => {
            (api, Method::POST, format!("/admin/keys/{id}/rotate"), None)
        }
        KeyAction::Expire { id, at, api } => {
            let at = match at.as_str() {
                "none" => Value::Null,
                s => json!(
                    s.parse::<u64>()
                        .map_err(|_| "AT must be Unix seconds or `none`")?
                ),
            };
            let body = Some(json!({"expires_at": at}));
            (api, Method::PATCH, format!("/admin/keys/{id}"), body)
        }
        KeyAction::Delete { id, api } => (api, Method::DELETE, format!("/admin/keys/{id}"), None),
        KeyAction::New { id, tenant } => return new_key(&id, &tenant),
        KeyAction::Hash => return hash_stdin(),
    };
    print_key(&call(&api, method, &path, body).await?);
    Ok(())
}

/// `key list`: one key record per line.
async fn list(api: &AdminApi, tenant: Option<String>) -> Result<(), String> {
    let path = match tenant {
        Some(t) => format!("/admin/keys?tenant={t}"),
        None => "/admin/keys".into(),
    };
    let v = call(api, reqwest::Method::GET, &path, None).await?;
    for k in v["data"].as_array().into_iter().flatten() {
        println!("{k}");
    }
    Ok(())
}

/// `key new`: a new random key and the `keys:` entry for it.
fn new_key(id: &str, tenant: &str) -> Result<(), String> {
    for (name, v) in [("--id", id), ("--tenant", tenant)] {
        if !valid_id(v) {
            return Err(format!("{name} `{v}` must be 1-64 of [A-Za-z0-9_-]"));
        }
    }
    let key = new_api_key();
    println!("key (shown once): {key}\n");
    println!("keys:");
    println!("  - id: {id}");
    println!("    tenant: {tenant}");
    println!("    key_sha256: {}", sha256_hex(&key));
    println!("    # budget: {{daily_usd: 50, monthly_usd: 1000, tokens_per_minute: 200000}}");
    Ok(())
}

/// `key hash`: the SHA-256 of the key on standard input.
fn hash_stdin() -> Result<(), String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| format!("reading the key from stdin: {e}"))?;
    let key = line.trim();
    if key.is_empty() {
        return Err("no key on standard input".into());
    }
    println!("{}", sha256_hex(key));
    Ok(())
}
