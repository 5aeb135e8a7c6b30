//! API key authentication: resolves the presented key to a [`Caller`] for the handler.
//!
//! With no `keys` configured every request is anonymous ([`Caller::default`]). Otherwise
//! `/v1/*` requires `Authorization: Bearer <key>` (OpenAI SDKs) or `x-api-key: <key>`
//! (Anthropic SDKs); a missing, unknown or disabled key gets 401 in the front door's error shape
//! (OpenAI: `invalid_request_error` / `invalid_api_key`; Anthropic: `authentication_error`).
//! Keys are matched by SHA-256, so the table never holds a usable key.

use crate::AppState;
use crate::charge::Caller;
use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use switchyard_schemas::config::GatewayConfig;
use switchyard_schemas::tenancy::sha256_hex;

tokio::task_local! {
    static CALLER: Caller;
}

/// The caller of the request being handled (anonymous outside [`authenticate`]).
pub fn current_caller() -> Caller {
    CALLER.try_with(Clone::clone).unwrap_or_default()
}

/// Runs `fut` as `caller` (how a batch item runs as the key that created its batch).
pub async fn as_caller<F: std::future::Future>(caller: Caller, fut: F) -> F::Output {
    CALLER.scope(caller, fut).await
}

/// Key hash → caller, rebuilt when the config version changes.
#[derive(Debug, Default)]
pub struct KeyTable {
    built: Mutex<Option<(u64, Arc<Table>)>>,
}

#[derive(Debug, Default)]
struct Table {
    /// `None` = authentication off.
    by_hash: Option<HashMap<String, (Caller, bool)>>,
}

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
                k.sha256().map(|h| (h, (caller, k.enabled)))
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
    pub fn resolve(&self, app: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let table = self.table(app);
        let Some(by_hash) = &table.by_hash else {
            return Ok(Caller::default());
        };
        let Some(key) = presented_key(headers) else {
            return Err(unauthorized(
                "You didn't provide an API key. Send it as `Authorization: Bearer <key>` \
                 (or `x-api-key: <key>`).",
            ));
        };
        match by_hash.get(&sha256_hex(key)) {
            Some((caller, true)) => Ok(caller.clone()),
            Some((_, false)) => Err(unauthorized(format!(
                "The API key {} is disabled.",
                masked(key)
            ))),
            None => Err(unauthorized(format!(
                "Incorrect API key provided: {}.",
                masked(key)
            ))),
        }
    }
}

/// The key from `Authorization: Bearer …` or `x-api-key`.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
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
fn masked(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    if chars.len() < 12 {
        return "***".into();
    }
    let head: String = chars[..4].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}…{tail}")
}

fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: message.into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("invalid_api_key"),
        retry_after_s: None,
        request_id: None,
    }
}

/// Middleware: authenticates `/v1/*` and makes the caller available to handlers through
/// [`current_caller`]. `/healthz`, `/readyz`, `/metrics` and unknown routes pass unauthenticated.
pub async fn authenticate(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with("/v1/") {
        return next.run(req).await;
    }
    match app.keys.resolve(&app, req.headers()) {
        Ok(caller) => CALLER.scope(caller, next.run(req)).await,
        Err(e) if req.uri().path().starts_with("/v1/messages") => e.into_anthropic_response(),
        Err(e) => e.into_response(),
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
