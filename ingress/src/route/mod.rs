//! Front-door-neutral routing, in stages a reader follows top to bottom in [`route_with`]:
//!
//! 1. **admit** ([`admit::admit`], `admit.rs`): the routed model, the cost-priority downgrade and
//!    the budget reservation → an [`Admitted`] request with its [`Ledger`] (charge event +
//!    metrics outcome); a refusal here is counted in the metrics but leaves no usage record.
//! 2. **plan** ([`plan::plan`], `plan.rs`): needs, prompt estimate, [`crate::strategy::plan`],
//!    the degraded-target probe → a [`Planned`] list of candidates in order.
//! 3. **attempts** ([`attempt::attempts`], `attempt.rs`): the one attempt engine — per candidate
//!    record the attempt, dispatch, and decide fallback and passive health by
//!    [`switchyard_schemas::ErrorInfo::disposition`] ([`attempt::judge`]). Chat plugs in a
//!    frame-stream dispatch (trim, publish, read until commit); embeddings
//!    ([`crate::embeddings`]) a request/reply one.
//! 4. **feed** ([`FrameFeed`], `feed.rs`): the committed attempt's frames for the front door's
//!    encoder; it settles the charge and the metrics when the terminal frame passes.
//!
//! Fallback rule: a streaming request moves to the next target only before its first content
//! frame; the HTTP headers are held until then. After content went out, a failure becomes an
//! in-stream error event — never a silent end, never a second answer. A non-streaming request can
//! fall back at any point before its answer is complete, since the client has seen nothing.
//!
//! Client headers (all optional; target lists are comma-separated target ids):
//!
//! | header | effect |
//! |---|---|
//! | `x-switchyard-route` | route by this model id or route tag instead of the body's `model` (the response still echoes the body's `model`) |
//! | `x-switchyard-only` | consider only these targets |
//! | `x-switchyard-ignore` | never use these targets |
//! | `x-switchyard-order` | try these targets first, in this order (the rest follow in the policy's order) |
//! | `x-switchyard-user` | the user id the canary split hashes (default: the body's `user`) |
//!
//! The gate ([`crate::gate`]) reads these headers into the request's
//! [`RequestContext::hints`], which every stage gets as an argument.
//!
//! Timeouts per attempt ([`RequestTimeouts`], `timeouts.rs`): no frame at all within
//! `timeouts.first_frame_ms` (no worker picked the request up) and no frame or heartbeat within
//! `timeouts.worker_silence_ms` (the worker is gone) move on to the next target. The model's
//! policy can add: `timeouts.first_byte_ms` — no content from the target within this since
//! dispatch → next target; `timeouts.idle_ms` — no content for this long (heartbeats do not
//! count) → next target, or an error event once content went out; `timeouts.total_ms` (default
//! the global `timeouts.total_ms`) — the whole request, admission to last frame: a 504 (or an
//! error event) and the deadline workers are given.
//!
//! Response headers: `x-request-id` (the request id, [`crate::gate`]), `x-switchyard-request-id`,
//! `x-switchyard-target`, `x-switchyard-worker`,
//! `x-switchyard-fallbacks`, `x-switchyard-trimmed` (messages dropped by `trim_context`),
//! `x-switchyard-overhead-ms` ([`crate::metrics::HEADER_OVERHEAD`]), the
//! serving upstream's rate-limit headers renamed `x-upstream-ratelimit-…` /
//! `x-upstream-anthropic-ratelimit-…`, and the caller's own `x-ratelimit-*`
//! ([`crate::rate_limit`]).

pub mod admit;
pub mod attempt;
mod feed;
pub mod plan;
mod timeouts;

pub use admit::{Admitted, Ledger};
pub use feed::{Aggregate, FrameFeed, ToolCallAcc};
pub use plan::Planned;
pub use timeouts::RequestTimeouts;

use crate::AppState;
use crate::context::RequestContext;
pub use crate::context::RequestHints;
use crate::error::ApiError;
use crate::strategy::{self, Observed, Preferences};
use axum::http::HeaderValue;
use axum::response::Response;
use std::sync::Arc;
use switchyard_schemas::FrameBody;
use switchyard_schemas::config::{GatewayConfig, ModelConfig, TargetConfig};
use switchyard_schemas::request::{Message, SamplingParams, Tool};
use uuid::Uuid;

pub use crate::context::{HEADER_IGNORE, HEADER_ONLY, HEADER_ORDER, HEADER_ROUTE, HEADER_USER};
/// Response header: the model asked for, when a budget's `downgrade_at` served a cheaper one.
pub const HEADER_DOWNGRADED: &str = "x-switchyard-downgraded-from";
/// Response header: messages dropped by context trimming.
pub const HEADER_TRIMMED: &str = "x-switchyard-trimmed";

impl RequestHints {
    /// The preferences for [`strategy::plan`]; `body_user` is the request body's `user`.
    pub fn preferences(&self, body_user: Option<&str>) -> Preferences {
        Preferences {
            only: self.only.clone(),
            ignore: self.ignore.clone(),
            order: self.order.clone(),
            user: self.user.clone().or_else(|| body_user.map(str::to_owned)),
        }
    }
}

/// The model to route by: `x-switchyard-route` when given, else the body's `model`.
pub fn routed_model<'a>(
    config: &'a GatewayConfig,
    body_model: &str,
    hints: &RequestHints,
) -> Result<&'a ModelConfig, ApiError> {
    let id = hints.route.as_deref().unwrap_or(body_model);
    config.model(id).ok_or_else(|| {
        let mut e = ApiError::model_not_found(id);
        if hints.route.is_some() {
            e.param = Some(HEADER_ROUTE.into());
        }
        e
    })
}

/// What this ingress knows about `target` now.
pub fn observe(app: &AppState, target: &TargetConfig) -> Observed {
    Observed {
        health: app.health.state(&target.id),
        ttft_ms: app.stats.ttft_ms(&target.id),
        in_flight: app.stats.in_flight(&target.id),
        cost: app
            .catalog()
            .as_deref()
            .and_then(|c| strategy::cost_per_million(c, &target.upstream_model)),
        capabilities: app.capabilities.get(target.provider),
    }
}

/// Room left in a NATS message for the normalised request's own fields, bytes.
const ENVELOPE_BYTES: usize = 4096;

/// 413 when a body could not fit in one NATS message (the server's `max_payload`).
pub fn check_size(app: &AppState, body_len: usize) -> Result<(), ApiError> {
    let max = app.nats.server_info().max_payload;
    if body_len + ENVELOPE_BYTES <= max {
        return Ok(());
    }
    Err(ApiError::new(
        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "request_too_large",
        format!(
            "Request body of {body_len} bytes exceeds this gateway's limit of {} bytes.",
            max.saturating_sub(ENVELOPE_BYTES)
        ),
    ))
}

/// What a front door parsed, before routing.
#[derive(Debug)]
pub struct Inbound {
    /// Standard model id or route tag.
    pub model: String,
    /// Conversation.
    pub messages: Vec<Message>,
    /// Tools.
    pub tools: Vec<Tool>,
    /// OpenAI-shaped `tool_choice`.
    pub tool_choice: Option<serde_json::Value>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// SSE requested.
    pub stream: bool,
    /// Final usage chunk requested (OpenAI front door).
    pub include_usage: bool,
    /// Provider-specific fields for one provider family ([`ChatRequest::passthrough`]).
    ///
    /// [`ChatRequest::passthrough`]: switchyard_schemas::ChatRequest::passthrough
    pub passthrough: std::collections::BTreeMap<String, switchyard_schemas::request::Passthrough>,
}

/// Headers naming who served, added to every routed response.
#[derive(Debug, Clone)]
pub struct Served {
    /// Request id.
    pub request_id: Uuid,
    /// Target that served.
    pub target: String,
    /// Worker process that served.
    pub worker: String,
    /// Failed attempts before it.
    pub fallbacks: u32,
    /// Messages dropped to fit the target's context window (`trim_context`), if any.
    pub trimmed: Option<usize>,
    /// The model the client asked for, when cost-priority routing served a cheaper one.
    pub downgraded_from: Option<String>,
    /// The serving upstream's rate-limit headers ([`FrameBody::UpstreamHeaders`]), forwarded
    /// under [`switchyard_schemas::frame::upstream_header_name`].
    ///
    /// [`FrameBody::UpstreamHeaders`]: switchyard_schemas::FrameBody::UpstreamHeaders
    pub upstream_headers: Vec<(String, String)>,
}

impl Served {
    /// Adds `x-request-id`, `x-switchyard-target`, `x-switchyard-worker`, `x-switchyard-fallbacks`,
    /// after trimming `x-switchyard-trimmed`, and the upstream's rate-limit headers under
    /// `x-upstream-` (never as the gateway's own `x-ratelimit-*`).
    pub fn apply(&self, resp: &mut Response) {
        let h = resp.headers_mut();
        let mut put = |k: &'static str, v: &str| {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.insert(k, v);
            }
        };
        put("x-request-id", &self.request_id.to_string());
        put("x-switchyard-target", &self.target);
        put("x-switchyard-worker", &self.worker);
        put("x-switchyard-fallbacks", &self.fallbacks.to_string());
        if let Some(n) = self.trimmed {
            put(HEADER_TRIMMED, &n.to_string());
        }
        if let Some(m) = &self.downgraded_from {
            put(HEADER_DOWNGRADED, m);
        }
        for (name, value) in &self.upstream_headers {
            let name = switchyard_schemas::frame::upstream_header_name(name);
            if let (Ok(k), Ok(v)) = (
                axum::http::HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                h.insert(k, v);
            }
        }
    }
}

/// Routes `inbound` of the request `ctx`: admit → plan → attempts → the committed feed. `cache`
/// is its cache outcome for the audit record ([`crate::cache_client::Check::audit_outcome`]).
/// Every error after admission is already recorded in the charge event and the metrics.
pub async fn route(
    app: &Arc<AppState>,
    ctx: &RequestContext,
    inbound: Inbound,
    cache: &'static str,
) -> Result<FrameFeed, ApiError> {
    use tracing::Instrument;
    let config = app.config.get();
    let mut admitted = admit::admit(app, ctx, &config, inbound)
        .instrument(crate::spans::internal("switchyard.admit"))
        .await?;
    admitted.ledger.charge.cache_outcome(cache);
    let planned = match plan::plan(app, &config, &admitted, &ctx.hints).await {
        Ok(p) => p,
        Err(e) => return Err(admitted.ledger.fail(e)),
    };
    chat(app, ctx, admitted, planned).await
}

/// The attempts stage of a chat request: [`attempt::attempts`] with the frame-stream dispatch, then the
/// committed feed. Errors are recorded in the ledger before they are returned.
async fn chat(
    app: &Arc<AppState>,
    ctx: &RequestContext,
    admitted: Admitted<'_>,
    planned: Planned<'_>,
) -> Result<FrameFeed, ApiError> {
    let Admitted {
        req,
        timeouts,
        deadline,
        mut ledger,
        downgraded_from,
        ..
    } = admitted;
    ledger.outcome.streamed(req.stream);
    let request_id = req.id;
    let mut stream = attempt::ChatStream::new(
        app,
        ctx.shown_request_id(request_id),
        req,
        planned.trim,
        timeouts,
        deadline,
    );
    let won = match attempt::attempts(
        app,
        ctx,
        request_id,
        &mut ledger,
        planned.targets,
        &mut stream,
    )
    .await
    {
        Ok(w) => w,
        Err(e) => return Err(ledger.fail(e)),
    };
    let opened = won.committed;
    let served = Served {
        request_id,
        target: won.target.id.clone(),
        worker: opened.attempt.worker().unwrap_or("").to_owned(),
        fallbacks: won.fallbacks,
        trimmed: opened.trimmed,
        downgraded_from,
        upstream_headers: opened
            .buffered
            .iter()
            .rev()
            .find_map(|f| match f {
                FrameBody::UpstreamHeaders { headers } => Some(headers.clone()),
                _ => None,
            })
            .unwrap_or_default(),
    };
    Ok(FrameFeed::new(
        app.clone(),
        ledger,
        served,
        opened,
        won.in_flight,
        timeouts,
        deadline,
    ))
}
