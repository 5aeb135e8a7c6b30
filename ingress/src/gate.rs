//! The gate: the one middleware every HTTP request passes (wrapped around the whole router in
//! [`crate::router`]). It authenticates `/v1/*` ([`crate::auth`]), builds the request's
//! [`RequestContext`] (caller, routing hints, client info, gateway id, server span, overhead
//! clock) and hands it to the handler in the request's extensions; on the way out it writes the
//! refusal audit record of a request refused before admission ([`crate::refusal_audit`]), adds
//! `x-request-id` and `x-switchyard-request-id` to every response, errors before admission
//! included, and sets the span's HTTP status.

use crate::AppState;
use crate::context::{Caller, ClientInfo, RequestContext, RequestHints};
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

/// Response header: the gateway's own request id (UUIDv7), the ledger and audit key; it differs
/// from `x-request-id` when the client sent its own (docs/tracing.md).
pub const HEADER_GATEWAY_REQUEST_ID: &str = "x-switchyard-request-id";

/// Middleware (module docs).
pub async fn gate(State(app): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let path = req.uri().path();
    let route = crate::metrics::route_of(path);
    let door = crate::refusal_audit::front_door(path);
    let authenticates = crate::auth::authenticates(path);
    let client = ClientInfo::of(&req);
    let gateway_id = Uuid::now_v7();
    let shown = client
        .request_id
        .clone()
        .unwrap_or_else(|| gateway_id.to_string());
    let gateway = gateway_id.to_string();
    let span = crate::spans::request(&req, &shown, &gateway);
    let handled = async {
        let hints = RequestHints::from_headers(req.headers());
        let (caller, refused) = if authenticates {
            match app.keys.resolve(&app, req.headers()).await {
                Ok(c) => (c, None),
                Err(e) => (Caller::default(), Some(e)),
            }
        } else {
            (Caller::default(), None)
        };
        let ctx = Arc::new(
            RequestContext::new(caller, hints, client, route).for_http(gateway_id, span.clone()),
        );
        if let Some(e) = refused {
            return (crate::auth::refusal(req.uri().path(), e), ctx);
        }
        req.extensions_mut().insert(ctx.clone());
        (next.run(req).await, ctx)
    }
    .instrument(span.clone());
    let (mut resp, ctx) = handled.await;
    if let Some(door) = door {
        resp = crate::refusal_audit::record(&app, &ctx, door, started, resp).await;
    }
    let h = resp.headers_mut();
    for (name, value) in [
        ("x-request-id", &shown),
        (HEADER_GATEWAY_REQUEST_ID, &gateway),
    ] {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    }
    if !span.is_none() {
        use switchyard_schemas::trace::OpenTelemetrySpanExt;
        span.set_attribute(
            "http.response.status_code",
            i64::from(resp.status().as_u16()),
        );
    }
    resp
}
