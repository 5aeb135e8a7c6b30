//! The attempts stage: one engine ([`attempts`]) tries the planned candidates in order for every
//! kind of request. Per candidate it records the attempt (charge event, metrics, in-flight
//! count), lets the [`Dispatch`] kind try it, and decides by [`judge`] — the only place ingress
//! reads [`ErrorInfo::disposition`] — whether the next target may be tried and whether the
//! failure counts against the target's health. Chat plugs in `ChatStream` (publish, read frames
//! until the attempt commits); embeddings a NATS request/reply (`crate::embeddings`).

use super::admit::Ledger;
use super::plan::Trimming;
use super::timeouts::{Expiry, RequestTimeouts};
use crate::AppState;
use crate::context::RequestContext;
use crate::dispatch::Attempt;
use crate::target_health::InFlight;
use crate::trim;
use std::collections::VecDeque;
use std::future::Future;
use std::time::Instant;
use switchyard_schemas::config::TargetConfig;
use switchyard_schemas::request::TargetRef;
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, FrameBody};
use uuid::Uuid;

/// One way of trying a target, driven by [`attempts`].
pub trait Dispatch {
    /// What a successful attempt hands on (for chat, the opened frame stream).
    type Committed;

    /// An error that ends the request before `target` is tried (its deadline passed); `None`
    /// to go on. The target is then not recorded as attempted.
    fn expired(&self, _target: &TargetConfig) -> Option<ErrorInfo> {
        None
    }

    /// Attempt number `attempt` (0-based, the wire's `attempt`) on `target`: `Ok` once it
    /// committed, else its classified failure.
    fn attempt(
        &mut self,
        target: &TargetConfig,
        attempt: u32,
    ) -> impl Future<Output = Result<Self::Committed, ErrorInfo>> + Send;

    /// Whether the attempt that just failed lost its worker (silent, or never picked up) before
    /// anything reached the client: the failure says nothing about the target, and another
    /// worker replica may serve it. Default: never.
    fn worker_lost(&self) -> bool {
        false
    }
}

/// The attempt that committed.
pub struct Won<'c, C> {
    /// What its dispatch handed on.
    pub committed: C,
    /// The target that served.
    pub target: &'c TargetConfig,
    /// Failed attempts before it.
    pub fallbacks: u32,
    /// Its in-flight count; held until the answer ends.
    pub in_flight: InFlight,
}

/// Tries `targets` in order with `dispatch` until one commits. Each attempt is recorded in
/// `ledger` (target, fallbacks) and the in-flight counts; a success marks the target healthy.
/// The error (the first that allows no fallback, else the last) is the request's; the caller
/// records it with [`Ledger::fail`]. When the last is a 429 (e.g. every target saturated by its
/// own limits) it carries the soonest `retry_after_ms` of every 429 seen.
pub async fn attempts<'c, D: Dispatch>(
    app: &AppState,
    ctx: &RequestContext,
    request: Uuid,
    ledger: &mut Ledger,
    targets: Vec<&'c TargetConfig>,
    dispatch: &mut D,
) -> Result<Won<'c, D::Committed>, ErrorInfo> {
    let mut last_err: Option<ErrorInfo> = None;
    // The soonest retry any 429 failure (a target's own limits, or the upstream's) suggested.
    let mut soonest: Option<u64> = None;
    // A batch item's later run numbers its attempts after the earlier runs' (same request id).
    let base = ctx.attempt_base();
    let mut queue: VecDeque<&'c TargetConfig> = targets.into();
    // One more attempt on the same target after its worker was lost (a killed or stuck worker
    // replica), once per request: another worker of the queue group takes it.
    let mut worker_retry = true;
    for n in 0u32.. {
        let Some(target) = queue.pop_front() else {
            break;
        };
        if let Some(e) = dispatch.expired(target) {
            last_err = Some(e);
            break;
        }
        ledger.charge.attempt(&target.id, &target.upstream_model, n);
        ledger.outcome.attempt(&target.id);
        let in_flight = app.stats.start(&target.id, &app.metrics);
        let wire = base.saturating_add(n);
        let span = attempt_span(target, wire);
        match tracing::Instrument::instrument(dispatch.attempt(target, wire), span.clone()).await {
            Ok(committed) => {
                ledger.outcome.committed();
                app.health.success(&target.id);
                return Ok(Won {
                    committed,
                    target,
                    fallbacks: n,
                    in_flight,
                });
            }
            Err(error) => {
                ledger
                    .outcome
                    .attempt_failed(crate::error::class_to_http(error.class).0.as_u16());
                switchyard_schemas::trace::fail(&span, error.class.as_str());
                ledger.charge.attempt_failed(&error);
                if worker_retry && dispatch.worker_lost() && error.disposition().fallback {
                    worker_retry = false;
                    tracing::warn!(request = %request, target = %target.id, error = %error,
                        "worker lost before the answer started, trying the same target again");
                    queue.push_front(target);
                    last_err = Some(error);
                    continue;
                }
                if !judge(app, &target.id, &error) {
                    // The message is the sanitised one (credentials redacted, as the client sees).
                    tracing::info!(request = %request, target = %target.id, error = %error,
                        "attempt failed, not retried");
                    return Err(error);
                }
                tracing::info!(request = %request, target = %target.id, error = %error,
                    "attempt failed, trying next target");
                if error.class == ErrorClass::RateLimited {
                    soonest = match (soonest, error.retry_after_ms) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                last_err = Some(error);
            }
        }
    }
    Err(match last_err {
        // Every target saturated (by its own limits or its upstream's): a 429 with the soonest
        // retry any of them suggested, not a 503.
        Some(mut e) if e.class == ErrorClass::RateLimited => {
            e.retry_after_ms = soonest;
            e
        }
        Some(e) => e,
        None => ErrorInfo::new(ErrorClass::NoCapacity, "no enabled target for this model"),
    })
}

/// The span of one attempt (`switchyard.attempt`): the target, its provider and upstream model,
/// the wire attempt number; its context is what the dispatch sends to the worker.
fn attempt_span(target: &TargetConfig, attempt: u32) -> tracing::Span {
    use switchyard_schemas::trace::OpenTelemetrySpanExt;
    let span = crate::spans::internal("switchyard.attempt");
    if !span.is_none() {
        span.set_attribute("switchyard.attempt", i64::from(attempt));
        span.set_attribute("switchyard.target", target.id.clone());
        span.set_attribute(
            "gen_ai.provider.name",
            switchyard_schemas::trace::gen_ai_provider(target.provider.as_str()).to_owned(),
        );
        span.set_attribute("gen_ai.request.model", target.upstream_model.clone());
    }
    span
}

/// What `error` on `target` means, decided once for every path (before commit and after content
/// alike) from [`ErrorInfo::disposition`]: returns whether another target may be tried, and counts
/// a failure that allows it and degrades the target against the target's passive health (a
/// worker's own admission refusal, with no upstream status, does not degrade it).
pub fn judge(app: &AppState, target: &str, error: &ErrorInfo) -> bool {
    let d = error.disposition();
    if d.fallback && d.degrades && app.health.failure(target) {
        tracing::warn!(target = %target, "consecutive failures: target degraded in this ingress");
    }
    d.fallback
}

/// A chat attempt that committed: its reply stream and what was read before the commit.
pub(super) struct Opened {
    /// The reply stream.
    pub attempt: Attempt,
    /// Frames read before the commit, in order.
    pub buffered: VecDeque<FrameBody>,
    /// When the request was published.
    pub dispatched: Instant,
    /// When the first content frame arrived, if one did.
    pub first_content: Option<Instant>,
    /// When the latest content frame arrived, if one did.
    pub last_content: Option<Instant>,
    /// Messages dropped to fit this target's context window.
    pub trimmed: Option<usize>,
}

/// The chat dispatch: trims for the target, publishes the request on `sy.req.chat.<provider>`
/// and reads its frames until the attempt commits — the first content (streaming client) or the
/// terminal frame (non-streaming: it can still fall back, the client has seen nothing).
pub(super) struct ChatStream<'a> {
    app: &'a AppState,
    /// The request id its NATS headers carry ([`RequestContext::shown_request_id`]).
    shown: String,
    req: ChatRequest,
    trim: Option<Trimming>,
    timeouts: RequestTimeouts,
    deadline: Instant,
    /// The last attempt failed by losing its worker ([`Dispatch::worker_lost`]).
    lost_worker: bool,
}

impl<'a> ChatStream<'a> {
    /// The dispatch of `req` (request id `shown` in its NATS headers), trimmed per target by
    /// `trim`.
    pub(super) fn new(
        app: &'a AppState,
        shown: String,
        req: ChatRequest,
        trim: Option<Trimming>,
        timeouts: RequestTimeouts,
        deadline: Instant,
    ) -> Self {
        Self {
            app,
            shown,
            req,
            trim,
            timeouts,
            deadline,
            lost_worker: false,
        }
    }

    /// Fits the conversation to `target`'s context window, from the original every time;
    /// returns the messages dropped.
    fn trim_for(&mut self, target: &TargetConfig) -> Option<usize> {
        let t = self.trim.as_ref()?;
        let budget = target
            .context_window
            .map(|w| w.saturating_sub(t.max_tokens));
        match budget.and_then(|b| trim::trim(&t.original, &t.estimate, b)) {
            Some(cut) => {
                tracing::info!(request = %self.req.id, target = %target.id, dropped = cut.dropped,
                    tokens = cut.tokens, "trimmed the conversation to the context window");
                self.req.messages = cut.messages;
                // The kept messages' estimate (per-message tokens add up).
                self.req.prompt_tokens = self.req.prompt_tokens.map(|_| cut.tokens);
                Some(cut.dropped)
            }
            None => {
                if self.req.messages.len() != t.original.len() {
                    self.req.messages = t.original.clone();
                    self.req.prompt_tokens = self.req.prompt_tokens.map(|_| t.estimate.total());
                }
                None
            }
        }
    }
}

impl Dispatch for ChatStream<'_> {
    type Committed = Opened;

    fn expired(&self, target: &TargetConfig) -> Option<ErrorInfo> {
        (Instant::now() >= self.deadline).then(|| self.timeouts.error(Expiry::Total, &target.id))
    }

    fn worker_lost(&self) -> bool {
        self.lost_worker
    }

    async fn attempt(&mut self, target: &TargetConfig, attempt: u32) -> Result<Opened, ErrorInfo> {
        self.req.target = TargetRef {
            id: target.id.clone(),
            provider: target.provider.as_str().to_owned(),
            upstream_model: target.upstream_model.clone(),
        };
        self.req.attempt = attempt;
        let trimmed = self.trim_for(target);
        let dispatched = Instant::now();
        self.lost_worker = false;
        let mut attempt = self.app.dispatcher.send(&self.req, &self.shown).await?;
        let t = self.timeouts;
        let mut buffered = VecDeque::new();
        let mut limit = t.first_frame;
        let mut first_content: Option<Instant> = None;
        let mut last_content: Option<Instant> = None;
        loop {
            let (until, why) = t.wait(self.deadline, dispatched, last_content);
            let frame = match tokio::time::timeout_at(until.into(), attempt.next(limit)).await {
                Ok(f) => f,
                Err(_) => return Err(t.error(why, &target.id)),
            };
            limit = t.silence;
            match frame {
                FrameBody::Start { .. } => {}
                FrameBody::Error { error, .. } => {
                    self.lost_worker = attempt.worker_lost();
                    return Err(error);
                }
                f => {
                    if f.is_content() {
                        let now = Instant::now();
                        if first_content.is_none() {
                            first_content = Some(now);
                            let ttft = now.duration_since(dispatched).as_secs_f64() * 1000.0;
                            self.app.stats.record_ttft(&target.id, ttft);
                        }
                        last_content = Some(now);
                    }
                    let commit = if self.req.stream {
                        f.is_content() || f.is_terminal()
                    } else {
                        f.is_terminal()
                    };
                    buffered.push_back(f);
                    if commit {
                        return Ok(Opened {
                            attempt,
                            buffered,
                            dispatched,
                            first_content,
                            last_content,
                            trimmed,
                        });
                    }
                }
            }
        }
    }
}
