//! The embedded nats-server's identities and subject permissions (docs/security.md).
//!
//! `switchyard up` (and the auth integration tests) start the server with one user per
//! [`Identity`], a random password each ([`Credentials`], kept in
//! `<data_dir>/nats-credentials.json`, mode 0600, reused by the next `up` on the same data dir),
//! and the permissions [`users`] computes from the subject prefix and the bucket and stream
//! names the services use. Each identity's reply subjects live under `_INBOX.<identity>.`, so no
//! service can read another's replies. JetStream API subjects are from the nats-server JetStream
//! API reference (`$JS.API.STREAM.*`, `$JS.API.CONSUMER.*`, `$JS.API.DIRECT.GET.*`, `$JS.ACK.*`,
//! `$JS.FC.*`); KV buckets are streams `KV_<bucket>` written on `$KV.<bucket>.>`, object stores
//! streams `OBJ_<bucket>` written on `$O.<bucket>.>`.

use rand::Rng as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use switchyard_natsd::{Permissions, Rule, User};
use switchyard_schemas::Secret;
use switchyard_schemas::nats_config::NatsConfig;
use switchyard_schemas::subjects::{LEGACY_USAGE_STREAM, LIMITS_BUCKET, USAGE_STREAM};

/// A service's NATS identity on the embedded server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Identity {
    /// The HTTP front doors: publishes requests, reads replies, owns budgets, batches, files and
    /// stored responses.
    Ingress,
    /// Provider workers: take requests, stream replies, own the RPM/TPM limits bucket.
    Worker,
    /// The usage consumer and ledger.
    Billing,
    /// The answer cache.
    Cache,
    /// The operator: `config push`, `cache purge`, `up`'s config file watcher.
    Admin,
}

impl Identity {
    /// Every identity, in file order.
    pub const ALL: [Identity; 5] = [
        Identity::Ingress,
        Identity::Worker,
        Identity::Billing,
        Identity::Cache,
        Identity::Admin,
    ];

    /// The user name: `ingress`, `worker`, `billing`, `cache`, `admin`.
    pub fn name(self) -> &'static str {
        match self {
            Identity::Ingress => "ingress",
            Identity::Worker => "worker",
            Identity::Billing => "billing",
            Identity::Cache => "cache",
            Identity::Admin => "admin",
        }
    }

    /// This identity's reply-subject prefix, `_INBOX.<name>`.
    pub fn inbox_prefix(self) -> String {
        format!("_INBOX.{}", self.name())
    }
}

/// The file `up` keeps the generated passwords in, under the data dir.
pub const CREDENTIALS_FILE: &str = "nats-credentials.json";

/// One password per identity.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    passwords: BTreeMap<String, String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials([redacted])")
    }
}

/// Reading or writing the credentials file failed.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// File system.
    #[error("NATS credentials file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The file is not a JSON object with a password for every identity.
    #[error("NATS credentials file {path}: {message} (delete it to generate new ones)")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl Credentials {
    /// Fresh random passwords (32 alphanumeric characters, ~190 bits each).
    pub fn generate() -> Self {
        let mut rng = rand::rng();
        let passwords = Identity::ALL
            .iter()
            .map(|id| {
                let pw: String = (&mut rng)
                    .sample_iter(rand::distr::Alphanumeric)
                    .take(32)
                    .map(char::from)
                    .collect();
                (id.name().to_owned(), pw)
            })
            .collect();
        Self { passwords }
    }

    /// Reads `<data_dir>/nats-credentials.json`, or generates credentials and writes it (mode
    /// 0600) when it does not exist. Returns the credentials and the file's path.
    pub fn load_or_create(data_dir: &Path) -> Result<(Self, PathBuf), CredentialsError> {
        let path = data_dir.join(CREDENTIALS_FILE);
        let io = |source| CredentialsError::Io {
            path: path.clone(),
            source,
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let invalid = |message: String| CredentialsError::Invalid {
                    path: path.clone(),
                    message,
                };
                let passwords: BTreeMap<String, String> =
                    serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
                for id in Identity::ALL {
                    if passwords.get(id.name()).is_none_or(String::is_empty) {
                        return Err(invalid(format!("no password for `{}`", id.name())));
                    }
                }
                tighten(&path).map_err(io)?;
                Ok((Self { passwords }, path))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let c = Self::generate();
                let text = serde_json::to_string_pretty(&c.passwords)
                    .map_err(|e| io(std::io::Error::other(e)))?;
                switchyard_natsd::write_private(&path, &text).map_err(io)?;
                Ok((c, path))
            }
            Err(e) => Err(io(e)),
        }
    }

    /// The password of `id`.
    pub fn password(&self, id: Identity) -> &str {
        self.passwords.get(id.name()).map_or("", String::as_str)
    }

    /// The connection settings of `id`: its user, password and inbox prefix.
    pub fn config_for(&self, id: Identity) -> NatsConfig {
        NatsConfig {
            user: Some(id.name().to_owned()),
            password: Some(Secret::new(self.password(id))),
            inbox_prefix: Some(id.inbox_prefix()),
            ..Default::default()
        }
    }
}

/// Makes `path` readable by its owner only again if someone widened its mode (Unix).
fn tighten(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
        if mode != 0o600 {
            tracing::warn!(file = %path.display(), mode = format!("{mode:o}"),
                "NATS credentials file was readable by others; set to 0600");
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_owned()).collect()
}

/// API subjects that read stream `name` (info, get, consumers, acks, flow control).
fn stream_reader(name: &str) -> Vec<String> {
    [
        "$JS.API.STREAM.INFO.{}",
        "$JS.API.STREAM.MSG.GET.{}",
        "$JS.API.DIRECT.GET.{}",
        "$JS.API.DIRECT.GET.{}.>",
        "$JS.API.CONSUMER.CREATE.{}",
        "$JS.API.CONSUMER.CREATE.{}.>",
        "$JS.API.CONSUMER.INFO.{}.>",
        "$JS.API.CONSUMER.DELETE.{}.>",
        "$JS.API.CONSUMER.MSG.NEXT.{}.>",
        "$JS.FC.{}.>",
    ]
    .iter()
    .map(|t| t.replace("{}", name))
    .collect()
}

/// API subjects that create stream `name` (when missing) and its durable consumers, and
/// acknowledge its messages (a work queue's ack removes the message). Not `UPDATE` (it could
/// add subjects, e.g. `<prefix>.req.>`, to the stream and so read them) nor `PURGE`: those
/// are granted one by one where the code needs them ([`api`]).
fn stream_owner(name: &str) -> Vec<String> {
    let mut v = stream_reader(name);
    v.extend(
        [
            "$JS.API.STREAM.CREATE.{}",
            "$JS.API.CONSUMER.DURABLE.CREATE.{}.>",
            "$JS.ACK.{}.>",
            "$JS.ACK.*.*.{}.>",
        ]
        .iter()
        .map(|t| t.replace("{}", name)),
    );
    v
}

/// `$JS.API.<op>.<stream>`, e.g. `api("STREAM.PURGE", "SY_BATCH_RESULTS")`.
fn api(op: &str, stream: &str) -> String {
    format!("$JS.API.{op}.{stream}")
}

/// Owner of KV bucket `bucket`: its stream and its writes.
fn kv_owner(bucket: &str) -> Vec<String> {
    let mut v = stream_owner(&format!("KV_{bucket}"));
    v.push(format!("$KV.{bucket}.>"));
    v
}

/// Reads and writes KV bucket `bucket` by key (get, put, compare-and-set) and may create it,
/// without consumers: a service that never watches or lists the bucket gets no way to have
/// JetStream deliver its content elsewhere (docs/security.md, push consumers).
fn kv_writer(bucket: &str) -> Vec<String> {
    let stream = format!("KV_{bucket}");
    [
        "$JS.API.STREAM.INFO.{}",
        "$JS.API.STREAM.CREATE.{}",
        "$JS.API.STREAM.MSG.GET.{}",
        "$JS.API.DIRECT.GET.{}",
        "$JS.API.DIRECT.GET.{}.>",
    ]
    .iter()
    .map(|t| t.replace("{}", &stream))
    .chain([format!("$KV.{bucket}.>")])
    .collect()
}

/// Owner of object store `bucket`.
fn object_owner(bucket: &str) -> Vec<String> {
    let mut v = stream_owner(&format!("OBJ_{bucket}"));
    v.push(format!("$O.{bucket}.>"));
    v
}

/// What every service needs: its own inbox, account info, and reading the live config
/// (`SY_CONFIG`, written only by admin).
fn base(id: Identity) -> (Vec<String>, Vec<String>) {
    let inbox = format!("{}.>", id.inbox_prefix());
    let mut publish = vec![inbox.clone(), "$JS.API.INFO".to_owned()];
    publish.extend(stream_reader(&format!("KV_{}", crate::reload::BUCKET)));
    (publish, vec![inbox])
}

/// The server users for `creds`, with the permissions of each identity under subject prefix
/// `prefix` (docs/security.md explains each line).
pub fn users(creds: &Credentials, prefix: &str) -> Vec<User> {
    let p = |rest: &str| format!("{prefix}.{rest}");
    Identity::ALL
        .iter()
        .map(|&id| {
            let (mut publish, mut subscribe) = base(id);
            let mut deny_publish = Vec::new();
            let mut deny_subscribe = Vec::new();
            let mut allow_responses = false;
            match id {
                Identity::Ingress => {
                    publish.extend([
                        p("req.>"),
                        p("credit.>"),
                        p("cancel.>"),
                        p("cache.lookup"),
                        p("cache.store"),
                        p("billing.usage"),
                        p("billing.audit"),
                        p("billing.balance"),
                        p("usage.>"),
                        p("batch.>"),
                    ]);
                    subscribe.extend([p("inbox.>"), p("health.>")]);
                    for b in [
                        switchyard_budgets::BUDGETS_BUCKET,
                        switchyard_budgets::RATES_BUCKET,
                        switchyard_ingress::responses::store::RESPONSES_BUCKET,
                        switchyard_ingress::batch::store::RECORDS_BUCKET,
                        switchyard_ingress::batch::store::ACTIVE_BUCKET,
                    ] {
                        publish.extend(kv_owner(b));
                    }
                    // `cache_replica` and its key set (headers only): watch the cache entries
                    // (and create the bucket when the cache service has not yet); never write.
                    let cache_kv = format!("KV_{}", switchyard_cache::BUCKET);
                    publish.extend(stream_reader(&cache_kv));
                    publish.push(api("STREAM.CREATE", &cache_kv));
                    publish.extend(object_owner(switchyard_ingress::batch::store::FILES_BUCKET));
                    publish.extend(stream_owner(switchyard_ingress::batch::store::ITEMS_STREAM));
                    publish.extend(stream_owner(
                        switchyard_ingress::batch::store::RESULTS_STREAM,
                    ));
                    // Deleting a batch's results and a file's chunks; `responses.ttl_s`
                    // changes the stored responses' age limit.
                    publish.extend([
                        api(
                            "STREAM.PURGE",
                            switchyard_ingress::batch::store::RESULTS_STREAM,
                        ),
                        api(
                            "STREAM.PURGE",
                            &format!("OBJ_{}", switchyard_ingress::batch::store::FILES_BUCKET),
                        ),
                        api(
                            "STREAM.UPDATE",
                            &format!(
                                "KV_{}",
                                switchyard_ingress::responses::store::RESPONSES_BUCKET
                            ),
                        ),
                    ]);
                }
                Identity::Worker => {
                    publish.extend([p("inbox.>"), p("health.>"), p("usage.>")]);
                    subscribe.extend([p("req.>"), p("cancel.>"), p("credit.>")]);
                    publish.extend(kv_writer(LIMITS_BUCKET));
                    // Embedding answers go to the requester's `_INBOX` reply subject.
                    allow_responses = true;
                }
                Identity::Billing => {
                    // Re-publishes the legacy stream's events into the work queue.
                    publish.push(p("usage.>"));
                    subscribe.push(p("billing.usage"));
                    subscribe.push(p("billing.audit"));
                    subscribe.push(p("billing.balance"));
                    publish.extend(stream_owner(USAGE_STREAM));
                    // The legacy stream of earlier versions: moved off the usage subjects,
                    // copied and deleted, never created.
                    publish.extend(stream_reader(LEGACY_USAGE_STREAM));
                    publish.extend([
                        api("STREAM.UPDATE", LEGACY_USAGE_STREAM),
                        api("STREAM.DELETE", LEGACY_USAGE_STREAM),
                    ]);
                    // Applies the budget settlements ingress could not (`budget_owed`).
                    publish.extend(kv_writer(switchyard_budgets::BUDGETS_BUCKET));
                    allow_responses = true;
                }
                Identity::Cache => {
                    subscribe.push(p("cache.>"));
                    publish.extend(kv_owner(switchyard_cache::BUCKET));
                    allow_responses = true;
                }
                Identity::Admin => {
                    // The operator may do anything but read or forge requests and replies.
                    publish = s(&[">"]);
                    subscribe = s(&[">"]);
                    deny_publish = vec![p("req.>"), p("inbox.>")];
                    deny_subscribe = vec![p("req.>"), p("inbox.>")];
                }
            }
            if id != Identity::Admin {
                // Written only by admin, even where a wildcard above would cover it.
                deny_publish.push(format!("$KV.{}.>", crate::reload::BUCKET));
            }
            User {
                name: id.name().to_owned(),
                password: creds.password(id).to_owned(),
                password_env: None,
                permissions: Permissions {
                    publish: Rule {
                        allow: publish,
                        deny: deny_publish,
                    },
                    subscribe: Rule {
                        allow: subscribe,
                        deny: deny_subscribe,
                    },
                    allow_responses,
                },
            }
        })
        .collect()
}

/// The environment variable holding `id`'s password in the compose topology:
/// `SWITCHYARD_NATS_PASSWORD_<ID>` (e.g. `SWITCHYARD_NATS_PASSWORD_INGRESS`).
pub fn password_env(id: Identity) -> String {
    format!("SWITCHYARD_NATS_PASSWORD_{}", id.name().to_uppercase())
}

/// A nats-server config with the identities and permissions of [`users`] whose passwords
/// the server reads from [`password_env`] variables (`switchyard nats-config`; compose.yaml
/// mounts its output, `config/nats-server.conf`).
pub fn server_config_with_env_passwords(prefix: &str) -> String {
    let mut users = users(&Credentials::generate(), prefix);
    for (u, id) in users.iter_mut().zip(Identity::ALL) {
        u.password.clear();
        u.password_env = Some(password_env(id));
    }
    format!(
        "# Generated by `switchyard nats-config` (docs/security.md): one user per Switchyard\n\
         # service, passwords from the SWITCHYARD_NATS_PASSWORD_* environment variables.\n{}",
        switchyard_natsd::config_text(&users)
    )
}

/// `.env` lines with a fresh random password per identity (`switchyard nats-config
/// --passwords`).
pub fn env_passwords() -> String {
    let creds = Credentials::generate();
    Identity::ALL
        .iter()
        .map(|&id| format!("{}={}\n", password_env(id), creds.password(id)))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_compose_server_config_is_generated_from_the_policy() {
        let committed = include_str!("../../config/nats-server.conf");
        assert_eq!(
            committed,
            server_config_with_env_passwords("sy"),
            "regenerate: switchyard nats-config > config/nats-server.conf"
        );
        assert!(committed.contains("password: $SWITCHYARD_NATS_PASSWORD_WORKER\n"));
    }

    #[test]
    fn credentials_file_is_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (a, path) = Credentials::load_or_create(dir.path()).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let (b, _) = Credentials::load_or_create(dir.path()).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.password(Identity::Admin).len(), 32);
        assert_ne!(a.password(Identity::Admin), a.password(Identity::Worker));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(format!("{a:?}"), "Credentials([redacted])");
    }

    #[test]
    fn only_ingress_publishes_and_only_workers_subscribe_requests() {
        let users = users(&Credentials::generate(), "sy");
        let by = |n: &str| users.iter().find(|u| u.name == n).unwrap().clone();
        let req = "sy.req.>".to_owned();
        for u in &users {
            let pubs = u.permissions.publish.allow.contains(&req);
            let subs = u.permissions.subscribe.allow.contains(&req);
            assert_eq!(pubs, u.name == "ingress", "{}", u.name);
            assert_eq!(subs, u.name == "worker", "{}", u.name);
        }
        let admin = by("admin");
        assert!(admin.permissions.publish.deny.contains(&req));
        assert!(admin.permissions.subscribe.deny.contains(&req));
        assert!(
            by("worker")
                .permissions
                .publish
                .deny
                .contains(&"$KV.SY_CONFIG.>".to_owned())
        );
    }
}
