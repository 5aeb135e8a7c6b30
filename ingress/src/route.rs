//! Front-door-neutral routing: admission checks, candidate ordering ([`crate::strategy`]),
//! dispatch to the ordered targets with fallback, and the committed frame feed the front doors
//! encode (OpenAI or Anthropic wire format).
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
//! Timeouts per attempt: no frame at all within `timeouts.first_frame_ms` (no worker picked the
//! request up) and no frame or heartbeat within `timeouts.worker_silence_ms` (the worker is gone)
//! move on to the next target. The model's policy can add: `timeouts.first_byte_ms` — no content
//! from the target within this since dispatch → next target; `timeouts.idle_ms` — no content for
//! this long (heartbeats do not count) → next target, or an error event once content went out;
//! `timeouts.total_ms` (default the global `timeouts.total_ms`) — the whole request, admission to
//! last frame: a 504 (or an error event) and the deadline workers are given.
//!
//! Response headers: `x-request-id`, `x-switchyard-target`, `x-switchyard-worker`,
//! `x-switchyard-fallbacks`, and `x-switchyard-trimmed` (messages dropped by `trim_context`).

use crate::AppState;
use crate::budget;
use crate::charge::Charge;
use crate::dispatch::Attempt;
use crate::error::ApiError;
use crate::health::InFlight;
use crate::metrics::Outcome;
use crate::strategy::{self, Needs, Observed, Preferences};
use crate::trim;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::config::{GatewayConfig, ModelConfig, TargetConfig};
use switchyard_schemas::request::{Message, SamplingParams, TargetRef, Tool};
use switchyard_schemas::routing::Policy;
use switchyard_schemas::{
    ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage, now_ms,
};
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
        }
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
/// [`current_hints`] while the handler runs.
pub async fn capture_hints(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let hints = RequestHints::from_headers(req.headers());
    HINTS.scope(hints, next.run(req)).await
}

/// The routing headers of the request being handled (empty outside [`capture_hints`]).
pub fn current_hints() -> RequestHints {
    HINTS.try_with(Clone::clone).unwrap_or_default()
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
            .catalog
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
    Err(ApiError {
        status: axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        message: format!(
            "Request body of {body_len} bytes exceeds this gateway's limit of {} bytes.",
            max.saturating_sub(ENVELOPE_BYTES)
        ),
        kind: "invalid_request_error",
        param: None,
        code: Some("request_too_large"),
        retry_after_s: None,
    })
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
}

impl Served {
    /// Adds `x-request-id`, `x-switchyard-target`, `x-switchyard-worker`, `x-switchyard-fallbacks`
    /// and, after trimming, `x-switchyard-trimmed`.
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
    }
}

/// Why an attempt stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// The request's total time limit.
    Total,
    /// The policy's `first_byte_ms`: no content since dispatch.
    FirstContent,
    /// The policy's `idle_ms`: no content since the last.
    Idle,
}

/// The timeouts of one request: global `timeouts` with the policy's overrides.
#[derive(Debug, Clone, Copy)]
pub struct RequestTimeouts {
    /// No frame at all from a worker within this → next target.
    pub first_frame: Duration,
    /// No frame or heartbeat within this → the worker is gone.
    pub silence: Duration,
    /// No content within this after dispatch → next target (policy `first_byte_ms`).
    pub first_content: Option<Duration>,
    /// No content for this long → next target / error event (policy `idle_ms`).
    pub idle: Option<Duration>,
    /// Whole request (policy `total_ms`, else global `total_ms`).
    pub total: Duration,
}

impl RequestTimeouts {
    /// Global timeouts with `policy`'s overrides.
    pub fn of(config: &GatewayConfig, policy: Option<&Policy>) -> Self {
        let t = &config.timeouts;
        let o = policy.map(|p| &p.timeouts);
        Self {
            first_frame: Duration::from_millis(t.first_frame_ms),
            silence: Duration::from_millis(t.worker_silence_ms),
            first_content: o.and_then(|o| o.first_byte_ms).map(Duration::from_millis),
            idle: o.and_then(|o| o.idle_ms).map(Duration::from_millis),
            total: Duration::from_millis(o.and_then(|o| o.total_ms).unwrap_or(t.total_ms)),
        }
    }

    /// Until when to wait for the next frame, and what it means when that passes.
    fn wait(
        &self,
        deadline: Instant,
        dispatched: Instant,
        last_content: Option<Instant>,
    ) -> (Instant, Expiry) {
        let content = match last_content {
            None => self
                .first_content
                .map(|d| (dispatched + d, Expiry::FirstContent)),
            Some(at) => self.idle.map(|d| (at + d, Expiry::Idle)),
        };
        match content {
            Some((at, why)) if at < deadline => (at, why),
            _ => (deadline, Expiry::Total),
        }
    }

    fn error(&self, why: Expiry, target: &str) -> ErrorInfo {
        let ms = |d: Option<Duration>| d.map_or(0, |d| d.as_millis());
        match why {
            Expiry::Total => {
                let mut e = ErrorInfo::new(
                    ErrorClass::Timeout,
                    format!(
                        "The request exceeded its time limit of {} ms.",
                        self.total.as_millis()
                    ),
                );
                e.retryable = false;
                e
            }
            Expiry::FirstContent => ErrorInfo::new(
                ErrorClass::Timeout,
                format!(
                    "target `{target}` sent no content within {} ms",
                    ms(self.first_content)
                ),
            ),
            Expiry::Idle => ErrorInfo::new(
                ErrorClass::Timeout,
                format!("target `{target}` sent no content for {} ms", ms(self.idle)),
            ),
        }
    }
}

/// The prompt estimate, when some candidate's context window could be too small for it (the
/// byte upper bound is checked first, so most prompts are never tokenized; long ones are
/// tokenized off the executor).
async fn prompt_estimate(
    config: &GatewayConfig,
    model: &ModelConfig,
    req: &ChatRequest,
    max_tokens: u64,
) -> Option<trim::Estimate> {
    let smallest = model
        .targets
        .iter()
        .filter_map(|id| config.target(id))
        .filter(|t| t.enabled)
        .filter_map(|t| t.context_window)
        .min()?;
    if trim::upper_bound(&req.messages, &req.tools) + max_tokens <= smallest {
        return None;
    }
    Some(trim::Estimate::of_async(&req.messages, &req.tools).await)
}

/// Routes `inbound` with the routing headers of the request being handled ([`current_hints`]).
pub async fn route(app: &Arc<AppState>, inbound: Inbound) -> Result<FrameFeed, ApiError> {
    let hints = current_hints();
    route_with(app, inbound, &hints).await
}

/// Routes `inbound`: resolves the model, orders its candidate targets, tries them in order, and
/// returns the committed feed. Errors are already recorded in the charge event and the metrics.
pub async fn route_with(
    app: &Arc<AppState>,
    inbound: Inbound,
    hints: &RequestHints,
) -> Result<FrameFeed, ApiError> {
    let config = app.config.get();
    let model = routed_model(&config, &inbound.model, hints)?;
    let admitted = Instant::now();
    let id = Uuid::now_v7();
    let caller = crate::auth::current_caller();
    let scopes = budget::scopes(&config, &caller);
    let reject = |model: &ModelConfig, e: ApiError| {
        Outcome::new(&app.metrics, &model.id, admitted).finish(e.status.as_u16());
        e
    };
    let (model, downgraded_from) = budget::choose_model(app, &config, model, &scopes)
        .await
        .map_err(|e| reject(model, e))?;
    let policy = model.policy.as_deref().and_then(|p| config.policy(p));
    let timeouts = RequestTimeouts::of(&config, policy);
    let deadline = admitted + timeouts.total;
    let deadline_ms = now_ms() + timeouts.total.as_millis() as u64;
    // Budget admission before anything is recorded: a refused request leaves no usage record.
    let reservation = budget::reserve_for(
        app,
        &config,
        model,
        scopes,
        &inbound.messages,
        &inbound.tools,
        inbound.params.max_tokens,
        deadline_ms,
    )
    .await
    .map_err(|e| reject(model, e))?;
    let mut req = ChatRequest {
        id,
        tenant: caller.tenant,
        key_id: caller.key_id,
        // The configured model routed by: usage and prices key on it.
        model: model.id.clone(),
        target: TargetRef {
            id: String::new(),
            provider: String::new(),
            upstream_model: String::new(),
        },
        messages: inbound.messages,
        tools: inbound.tools,
        tool_choice: inbound.tool_choice,
        params: inbound.params,
        stream: inbound.stream,
        include_usage: inbound.include_usage,
        deadline_ms,
        attempt: 0,
    };
    let mut charge = Charge::new(app.clone(), &req, admitted);
    if let Some(r) = reservation {
        charge.reserved(r);
    }
    let mut outcome = Outcome::new(&app.metrics, &model.id, admitted);
    let fail = |charge: Charge, outcome: &mut Outcome, e: ErrorInfo| -> ApiError {
        charge.finish(Some(e.class));
        let api = ApiError::from(e);
        outcome.finish(api.status.as_u16());
        api
    };

    let trim_on = policy.is_some_and(|p| p.trim_context);
    let mut needs = Needs::chat(&req.messages, &req.tools, &req.params);
    let estimate = prompt_estimate(&config, model, &req, needs.max_tokens).await;
    if let Some(e) = &estimate {
        needs.prompt_tokens = Some(e.total());
        if trim_on {
            needs.min_prompt_tokens = Some(e.floor(&req.messages));
        }
    }
    let prefs = hints.preferences(req.params.user.as_deref());
    let mut plan = match strategy::plan(
        &config,
        model,
        &needs,
        &prefs,
        |t| observe(app, t),
        &mut rand::rng(),
    ) {
        Ok(p) => p,
        Err(e) => return Err(fail(charge, &mut outcome, e)),
    };
    if prefs.order.is_empty() {
        strategy::probe_first(
            &mut plan.targets,
            |id| app.health.state(id),
            app.probe_share(),
            &mut rand::rng(),
        );
    }
    // Trimming works from the original conversation for every attempt.
    let original: Option<Vec<Message>> =
        (trim_on && estimate.is_some()).then(|| req.messages.clone());

    let mut last_err: Option<ErrorInfo> = None;
    let mut tried = 0u32;
    for target in plan.targets {
        if Instant::now() >= deadline {
            last_err = Some(timeouts.error(Expiry::Total, &target.id));
            break;
        }
        req.target = TargetRef {
            id: target.id.clone(),
            provider: target.provider.as_str().to_owned(),
            upstream_model: target.upstream_model.clone(),
        };
        req.attempt = tried;
        let mut trimmed = None;
        if let (Some(all), Some(est)) = (&original, &estimate) {
            let budget = target
                .context_window
                .map(|w| w.saturating_sub(needs.max_tokens));
            match budget.and_then(|b| trim::trim(all, est, b)) {
                Some(t) => {
                    tracing::info!(request = %id, target = %target.id, dropped = t.dropped,
                        tokens = t.tokens, "trimmed the conversation to the context window");
                    trimmed = Some(t.dropped);
                    req.messages = t.messages;
                }
                None => {
                    if req.messages.len() != all.len() {
                        req.messages = all.clone();
                    }
                }
            }
        }
        charge.attempt(&target.id, &target.upstream_model, tried);
        outcome.attempt(&target.id);
        tried += 1;
        let in_flight = app.stats.start(&target.id, &app.metrics);
        let dispatched = Instant::now();
        let mut attempt = match app.dispatcher.send(&req).await {
            Ok(a) => a,
            Err(e) => {
                last_err = Some(e);
                continue;
            }
        };
        // Read until the first content (stream) or the end (non-stream).
        let mut buffered = VecDeque::new();
        let mut limit = timeouts.first_frame;
        let mut first_content: Option<Instant> = None;
        let mut last_content: Option<Instant> = None;
        let failed = loop {
            let (until, why) = timeouts.wait(deadline, dispatched, last_content);
            let frame = match tokio::time::timeout_at(until.into(), attempt.next(limit)).await {
                Ok(f) => f,
                Err(_) => break Some(timeouts.error(why, &target.id)),
            };
            limit = timeouts.silence;
            match frame {
                FrameBody::Start { .. } => {}
                FrameBody::Error { error, .. } => break Some(error),
                f => {
                    if f.is_content() {
                        let now = Instant::now();
                        if first_content.is_none() {
                            first_content = Some(now);
                            let ttft = now.duration_since(dispatched).as_secs_f64() * 1000.0;
                            app.stats.record_ttft(&target.id, ttft);
                        }
                        last_content = Some(now);
                    }
                    let commit = if req.stream {
                        f.is_content() || f.is_terminal()
                    } else {
                        f.is_terminal()
                    };
                    buffered.push_back(f);
                    if commit {
                        break None;
                    }
                }
            }
        };
        if let Some(error) = failed {
            // Fallback and health are decided in one place (`ErrorInfo::disposition`): a
            // worker's own admission refusal (no upstream status) does not degrade the target.
            let disposition = error.disposition();
            if disposition.fallback {
                if disposition.degrades && app.health.failure(&target.id) {
                    tracing::warn!(target = %target.id, "consecutive failures: target degraded in this ingress");
                }
                tracing::info!(request = %id, target = %target.id, error = %error, "attempt failed, trying next target");
                last_err = Some(error);
                continue;
            }
            return Err(fail(charge, &mut outcome, error));
        }
        app.health.success(&target.id);
        if let Some(at) = first_content {
            outcome.first_content(at);
        }
        let served = Served {
            request_id: id,
            target: target.id.clone(),
            worker: attempt.worker().unwrap_or("").to_owned(),
            fallbacks: tried - 1,
            trimmed,
            downgraded_from,
        };
        return Ok(FrameFeed {
            app: app.clone(),
            attempt,
            buffered,
            charge: Some(charge),
            outcome,
            in_flight: Some(in_flight),
            timeouts,
            deadline,
            dispatched,
            last_content,
            served,
            done: false,
        });
    }
    let error = last_err.unwrap_or_else(|| {
        ErrorInfo::new(ErrorClass::NoCapacity, "no enabled target for this model")
    });
    Err(fail(charge, &mut outcome, error))
}

/// The frames of the committed attempt, in order, ending with `End` or `Error`. Keeps the charge
/// event and the metrics up to date as frames pass; dropping the feed early (client gone) cancels
/// the upstream call and records the request as cancelled.
pub struct FrameFeed {
    app: Arc<AppState>,
    attempt: Attempt,
    buffered: VecDeque<FrameBody>,
    charge: Option<Charge>,
    outcome: Outcome,
    in_flight: Option<InFlight>,
    timeouts: RequestTimeouts,
    deadline: Instant,
    dispatched: Instant,
    last_content: Option<Instant>,
    /// Who served.
    pub served: Served,
    done: bool,
}

impl FrameFeed {
    /// The next frame (`Start` and heartbeats are skipped); `None` after the terminal frame.
    pub async fn next(&mut self) -> Option<FrameBody> {
        loop {
            if self.done {
                return None;
            }
            let frame = match self.buffered.pop_front() {
                Some(f) => f,
                None => {
                    let t = self.timeouts;
                    let (until, why) = t.wait(self.deadline, self.dispatched, self.last_content);
                    let next = self.attempt.next(t.silence);
                    match tokio::time::timeout_at(until.into(), next).await {
                        Ok(f) => f,
                        Err(_) => FrameBody::Error {
                            error: t.error(why, &self.served.target),
                            content_sent: self.last_content.is_some(),
                        },
                    }
                }
            };
            if frame.is_content() {
                self.last_content = Some(Instant::now());
            }
            if let Some(c) = self.charge.as_mut() {
                match &frame {
                    FrameBody::Text { text } => c.content(text.len()),
                    FrameBody::ToolCall { arguments, .. } => c.content(arguments.len()),
                    FrameBody::Usage { usage } => c.usage(*usage),
                    _ => {}
                }
            }
            match &frame {
                FrameBody::Start { .. } | FrameBody::Heartbeat => continue,
                FrameBody::End { .. } => {
                    self.done = true;
                    if let Some(c) = self.charge.take() {
                        c.finish(None);
                    }
                    self.outcome.finish(200);
                    self.in_flight = None;
                }
                FrameBody::Error { error, .. } => {
                    self.done = true;
                    if let Some(c) = self.charge.take() {
                        c.finish(Some(error.class));
                    }
                    if error.retryable {
                        self.app.health.failure(&self.served.target);
                    }
                    self.outcome
                        .finish(ApiError::from(error.clone()).status.as_u16());
                    self.in_flight = None;
                }
                _ => {}
            }
            return Some(frame);
        }
    }

    /// Reads the whole answer (non-streaming clients).
    pub async fn collect(mut self) -> Result<Aggregate, ErrorInfo> {
        let mut agg = Aggregate::default();
        while let Some(f) = self.next().await {
            match f {
                FrameBody::Text { text } => agg.text.push_str(&text),
                FrameBody::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    let i = index as usize;
                    if agg.tool_calls.len() <= i {
                        agg.tool_calls.resize(i + 1, ToolCallAcc::default());
                    }
                    let call = &mut agg.tool_calls[i];
                    if let Some(id) = id {
                        call.id = id;
                    }
                    if let Some(name) = name {
                        call.name = name;
                    }
                    call.arguments.push_str(&arguments);
                }
                FrameBody::Usage { usage } => agg.usage = Some(usage),
                FrameBody::End { finish_reason } => agg.finish = finish_reason,
                FrameBody::Error { error, .. } => return Err(error),
                FrameBody::Start { .. } | FrameBody::Heartbeat => {}
            }
        }
        Ok(agg)
    }
}

/// A tool call accumulated from deltas.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ToolCallAcc {
    /// Call id.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Concatenated JSON argument pieces.
    pub arguments: String,
}

/// A complete answer.
#[derive(Debug, Default, Clone)]
pub struct Aggregate {
    /// All text.
    pub text: String,
    /// Tool calls by index.
    pub tool_calls: Vec<ToolCallAcc>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// Upstream-reported usage.
    pub usage: Option<Usage>,
}
