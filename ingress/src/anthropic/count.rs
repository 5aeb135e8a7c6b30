//! `POST /v1/messages/count_tokens` (Anthropic API reference, "Count Message tokens"):
//! `{"input_tokens": N}` for a Messages body without `max_tokens`.
//!
//! The body is parsed by the Messages door (same fields, same errors, `anthropic-beta` carried)
//! and the model routed as a chat request would be. When the first planned target's provider
//! has a count endpoint ([`ProviderKind::counts_tokens`], Anthropic), a worker asks it (one NATS
//! request/reply on `<prefix>.req.count.<provider>`) and the answer is exact
//! (`x-switchyard-token-count: exact`). Otherwise — or when no worker or upstream could answer
//! (no capacity, timeout, network, 5xx, overload) — N is the local o200k estimate of
//! [`switchyard_schemas::tokens`] and the header says `estimate`. An upstream 401/403 is the
//! caller's answer (401 `authentication_error` / 403 `permission_error`, Anthropic's envelope),
//! as other gateways forward a count to the provider with the caller's access. Counting spends
//! nothing: no budget reservation, no usage record, no rate-limit token.
//!
//! [`ProviderKind::counts_tokens`]: switchyard_schemas::config::ProviderKind::counts_tokens

use crate::AppState;
use crate::anthropic::{beta_header, request};
use crate::error::ApiError;
use crate::route;
use crate::strategy::{self, Needs};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use switchyard_schemas::count::CountReply;
use switchyard_schemas::request::TargetRef;
use switchyard_schemas::subjects::CAP_COUNT;
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, now_ms};

/// Response header saying whether `input_tokens` is the provider's count or a local estimate.
pub const COUNT_HEADER: &str = "x-switchyard-token-count";

/// The handler.
pub async fn count_tokens(
    State(app): State<Arc<AppState>>,
    ctx: crate::context::Ctx,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match handle(&app, &ctx, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.into_anthropic_response(),
    }
}

async fn handle(
    app: &Arc<AppState>,
    ctx: &crate::context::RequestContext,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    route::check_size(app, body.len())?;
    // The Messages parser, which requires `max_tokens`: count_tokens takes none.
    let mut v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    })?;
    if let Some(o) = v.as_object_mut() {
        if o.contains_key("max_tokens") {
            return Err(ApiError::invalid(
                "max_tokens: Extra inputs are not permitted",
                Some("max_tokens".into()),
            ));
        }
        o.insert("max_tokens".into(), json!(1));
    }
    let inbound = request::parse_with(v.to_string().as_bytes(), beta_header(headers).as_deref())?;
    let config = app.config.get();
    let hints = &ctx.hints;
    let model = route::routed_model(&config, &inbound.model, hints)?;
    let needs = Needs::chat(&inbound.messages, &inbound.tools, &inbound.params);
    let prefs = hints.preferences(inbound.params.user.as_deref());
    let plan = strategy::plan(
        &config,
        model,
        &needs,
        &prefs,
        |t| route::observe(app, t),
        &mut rand::rng(),
    )
    .map_err(ApiError::from)?;
    let target = plan.targets[0];
    if target.provider.counts_tokens() {
        let caller = ctx.caller.clone();
        let first_byte = Duration::from_millis(config.timeouts.first_byte_ms);
        let req = ChatRequest {
            prompt_tokens: None,
            id: uuid::Uuid::now_v7(),
            tenant: caller.tenant,
            key_id: caller.key_id,
            model: model.id.clone(),
            target: TargetRef {
                id: target.id.clone(),
                provider: target.provider.as_str().to_owned(),
                upstream_model: target.upstream_model.clone(),
            },
            messages: inbound.messages.clone(),
            tools: inbound.tools.clone(),
            tool_choice: inbound.tool_choice.clone(),
            params: inbound.params.clone(),
            stream: false,
            include_usage: false,
            deadline_ms: now_ms() + first_byte.as_millis() as u64,
            attempt: 0,
            passthrough: inbound.passthrough.clone(),
            batch_id: None,
        };
        match ask(app, &req, first_byte).await {
            Ok(n) => return Ok(answer(n, "exact", &target.id)),
            Err(e) => match e.class {
                ErrorClass::NoCapacity
                | ErrorClass::Timeout
                | ErrorClass::Network
                | ErrorClass::Upstream5xx
                | ErrorClass::Overloaded => {
                    tracing::info!(target = %target.id, error = %e, "count_tokens: upstream count unavailable, answering the local estimate");
                }
                ErrorClass::Auth => return Err(status_error(StatusCode::UNAUTHORIZED, e)),
                ErrorClass::Permission => return Err(status_error(StatusCode::FORBIDDEN, e)),
                _ => return Err(e.into()),
            },
        }
    }
    let n = switchyard_schemas::tokens::estimate(&inbound.messages, &inbound.tools)
        .await
        .total();
    Ok(answer(n, "estimate", &target.id))
}

/// `{"input_tokens": n}` with the count header and the target that counted.
fn answer(n: u64, kind: &'static str, target: &str) -> Response {
    let mut resp = axum::Json(json!({"input_tokens": n})).into_response();
    let h = resp.headers_mut();
    h.insert(COUNT_HEADER, HeaderValue::from_static(kind));
    if let Ok(v) = HeaderValue::from_str(target) {
        h.insert("x-switchyard-target", v);
    }
    resp
}

/// The upstream's 401/403 as the caller's, with its message (the Anthropic `type` follows the
/// status: `authentication_error`, `permission_error`).
fn status_error(status: StatusCode, e: ErrorInfo) -> ApiError {
    let mut err = ApiError::from(e);
    err.status = status;
    err.kind = "invalid_request_error";
    err.code = None;
    err
}

/// One count request/reply with a worker.
async fn ask(app: &AppState, req: &ChatRequest, limit: Duration) -> Result<u64, ErrorInfo> {
    let payload =
        serde_json::to_vec(req).map_err(|e| ErrorInfo::new(ErrorClass::Internal, e.to_string()))?;
    let subject = app.subjects.request(CAP_COUNT, &req.target.provider);
    let request = async_nats::Request::new()
        .payload(payload.into())
        .timeout(Some(limit));
    let msg = app.nats.send_request(subject, request).await.map_err(|e| {
        use async_nats::RequestErrorKind::*;
        match e.kind() {
            NoResponders => {
                ErrorInfo::new(ErrorClass::NoCapacity, "no worker is serving this provider")
            }
            TimedOut => ErrorInfo::new(ErrorClass::Timeout, "timed out waiting for the count"),
            _ => ErrorInfo::new(ErrorClass::NoCapacity, format!("NATS request failed: {e}")),
        }
    })?;
    match serde_json::from_slice::<CountReply>(&msg.payload) {
        Ok(CountReply::Ok { input_tokens, .. }) => Ok(input_tokens),
        Ok(CountReply::Error { error }) => Err(error),
        Err(e) => Err(ErrorInfo::new(
            ErrorClass::Internal,
            format!("bad count reply: {e}"),
        )),
    }
}
