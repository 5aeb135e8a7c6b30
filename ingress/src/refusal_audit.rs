//! The audit record of a request to a `/v1` model endpoint refused **before admission**
//! (docs/audit.md, "Refused requests"): a malformed body (400), an unknown model (404), a missing
//! or invalid key (401), a limit or budget refusal (429), an oversized body (413), …
//!
//! An admitted request's record rides in its `charge` event ([`crate::charge`]); a refused one
//! has none (it leaves no usage record, docs/budgets.md), so [`record`] publishes a small
//! [`UsageKind::Audit`] event (`<prefix>.usage.audit`) that billing stores in `audit_log` only.
//! It goes through the batching usage publisher in a tracked task after the response is made,
//! never on the client's latency path, and is capped ([`Limiter`]): at most
//! `audit.refused_per_second` records a second (default 1,000) and [`MAX_IN_FLIGHT`] awaiting
//! storage per ingress;
//! beyond either the record is dropped and counted in [`crate::metrics::AUDIT_DROPPED`], so a
//! flood of bad requests can neither grow the usage stream (or the spool) without bound nor
//! crowd out the charge events of other clients.

use crate::AppState;
use crate::context::RequestContext;
use axum::response::Response;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use switchyard_schemas::audit::AuditInfo;
use switchyard_schemas::usage::UsageStatus;
use switchyard_schemas::{ErrorClass, UsageEvent, UsageKind, now_ms};

/// Most refusal records one ingress holds awaiting storage (queued in the usage publisher or
/// being spooled); more are dropped and counted.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Largest error body read for its `code`, bytes (gateway error bodies are far smaller).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The caps of [`record`] (module docs).
#[derive(Debug, Default)]
pub struct Limiter {
    /// (second since the Unix epoch, records in it).
    window: Mutex<(u64, u32)>,
    in_flight: AtomicUsize,
}

impl Limiter {
    /// Takes room for one record, at most `per_second` a second; false when over a cap.
    fn take(&self, per_second: u32) -> bool {
        self.take_at(now_ms() / 1000, per_second)
    }

    /// [`Self::take`] in `second` (since the Unix epoch).
    fn take_at(&self, second: u64, per_second: u32) -> bool {
        {
            let mut w = self.window.lock();
            if w.0 != second {
                *w = (second, 0);
            }
            if w.1 >= per_second {
                return false;
            }
            w.1 += 1;
        }
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The front door of a `/v1` model endpoint path (`None`: not one).
pub fn front_door(path: &str) -> Option<&'static str> {
    match path {
        "/v1/chat/completions" | "/v1/completions" => Some("openai"),
        "/v1/messages" | "/v1/messages/count_tokens" => Some("anthropic"),
        "/v1/responses" => Some("responses"),
        "/v1/embeddings" => Some("embeddings"),
        _ => None,
    }
}

/// The error class of a refusal: its `code` when it names one, else its HTTP status.
fn class_of(status: u16, code: Option<&str>) -> ErrorClass {
    match (status, code) {
        (_, Some("context_length_exceeded")) => ErrorClass::ContextLengthExceeded,
        (401, _) => ErrorClass::Auth,
        (403, _) => ErrorClass::Permission,
        (404, _) => ErrorClass::NotFound,
        (429, _) => ErrorClass::RateLimited,
        (503, _) => ErrorClass::NoCapacity,
        (500..=599, _) => ErrorClass::Internal,
        _ => ErrorClass::InvalidRequest,
    }
}

/// The error's `code` (OpenAI shape `{"error":{"code"}}`, else `error.type`, Anthropic's).
fn code_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error")?;
    e.get("code")
        .and_then(|c| c.as_str())
        .or_else(|| e.get("type").and_then(|t| t.as_str()))
        .map(|c| switchyard_schemas::audit::clip(c, 64))
}

/// Called by the gate ([`crate::gate`]) with the answer `resp` of a request to the `/v1` model
/// endpoint `door` ([`front_door`]) that arrived at `started`: a response of status 400 or more
/// for a request that was never admitted publishes its audit record (module docs). The record's
/// request id is the gateway's id of the request, the response's `x-switchyard-request-id`.
pub async fn record(
    app: &Arc<AppState>,
    ctx: &RequestContext,
    door: &'static str,
    started: Instant,
    resp: Response,
) -> Response {
    let seen = ctx.take_seen();
    let status = resp.status().as_u16();
    if status < 400 || seen.admitted {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    // A refusal's body is a small JSON value already in memory; any other is passed on as it is.
    use axum::body::HttpBody as _;
    let known_small = body
        .size_hint()
        .upper()
        .is_some_and(|n| n <= MAX_ERROR_BODY as u64);
    let (body, code) = if known_small {
        match axum::body::to_bytes(body, MAX_ERROR_BODY).await {
            Ok(bytes) => {
                let code = code_of(&bytes);
                (axum::body::Body::from(bytes), code)
            }
            Err(_) => (axum::body::Body::empty(), None),
        }
    } else {
        (body, None)
    };
    // The gateway's id of this HTTP request (the gate adds it to the response as
    // `x-switchyard-request-id`); the client's own `X-Request-Id` is `client_request_id`.
    let request_id = ctx.gateway_id;
    let resp = Response::from_parts(parts, body);
    let per_second = app.config.get().audit.refused_per_second;
    if !app.refusals.take(per_second) {
        app.metrics.audit_dropped();
        return resp;
    }
    let client = &ctx.client;
    let caller = ctx.caller.clone();
    let event = UsageEvent {
        tenant: caller.tenant,
        key_id: caller.key_id,
        status: UsageStatus::Error,
        error_class: Some(class_of(status, code.as_deref())),
        latency_ms: started.elapsed().as_millis() as u64,
        audit: Some(Box::new(AuditInfo {
            front_door: Some(door.to_owned()),
            http_status: Some(status),
            error_code: code,
            client_ip: client.client_ip.clone(),
            user_agent: client.user_agent.clone(),
            client_request_id: client.request_id.clone(),
            ..AuditInfo::default()
        })),
        ..UsageEvent::new(
            request_id,
            UsageKind::Audit,
            now_ms(),
            seen.model.unwrap_or_default(),
        )
    };
    let app2 = app.clone();
    // Tracked: shutdown waits for the acknowledged publish (or the spool).
    app.tasks.spawn(async move {
        app2.usage.publish(event).await;
        app2.refusals.release();
    });
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn classes_and_codes_of_refusals() {
        let openai = br#"{"error":{"message":"m","type":"invalid_request_error","param":"model","code":"model_not_found"}}"#;
        assert_eq!(code_of(openai).as_deref(), Some("model_not_found"));
        let anthropic =
            br#"{"type":"error","error":{"type":"authentication_error","message":"m"}}"#;
        assert_eq!(code_of(anthropic).as_deref(), Some("authentication_error"));
        assert_eq!(code_of(b"not json"), None);
        assert_eq!(class_of(404, Some("model_not_found")), ErrorClass::NotFound);
        assert_eq!(class_of(401, None), ErrorClass::Auth);
        assert_eq!(
            class_of(429, Some("rate_limit_exceeded")),
            ErrorClass::RateLimited
        );
        assert_eq!(class_of(413, None), ErrorClass::InvalidRequest);
        assert_eq!(
            class_of(400, Some("context_length_exceeded")),
            ErrorClass::ContextLengthExceeded
        );
        assert_eq!(front_door("/v1/models"), None);
        assert_eq!(front_door("/v1/messages/count_tokens"), Some("anthropic"));
    }

    #[test]
    fn limiter_caps_records_per_second_and_in_flight() {
        let l = Limiter::default();
        let per_second = (0..1010).filter(|_| l.take_at(7, 1000)).count();
        assert_eq!(per_second, 1000);
        // A new second has room again, up to the records still in flight.
        let more = (0..1000).filter(|_| l.take_at(8, 1000)).count();
        assert_eq!(more, MAX_IN_FLIGHT - 1000);
        l.release();
        assert!(l.take_at(9, 1000));
        assert!(!l.take_at(9, 1000));
        assert!(!Limiter::default().take_at(1, 0), "0 records none");
    }
}
