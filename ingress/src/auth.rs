//! API key authentication: resolves the presented key to a [`Caller`] for the handler.
//!
//! With no `keys` configured every request is anonymous ([`Caller::default`]). Otherwise
//! `/v1/*` requires `Authorization: Bearer <key>` (OpenAI SDKs) or `x-api-key: <key>`
//! (Anthropic SDKs); a missing, unknown or disabled key gets 401 in the front door's error shape
//! (OpenAI: `invalid_request_error` / `invalid_api_key`; Anthropic: `authentication_error`).
//! Keys are matched by SHA-256, so the table never holds a usable key. An expired key
//! (`expires_at`) gets 401 too.
//!
//! Key changes across replicas (docs/security.md): an unknown key makes this replica confirm
//! with the config bucket that it holds the latest revision first (a key created through the
//! admin API on another replica works at once); a replica whose live config could not be
//! confirmed for `admin.stale_after_ms` refuses every key with 503 `config_unconfirmed`, and one
//! that saw a revision it could not apply refuses the keys that revision changes.

use crate::AppState;
use crate::context::Caller;
use crate::error::ApiError;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use switchyard_schemas::config::GatewayConfig;
use switchyard_schemas::tenancy::sha256_hex;

/// Key hash → caller, rebuilt when the config version changes.
#[derive(Debug, Default)]
pub struct KeyTable {
    built: Mutex<Option<(u64, Arc<Table>)>>,
}

#[derive(Debug, Default)]
struct Table {
    /// `None` = authentication off.
    by_hash: Option<HashMap<String, Entry>>,
}

#[derive(Debug)]
struct Entry {
    caller: Caller,
    enabled: bool,
    expires_at: Option<u64>,
}

/// Longest wait of an unknown key for the replica to confirm it holds the latest config.
const UNKNOWN_KEY_CONFIRM: std::time::Duration = std::time::Duration::from_millis(500);

impl Table {
    fn build(config: &GatewayConfig) -> Self {
        if config.keys.is_empty() {
            return Self { by_hash: None };
        }
        let by_hash = config
            .keys
            .iter()
            .filter_map(|k| {
                let caller = Caller {
                    tenant: Some(k.tenant.clone()),
                    key_id: Some(k.id.clone()),
                    admin: k.admin,
                };
                let entry = Entry {
                    caller,
                    enabled: k.enabled,
                    expires_at: k.expires_at,
                };
                k.sha256().map(|h| (h, entry))
            })
            .collect();
        Self {
            by_hash: Some(by_hash),
        }
    }
}

impl KeyTable {
    fn table(&self, app: &AppState) -> Arc<Table> {
        let version = app.config.version();
        let mut built = self.built.lock();
        if let Some((v, t)) = built.as_ref()
            && *v == version
        {
            return t.clone();
        }
        let t = Arc::new(Table::build(&app.config.get()));
        *built = Some((version, t.clone()));
        t
    }

    /// Resolves the key in `headers`: `Ok(anonymous)` when authentication is off.
    pub async fn resolve(&self, app: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let table = self.table(app);
        if table.by_hash.is_none() {
            return Ok(Caller::default());
        }
        let Some(key) = presented_key(headers) else {
            return Err(unauthorized(
                "You didn't provide an API key. Send it as `Authorization: Bearer <key>` \
                 (or `x-api-key: <key>`).",
            ));
        };
        let live = app.config.live();
        let stale_after = std::time::Duration::from_millis(app.config.get().admin.stale_after_ms);
        if live.is_stale(stale_after) {
            return Err(unconfirmed(
                "This replica could not confirm its API key list is current; retry shortly.",
            ));
        }
        let hash = sha256_hex(key);
        if live.is_unconfirmed(&hash) {
            return Err(unconfirmed(
                "This API key changed in a config revision this replica could not load yet.",
            ));
        }
        let mut table = table;
        let known = table
            .by_hash
            .as_ref()
            .is_some_and(|t| t.contains_key(&hash));
        if !known && live.is_watched() {
            // Maybe created a moment ago on another replica: confirm the latest config first.
            let asked = std::time::Instant::now();
            live.request_check();
            if live.wait_confirmed_after(asked, UNKNOWN_KEY_CONFIRM).await {
                table = self.table(app);
            }
        }
        let now_s = switchyard_schemas::now_ms() / 1000;
        match table.by_hash.as_ref().and_then(|t| t.get(&hash)) {
            Some(e) if !e.enabled => Err(unauthorized(format!(
                "The API key {} is disabled.",
                masked(key)
            ))),
            Some(e) if e.expires_at.is_some_and(|at| now_s >= at) => Err(unauthorized(format!(
                "The API key {} has expired.",
                masked(key)
            ))),
            Some(e) => Ok(e.caller.clone()),
            None => Err(unauthorized(format!(
                "Incorrect API key provided: {}.",
                masked(key)
            ))),
        }
    }
}

/// 503 `config_unconfirmed` with `Retry-After: 1`: the replica fails closed on a key it cannot
/// vouch for.
fn unconfirmed(message: &str) -> ApiError {
    ApiError::unavailable("config_unconfirmed", message)
}

/// The key from `Authorization: Bearer …` or `x-api-key`.
pub(crate) fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    bearer
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// `sk-a…wxyz`: enough to tell keys apart in an error, never enough to use.
pub(crate) fn masked(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    if chars.len() < 12 {
        return "***".into();
    }
    let head: String = chars[..4].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}…{tail}")
}

fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        "invalid_api_key",
        message,
    )
}

/// Whether requests to `path` are authenticated with a virtual key: `/v1/*`; `/healthz`,
/// `/readyz`, `/metrics` and unknown routes pass unauthenticated (the admin routes have their
/// own keys).
pub fn authenticates(path: &str) -> bool {
    path.starts_with("/v1/")
}

/// The refusal of an unauthenticated `/v1/*` request, in its front door's error shape.
pub fn refusal(path: &str, e: ApiError) -> Response {
    if path.starts_with("/v1/messages") {
        e.into_anthropic_response()
    } else {
        e.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_either_header_and_are_masked() {
        let mut h = HeaderMap::new();
        assert_eq!(presented_key(&h), None);
        h.insert(
            "x-api-key",
            "sk-ant-123456789"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(presented_key(&h), Some("sk-ant-123456789"));
        h.insert(
            "authorization",
            "Bearer sk-sy-abcdefgh1234"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(presented_key(&h), Some("sk-sy-abcdefgh1234"));
        assert_eq!(masked("sk-sy-abcdefgh1234"), "sk-s…1234");
        assert_eq!(masked("short"), "***");
    }
}
