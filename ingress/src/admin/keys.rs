//! `/admin/keys…` and `/admin/tenants…`: client API keys (create — the key is shown once and
//! only its SHA-256 is stored —, list, get, update expiry/enabled/budget, revoke, rotate, delete)
//! and the tenants they belong to.

use super::{AdminCaller, json_body, not_found};
use crate::AppState;
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value as Json, json};
use serde_yaml_ng::{Mapping, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use switchyard_schemas::tenancy::{
    Budget, KeyConfig, RateLimits, new_api_key, sha256_hex, valid_id,
};

/// `POST /admin/keys` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    /// Key id; default `key-<uuid>`.
    #[serde(default)]
    id: Option<String>,
    /// Tenant; a tenant admin key's own tenant by default (and only that).
    #[serde(default)]
    tenant: Option<String>,
    /// Unix seconds from which the key is refused.
    #[serde(default)]
    expires_at: Option<u64>,
    /// Budget of the key.
    #[serde(default)]
    budget: Option<Budget>,
    /// Request-rate limits of the key (`rpm`, `tpm`, `max_concurrent`; docs/limits.md).
    #[serde(default)]
    limits: Option<RateLimits>,
    /// May read every tenant's usage.
    #[serde(default)]
    admin: bool,
}

/// The JSON view of a key (never its hash or value).
fn view(k: &KeyConfig, now_s: u64) -> Json {
    let status = if !k.enabled {
        "revoked"
    } else if k.expired(now_s) {
        "expired"
    } else {
        "active"
    };
    json!({
        "object": "api_key",
        "id": k.id,
        "tenant": k.tenant,
        "status": status,
        "enabled": k.enabled,
        "expires_at": k.expires_at,
        "admin": k.admin,
        "budget": k.budget,
        "limits": k.limits,
    })
}

fn now_s() -> u64 {
    switchyard_schemas::now_ms() / 1000
}

fn key_not_found(id: &str) -> ApiError {
    not_found("id", format!("No API key with id `{id}`."))
}

fn forbidden(param: &str, message: String) -> ApiError {
    ApiError::permission_denied(message, Some(param))
}

/// The key `id` of the live config, if the caller may see it.
fn visible(app: &AppState, who: &AdminCaller, id: &str) -> Result<KeyConfig, ApiError> {
    app.config
        .get()
        .keys
        .iter()
        .find(|k| k.id == id && who.sees(&k.tenant))
        .cloned()
        .ok_or_else(|| key_not_found(id))
}

/// The `keys` sequence of a stored config (created when missing).
fn keys_of(root: &mut Value) -> Result<&mut Vec<Value>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "The stored config's `keys` is not a list.",
            Some("keys".into()),
        )
    };
    let top = root.as_mapping_mut().ok_or_else(bad)?;
    if !top.contains_key("keys") {
        top.insert("keys".into(), Value::Sequence(Vec::new()));
    }
    top.get_mut("keys")
        .and_then(Value::as_sequence_mut)
        .ok_or_else(bad)
}

/// The stored entry of key `id`, if `who` may see it.
fn entry_of<'a>(
    root: &'a mut Value,
    who: &AdminCaller,
    id: &str,
) -> Result<&'a mut Mapping, ApiError> {
    keys_of(root)?
        .iter_mut()
        .filter_map(Value::as_mapping_mut)
        .find(|m| {
            m.get("id").and_then(Value::as_str) == Some(id)
                && m.get("tenant")
                    .and_then(Value::as_str)
                    .is_some_and(|t| who.sees(t))
        })
        .ok_or_else(|| key_not_found(id))
}

/// Replaces the entry's key by a new one: only its hash is stored; returns the key.
fn set_new_key(m: &mut Mapping) -> String {
    let key = new_api_key();
    m.remove("key");
    m.insert("key_sha256".into(), sha256_hex(&key).into());
    key
}

fn yaml<T: serde::Serialize>(v: &T) -> Value {
    serde_yaml_ng::to_value(v).unwrap_or(Value::Null)
}

/// `GET /admin/keys[?tenant=T]`.
pub(super) async fn list(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    uri: axum::http::Uri,
) -> Response {
    let who = admin;
    let tenant = uri.query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("tenant="))
            .map(str::to_owned)
    });
    let now = now_s();
    let data: Vec<Json> = app
        .config
        .get()
        .keys
        .iter()
        .filter(|k| who.sees(&k.tenant) && tenant.as_ref().is_none_or(|t| *t == k.tenant))
        .map(|k| view(k, now))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /admin/keys/{id}`.
pub(super) async fn get_one(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let k = visible(&app, &admin, &id)?;
    Ok(axum::Json(view(&k, now_s())).into_response())
}

/// `POST /admin/keys`: 201 with the key (shown once) and the config version that admits it.
pub(super) async fn create(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    body: Bytes,
) -> Result<Response, ApiError> {
    let who = admin;
    let req: CreateKey = json_body(if body.is_empty() { b"{}" } else { &body })?;
    let tenant = match (&who.tenant, req.tenant) {
        (Some(own), Some(t)) if *own != t => {
            return Err(forbidden(
                "tenant",
                format!("This admin key may create keys of tenant `{own}` only."),
            ));
        }
        (Some(own), _) => own.clone(),
        (None, Some(t)) => t,
        (None, None) => {
            return Err(ApiError::invalid(
                "`tenant` is required.",
                Some("tenant".into()),
            ));
        }
    };
    if req.admin && who.tenant.is_some() {
        return Err(forbidden(
            "admin",
            "A tenant admin key cannot create keys that read every tenant's usage.".into(),
        ));
    }
    if !valid_id(&tenant) {
        return Err(ApiError::invalid(
            format!("`tenant` `{tenant}` must be 1-64 of [A-Za-z0-9_-]."),
            Some("tenant".into()),
        ));
    }
    let id = req
        .id
        .unwrap_or_else(|| format!("key-{}", uuid::Uuid::now_v7().simple()));
    if !valid_id(&id) {
        return Err(ApiError::invalid(
            format!("`id` `{id}` must be 1-64 of [A-Za-z0-9_-]."),
            Some("id".into()),
        ));
    }
    if let Some(at) = req.expires_at
        && at <= now_s()
    {
        return Err(ApiError::invalid(
            "`expires_at` (Unix seconds) must be in the future.",
            Some("expires_at".into()),
        ));
    }
    let (key, written) = app
        .admin
        .edit(&app, |root| {
            let keys = keys_of(root)?;
            if keys
                .iter()
                .any(|k| k.get("id").and_then(Value::as_str) == Some(id.as_str()))
            {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "invalid_request_error",
                    "key_exists",
                    format!("An API key with id `{id}` exists."),
                )
                .with_param("id"));
            }
            let mut m = Mapping::new();
            m.insert("id".into(), id.clone().into());
            m.insert("tenant".into(), tenant.clone().into());
            let key = set_new_key(&mut m);
            if req.admin {
                m.insert("admin".into(), true.into());
            }
            if let Some(at) = req.expires_at {
                m.insert("expires_at".into(), at.into());
            }
            if let Some(l) = &req.limits {
                m.insert("limits".into(), yaml(l));
            }
            if let Some(b) = &req.budget {
                m.insert("budget".into(), yaml(b));
            }
            keys.push(Value::Mapping(m));
            Ok(key)
        })
        .await?;
    let k = KeyConfig {
        id,
        tenant,
        key_sha256: Some(sha256_hex(&key)),
        key: None,
        admin: req.admin,
        enabled: true,
        budget: req.budget.unwrap_or_default(),
        limits: req.limits.unwrap_or_default(),
        expires_at: req.expires_at,
    };
    let mut body = view(&k, now_s());
    body["key"] = json!(key);
    body["config_version"] = json!(written.version);
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

/// Applies `change` to key `id`'s stored entry and answers its new view.
async fn change(
    app: &AppState,
    admin: &AdminCaller,
    id: &str,
    change: impl Fn(&mut Mapping) -> Result<Option<String>, ApiError>,
) -> Result<Response, ApiError> {
    let who = admin;
    let (key, written) = app
        .admin
        .edit(app, |root| change(entry_of(root, who, id)?))
        .await?;
    let mut body = match visible(app, who, id) {
        Ok(k) => view(&k, now_s()),
        Err(_) => json!({"object": "api_key", "id": id}),
    };
    if let Some(key) = key {
        body["key"] = json!(key);
    }
    body["config_version"] = json!(written.version);
    Ok(axum::Json(body).into_response())
}

/// `POST /admin/keys/{id}/revoke`: `enabled: false` (401 on every replica within 1 s).
pub(super) async fn revoke(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    change(&app, &admin, &id, |m| {
        m.insert("enabled".into(), false.into());
        Ok(None)
    })
    .await
}

/// `POST /admin/keys/{id}/rotate`: a new key (shown once) replaces the old one at once.
pub(super) async fn rotate(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    change(&app, &admin, &id, |m| Ok(Some(set_new_key(m)))).await
}

/// Reads field `name`'s JSON value `v` as a `T`; an error names the field inside it
/// (`budget.daily_usd`).
fn nested<T: serde::de::DeserializeOwned>(name: &str, v: &Json) -> Result<T, ApiError> {
    json_body(v.to_string().as_bytes()).map_err(|e| ApiError {
        param: Some(format!(
            "{name}{}",
            e.param
                .as_deref()
                .map(|p| format!(".{p}"))
                .unwrap_or_default()
        )),
        ..e
    })
}

/// `PATCH /admin/keys/{id}` with any of `expires_at` (Unix seconds or null), `enabled`,
/// `budget`, `limits`.
pub(super) async fn update(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let fields: serde_json::Map<String, Json> = json_body(&body)?;
    let mut set: Vec<(&'static str, Option<Value>)> = Vec::new();
    for (name, v) in &fields {
        let bad =
            |what: &str| ApiError::invalid(format!("`{name}` must be {what}."), Some(name.clone()));
        match name.as_str() {
            "expires_at" => match v {
                Json::Null => set.push(("expires_at", None)),
                v => {
                    let at = v.as_u64().ok_or_else(|| bad("Unix seconds or null"))?;
                    set.push(("expires_at", Some(at.into())));
                }
            },
            "enabled" => set.push((
                "enabled",
                Some(v.as_bool().ok_or_else(|| bad("a boolean"))?.into()),
            )),
            "budget" => set.push(("budget", Some(yaml(&nested::<Budget>("budget", v)?)))),
            "limits" => set.push(("limits", Some(yaml(&nested::<RateLimits>("limits", v)?)))),
            _ => {
                return Err(ApiError::invalid(
                    format!("Unknown field `{name}` (expires_at, enabled, budget, limits)."),
                    Some(name.clone()),
                ));
            }
        }
    }
    change(&app, &admin, &id, |m| {
        for (name, v) in &set {
            match v {
                Some(v) => m.insert((*name).into(), v.clone()),
                None => m.remove(*name),
            };
        }
        Ok(None)
    })
    .await
}

/// `DELETE /admin/keys/{id}`: removes the entry.
pub(super) async fn delete(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let who = admin;
    let ((), written) = app
        .admin
        .edit(&app, |root| {
            entry_of(root, &who, &id)?;
            keys_of(root)?.retain(|k| k.get("id").and_then(Value::as_str) != Some(id.as_str()));
            Ok(())
        })
        .await?;
    Ok(
        axum::Json(json!({"object": "api_key", "id": id, "deleted": true,
        "config_version": written.version}))
        .into_response(),
    )
}

/// Tenant id → (key count, budget) over the config's tenants and keys.
pub(super) fn tenant_map(app: &AppState, who: &AdminCaller) -> BTreeMap<String, (usize, Budget)> {
    let config = app.config.get();
    let mut out: BTreeMap<String, (usize, Budget)> = BTreeMap::new();
    for t in &config.tenants {
        out.insert(t.id.clone(), (0, t.budget.clone()));
    }
    for k in &config.keys {
        out.entry(k.tenant.clone()).or_default().0 += 1;
    }
    out.retain(|t, _| who.sees(t));
    out
}

fn tenant_view(id: &str, keys: usize, budget: &Budget) -> Json {
    json!({"object": "tenant", "id": id, "keys": keys, "budget": budget})
}

/// `GET /admin/tenants`.
pub(super) async fn tenants(State(app): State<Arc<AppState>>, admin: AdminCaller) -> Response {
    let data: Vec<Json> = tenant_map(&app, &admin)
        .iter()
        .map(|(id, (n, b))| tenant_view(id, *n, b))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /admin/tenants/{id}`.
pub(super) async fn tenant(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let map = tenant_map(&app, &admin);
    let (n, b) = map
        .get(&id)
        .ok_or_else(|| not_found("id", format!("No tenant with id `{id}`.")))?;
    Ok(axum::Json(tenant_view(&id, *n, b)).into_response())
}
