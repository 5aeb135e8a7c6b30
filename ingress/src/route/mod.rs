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
//! The front-door handlers only see the body, so [`capture_hints`] (a middleware on every route)
//! reads these headers into a task-local that [`route`] picks up.
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
//! Response headers: `x-request-id` (the request id, [`capture_hints`]), `x-switchyard-request-id`,
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
use crate::error::ApiError;
use crate::strategy::{self, Observed, Preferences};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use std::sync::Arc;
use switchyard_schemas::config::{GatewayConfig, ModelConfig, TargetConfig};
use switchyard_schemas::request::{Message, SamplingParams, Tool};
use uuid::Uuid;

/// Header: route by this model id or route tag instead of the body's `model`.
pub const HEADER_ROUTE: &str = "x-switchyard-route";
/// Header: only these target ids.
pub const HEADER_ONLY: &str = "x-switchyard-only";
/// Header: never these target ids.
pub const HEADER_IGNORE: &str = "x-switchyard-ignore";
/// Header: these target ids first, in order.
pub const HEADER_ORDER: &str = "x-switchyard-order";
/// Header: the user id for canary hashing.
pub const HEADER_USER: &str = "x-switchyard-user";
/// Response header: the model asked for, when a budget's `downgrade_at` served a cheaper one.
pub const HEADER_DOWNGRADED: &str = "x-switchyard-downgraded-from";
/// Response header: messages dropped by context trimming.
pub const HEADER_TRIMMED: &str = "x-switchyard-trimmed";

/// The routing headers of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHints {
    /// `x-switchyard-route`.
    pub route: Option<String>,
    /// `x-switchyard-user`.
    pub user: Option<String>,
    /// `x-switchyard-only`.
    pub only: Option<Vec<String>>,
    /// `x-switchyard-ignore`.
    pub ignore: Vec<String>,
    /// `x-switchyard-order`.
    pub order: Vec<String>,
    /// Set when a batch job runs this request as one of its items ([`crate::batch`]); never
    /// from a client header.
    pub batch: Option<BatchItem>,
    /// Who is calling from where, for the audit log (shared: hints are cloned per stage).
    pub client: std::sync::Arc<ClientInfo>,
    /// The gateway's id of this HTTP request (UUIDv7, set by [`capture_hints`]): the ledger key
    /// of the one request it admits. `None` outside a request (a fresh id each time).
    pub gateway_id: Option<Uuid>,
}

/// The audit log's view of the caller's HTTP request ([`capture_hints`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientInfo {
    /// The front door by path: `openai` (`/v1/chat/completions`, `/v1/completions`),
    /// `anthropic` (`/v1/messages`), `responses`, `embeddings`; `batch` for batch items.
    pub front_door: Option<&'static str>,
    /// The TCP peer's IP address.
    pub client_ip: Option<String>,
    /// `user-agent`, at most 256 bytes.
    pub user_agent: Option<String>,
    /// `x-request-id` when well-formed
    /// ([`switchyard_schemas::trace::well_formed_request_id`]).
    pub request_id: Option<String>,
}

/// Response header: the gateway's own request id (UUIDv7), the ledger and audit key; it differs
/// from `x-request-id` when the client sent its own (docs/tracing.md).
pub const HEADER_GATEWAY_REQUEST_ID: &str = "x-switchyard-request-id";

impl ClientInfo {
    /// Reads the front door from `req`'s path, the peer from its `ConnectInfo` and the
    /// `user-agent` and `x-request-id` headers.
    pub fn of(req: &axum::extract::Request) -> Self {
        let front_door = match req.uri().path() {
            "/v1/chat/completions" | "/v1/completions" => Some("openai"),
            "/v1/messages" => Some("anthropic"),
            "/v1/responses" => Some("responses"),
            "/v1/embeddings" => Some("embeddings"),
            _ => None,
        };
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        Self {
            front_door,
            client_ip: req
                .extensions()
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip().to_string()),
            user_agent: header("user-agent")
                .map(|ua| switchyard_schemas::audit::clip(ua, MAX_USER_AGENT_BYTES)),
            request_id: header("x-request-id")
                .and_then(switchyard_schemas::audit::well_formed_request_id)
                .map(str::to_owned),
        }
    }
}

/// Longest `user-agent` kept in the audit log, bytes.
const MAX_USER_AGENT_BYTES: usize = 256;

/// The batch item a request executes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItem {
    /// The batch id (`batch_…` or `msgbatch_…`).
    pub batch_id: String,
    /// The item's request id, derived from the batch id and the `custom_id` (the same for every
    /// run of the item), so a re-run writes the same `charge` key (the ledger keeps one).
    pub request_id: Uuid,
    /// Added to the wire attempt numbers of this run of the item (its run number ×
    /// `crate::batch::records::ATTEMPTS_PER_RUN`), so each run's `upstream` rows keep their own
    /// ledger keys under the item's one request id.
    pub attempt_base: u32,
    /// Where the request's `charge` event goes instead of JetStream: the runner publishes it
    /// once it knows this try is the item's last ([`crate::charge::ChargeSlot`]).
    pub charge: crate::charge::ChargeSlot,
}

impl RequestHints {
    /// Reads the `x-switchyard-*` routing headers (values that are not UTF-8 are ignored).
    pub fn from_headers(h: &HeaderMap) -> Self {
        let text = |name: &str| {
            h.get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let list = |name: &str| -> Vec<String> {
            h.get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let only = list(HEADER_ONLY);
        Self {
            route: text(HEADER_ROUTE),
            user: text(HEADER_USER),
            only: (!only.is_empty()).then_some(only),
            ignore: list(HEADER_IGNORE),
            order: list(HEADER_ORDER),
            batch: None,
            client: std::sync::Arc::default(),
            gateway_id: None,
        }
    }

    /// The id of a newly admitted request: the batch item's own, else the HTTP request's
    /// (an HTTP request admits at most one), else a new UUIDv7.
    pub fn new_request_id(&self) -> Uuid {
        match &self.batch {
            Some(b) => b.request_id,
            None => self.gateway_id.unwrap_or_else(Uuid::now_v7),
        }
    }

    /// The request id the client sees and the NATS headers carry (`X-Request-Id`): the client's
    /// own when well-formed, else the gateway's `id`.
    pub fn request_id(&self, id: Uuid) -> String {
        self.client
            .request_id
            .clone()
            .unwrap_or_else(|| id.to_string())
    }

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

tokio::task_local! {
    static HINTS: RequestHints;
}

/// Middleware: makes the request's routing headers available to [`route`] and
/// [`current_hints`] while the handler runs, assigns the request ids and opens the request's
/// server span ([`crate::spans::request`]). Every response gets `x-request-id` (the client's
/// well-formed `X-Request-Id`, else the gateway's UUIDv7) and [`HEADER_GATEWAY_REQUEST_ID`],
/// errors before admission included.
pub async fn capture_hints(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use tracing::Instrument;
    let mut hints = RequestHints::from_headers(req.headers());
    hints.client = std::sync::Arc::new(ClientInfo::of(&req));
    let gateway = Uuid::now_v7();
    hints.gateway_id = Some(gateway);
    let shown = hints.request_id(gateway);
    let gateway = gateway.to_string();
    let span = crate::spans::request(&req, &shown, &gateway);
    let handled = HINTS.scope(hints, next.run(req));
    let mut resp = crate::spans::with_root(span.clone(), handled)
        .instrument(span.clone())
        .await;
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

/// The routing headers of the request being handled (empty outside [`capture_hints`]).
pub fn current_hints() -> RequestHints {
    HINTS.try_with(Clone::clone).unwrap_or_default()
}

/// The batch id of the request being handled (`None` for live traffic).
pub fn current_batch_id() -> Option<String> {
    HINTS
        .try_with(|h| h.batch.as_ref().map(|b| b.batch_id.clone()))
        .ok()
        .flatten()
}

/// The audit view of the request being handled (empty outside [`capture_hints`]).
pub fn current_client() -> std::sync::Arc<ClientInfo> {
    HINTS.try_with(|h| h.client.clone()).unwrap_or_default()
}

/// The offset of the wire attempt numbers of the request being handled (0 for live traffic;
/// see [`BatchItem::attempt_base`]).
pub fn current_attempt_base() -> u32 {
    HINTS
        .try_with(|h| h.batch.as_ref().map_or(0, |b| b.attempt_base))
        .unwrap_or(0)
}

/// Takes the charge sender of the batch item being handled (`None` for live traffic, or when
/// a charge of this request already took it).
pub fn take_batch_charge() -> Option<tokio::sync::oneshot::Sender<switchyard_schemas::UsageEvent>> {
    HINTS
        .try_with(|h| h.batch.as_ref().and_then(|b| b.charge.take()))
        .ok()
        .flatten()
}

/// Runs `fut` (a front door's handler) with `hints` as the request's routing context: how a
/// batch item enters the same pipeline as a live request.
pub async fn with_hints<F: std::future::Future>(hints: RequestHints, fut: F) -> F::Output {
    HINTS.scope(hints, fut).await
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

/// Routes `inbound` with the routing headers of the request being handled ([`current_hints`]);
/// `cache` is its cache outcome for the audit record
/// ([`crate::cache_client::Check::audit_outcome`]).
pub async fn route(
    app: &Arc<AppState>,
    inbound: Inbound,
    cache: &'static str,
) -> Result<FrameFeed, ApiError> {
    let hints = current_hints();
    route_with(app, inbound, &hints, cache).await
}

/// Routes `inbound`: admit → plan → attempts → the committed feed. Every error after admission is
/// already recorded in the charge event and the metrics.
pub async fn route_with(
    app: &Arc<AppState>,
    inbound: Inbound,
    hints: &RequestHints,
    cache: &'static str,
) -> Result<FrameFeed, ApiError> {
    use tracing::Instrument;
    let config = app.config.get();
    let mut admitted = admit::admit(app, &config, inbound, hints)
        .instrument(crate::spans::internal("switchyard.admit"))
        .await?;
    admitted.ledger.charge.cache_outcome(cache);
    let planned = match plan::plan(app, &config, &admitted, hints).await {
        Ok(p) => p,
        Err(e) => return Err(admitted.ledger.fail(e)),
    };
    attempt::chat(app, admitted, planned).await
}
