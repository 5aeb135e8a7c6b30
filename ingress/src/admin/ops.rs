//! `/admin/config` (show redacted, validate, apply), `/admin/health`, `/admin/cache/purge` and
//! `/admin/usage`.

use super::{AdminCaller, json_body, unavailable};
use crate::AppState;
use crate::context::Caller;
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use switchyard_schemas::cache::{PurgeReply, PurgeRequest, purge_subject};
use switchyard_schemas::config_text::redact_text;

/// How long a cache purge waits for the cache service.
const PURGE_TIMEOUT: Duration = Duration::from_secs(5);

/// The body as YAML text (JSON is YAML too), 400 when it is not UTF-8 or empty.
fn text_body(body: &[u8]) -> Result<&str, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::invalid("The config must be UTF-8 YAML or JSON.", None))?;
    if text.trim().is_empty() {
        return Err(ApiError::invalid(
            "Send the config (YAML or JSON) as the request body.",
            None,
        ));
    }
    Ok(text)
}

/// `GET /admin/config`: the live config text with every literal credential redacted.
pub(super) async fn config_show(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
) -> Result<Response, ApiError> {
    admin.require_global()?;
    let (version, text) = app.admin.current(&app).await?;
    Ok(axum::Json(json!({
        "object": "config",
        "version": version,
        "applied_version": app.config.version(),
        "yaml": redact_text(&text),
    }))
    .into_response())
}

/// `POST /admin/config/validate`: 200 `{valid: true, warnings}` or 400 naming the field.
pub(super) async fn config_validate(admin: AdminCaller, body: Bytes) -> Result<Response, ApiError> {
    admin.require_global()?;
    let p = super::store::prepare(text_body(&body)?)?;
    Ok(
        axum::Json(json!({"object": "config.validation", "valid": true,
        "warnings": p.warnings}))
        .into_response(),
    )
}

/// `PUT /admin/config`: validates and stores the body as the live config (as `config push`).
pub(super) async fn config_apply(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    body: Bytes,
) -> Result<Response, ApiError> {
    admin.require_global()?;
    let w = app.admin.put(&app, text_body(&body)?).await?;
    Ok(axum::Json(json!({"object": "config", "version": w.version,
        "warnings": w.warnings}))
    .into_response())
}

/// `GET /admin/health`: every target's health as this replica sees it (worker reports on
/// `<prefix>.health.>` plus passive failures), with its in-flight count and TTFT average.
pub(super) async fn health(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
) -> Result<Response, ApiError> {
    admin.require_global()?;
    let config = app.config.get();
    let data: Vec<serde_json::Value> = config
        .targets
        .iter()
        .map(|t| {
            json!({
                "object": "target.health",
                "target": t.id,
                "provider": t.provider.as_str(),
                "enabled": t.enabled,
                "state": app.health.state(&t.id).as_str(),
                "in_flight": app.stats.in_flight(&t.id),
                "ttft_ms": app.stats.ttft_ms(&t.id),
            })
        })
        .collect();
    Ok(axum::Json(json!({"object": "list", "data": data})).into_response())
}

/// `POST /admin/cache/purge` with a [`PurgeRequest`] (`all`, `route`, `model`, `key_prefix`):
/// asks the cache service over `<prefix>.cache.purge`, as `switchyard cache purge` does.
pub(super) async fn cache_purge(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    body: Bytes,
) -> Result<Response, ApiError> {
    admin.require_global()?;
    let req: PurgeRequest = json_body(&body)?;
    if !req.is_valid() {
        return Err(ApiError::invalid(
            "Name what to purge: `all: true`, `route`, `model` or `key_prefix`.",
            None,
        ));
    }
    let payload =
        serde_json::to_vec(&req).map_err(|e| ApiError::encoding("the purge request", &e))?;
    let asked = app
        .admin
        .writer(&app)
        .request(purge_subject(&app.subjects), payload.into());
    let msg = match tokio::time::timeout(PURGE_TIMEOUT, asked).await {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => {
            return Err(unavailable(format!(
                "The cache service did not answer: {e}"
            )));
        }
        Err(_) => return Err(unavailable("The cache service did not answer in time.")),
    };
    let reply: PurgeReply = serde_json::from_slice(&msg.payload)
        .map_err(|e| unavailable(format!("The cache service answered garbage: {e}")))?;
    if let Some(e) = reply.error {
        return Err(unavailable(format!("The cache purge failed: {e}")));
    }
    Ok(axum::Json(json!({"object": "cache.purge", "deleted": reply.deleted})).into_response())
}

/// `GET /admin/usage?…`: the usage API (`GET /v1/usage`'s parameters and answer) for every
/// tenant, or the admin key's own tenant only.
pub(super) async fn usage(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    uri: axum::http::Uri,
) -> Response {
    let who = admin;
    let as_caller = match &who.tenant {
        None => Caller {
            admin: true,
            ..Default::default()
        },
        Some(t) => Caller {
            tenant: Some(t.clone()),
            key_id: Some(format!("admin:{}", who.id)),
            ..Default::default()
        },
    };
    crate::usage_api::handle(&app, &as_caller, uri.query().unwrap_or("")).await
}
