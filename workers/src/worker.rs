//! The worker loop: one queue subscription per served provider, one task per request.
//!
//! For each request the worker sends, on the request's reply subject, `start`, the adapter's
//! normalised events, one `usage`, and `end` or `error` — numbered by `seq`. While the upstream is
//! silent it sends `heartbeat` every `timeouts.heartbeat_ms`, so ingress can tell a dead worker from
//! a slow model. A message on `<prefix>.cancel.<worker-id>` naming the request aborts the upstream
//! call.
//!
//! Flow control: a request carrying [`WINDOW_HEADER`] may have at most that many frames sent and
//! not yet consumed by ingress; grants arrive on `<prefix>.credit.<worker-id>` (see
//! [`switchyard_schemas::frame`]). With the window used up the worker stops reading the upstream
//! (TCP pushes back on it) and sends nothing, heartbeats included; after `timeouts.stall_ms`
//! without credit it cancels the upstream call, ends the attempt with a `cancelled` error frame
//! and bills what it delivered (usage status `cancelled`).
//!
//! Before the upstream call the worker admits the request: circuit breaker and provider cooldown
//! ([`crate::breaker`]), then concurrency, RPM and TPM ([`crate::limits`]). A rejection is answered
//! at once with a retryable `error` frame (`no_capacity` for an open breaker or cooldown,
//! `rate_limited` with `retry_after_ms` for a target limit, concurrency included),
//! without `start` and without an upstream call, so ingress moves to the next target. Failed calls
//! are retried inside the worker while nothing reached the client ([`crate::retry`]); each retry
//! asks the breaker and the RPM bucket again. Timeouts are the global `timeouts` with the target's
//! `timeouts` overrides (connect, first byte measured from the call's start, idle gap between data
//! events, total).
//!
//! Usage: every ingress attempt that called the upstream leaves exactly one `upstream` usage event
//! on JetStream (deduplicated by `Nats-Msg-Id` `<request>:upstream:<attempt>`, `attempt` being
//! ingress's attempt number), whose counts are the sum over all of the attempt's upstream calls,
//! retries included (a failed call contributes zero, or what it reported). One event per call would
//! need a retry index in the ledger's key (request id, kind, attempt); the sum keeps that key and
//! bills exactly what the upstream billed. Counts are estimated from text length when the upstream
//! was aborted before reporting; a report that came before any content (Anthropic's
//! `message_start` input counts) is forwarded to ingress at once, and when the client leaves
//! after it the call is billed from it plus the delivered text. The TPM bucket is corrected with
//! the same total.

use crate::breaker::{Breakers, CallResult, Permit};
use crate::context::{CallEnd, Shared, base_url, http_client};
pub use crate::context::{WorkerOptions, adapter};
use crate::frame_sink::{Flow, FrameSink, START_HOLD};
use crate::limits::Limiter;
use crate::provider::{EventStream, Upstream};
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_publish::UsagePublisher;
use switchyard_schemas::config::{GatewayConfig, ProviderKind, TargetConfig};
use switchyard_schemas::frame::{Credit, WINDOW_HEADER};
use switchyard_schemas::subjects::{CAP_CHAT, CAP_COUNT, CAP_EMBED, Subjects};
use switchyard_schemas::usage::UsageStatus;
use switchyard_schemas::{
    ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage, UsageEvent, UsageKind,
    now_ms,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// Worker start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Subscribing failed.
    #[error("NATS subscribe failed: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    /// Building the HTTP client failed.
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

/// A worker whose queue subscriptions are registered with the server (so a request published
/// after [`Worker::subscribe`] returns reaches it), ready to [`Worker::serve`].
pub struct Worker {
    shared: Arc<Shared>,
    requests: futures::stream::SelectAll<async_nats::Subscriber>,
    cancel_sub: async_nats::Subscriber,
    credit_sub: async_nats::Subscriber,
    /// `.req.embed.`: tells embeddings requests from chat ones by subject.
    embed_marker: String,
    /// `.req.count.`: token-count requests.
    count_marker: String,
    /// The health publisher and the prober; [`Worker::serve`] waits for them before it returns.
    background: TaskTracker,
    /// Stops the health publisher (after the breakers' last events).
    health_stop: CancellationToken,
}

/// Subscribes and serves until `shutdown` fires (see [`Worker`]).
pub async fn run(
    nats: async_nats::Client,
    opts: WorkerOptions,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    Worker::subscribe(nats, opts).await?.serve(shutdown).await;
    Ok(())
}

impl Worker {
    /// Joins the queue group of every served provider and the worker's cancel subject, and waits
    /// until the server has registered them (a flush round trip).
    pub async fn subscribe(
        nats: async_nats::Client,
        opts: WorkerOptions,
    ) -> Result<Self, WorkerError> {
        let config = opts.config.get();
        let http = http_client(config.timeouts.connect_ms)?;
        let js = async_nats::jetstream::new(nats.clone());
        let limiter = Limiter::connect(&js).await;
        // No tokenizer warm-up: ingress sends its prompt estimate with each request, so a worker
        // loads o200k (~37 MB) only for a request that comes without one.
        let (breakers, health) = Breakers::new(opts.worker_id.clone());
        let background = TaskTracker::new();
        let health_stop = CancellationToken::new();
        crate::health_events::spawn_publisher(
            &background,
            health_stop.clone(),
            nats.clone(),
            opts.subjects.clone(),
            health,
            opts.metrics.clone(),
        );
        // Every provider by default, so targets added by a config reload are served at once.
        let mut kinds = opts.providers.clone();
        if kinds.is_empty() {
            kinds = ProviderKind::ALL.to_vec();
        }
        let mut subs = Vec::new();
        for kind in &kinds {
            let subject = opts.subjects.request(CAP_CHAT, kind.as_str());
            subs.push(
                nats.queue_subscribe(subject, Subjects::worker_queue_group(kind.as_str()))
                    .await?,
            );
            let embed = opts.subjects.request(CAP_EMBED, kind.as_str());
            subs.push(
                nats.queue_subscribe(embed, Subjects::worker_queue_group(kind.as_str()))
                    .await?,
            );
            if kind.counts_tokens() {
                let count = opts.subjects.request(CAP_COUNT, kind.as_str());
                subs.push(
                    nats.queue_subscribe(count, Subjects::worker_queue_group(kind.as_str()))
                        .await?,
                );
            }
        }
        let embed_marker = format!(".req.{CAP_EMBED}.");
        let count_marker = format!(".req.{CAP_COUNT}.");
        let cancel_sub = nats
            .subscribe(opts.subjects.cancel(&opts.worker_id))
            .await?;
        let credit_sub = nats
            .subscribe(opts.subjects.credit(&opts.worker_id))
            .await?;
        if !switchyard_publish::sync_with_server(&nats).await {
            tracing::warn!("could not confirm the worker's subscriptions with the NATS server");
        }
        tracing::info!(worker = %opts.worker_id, providers = ?kinds, "worker serving");
        let usage = UsagePublisher::start(js.clone(), opts.subjects.clone(), opts.spool.clone());
        let shared = Arc::new(Shared {
            usage,
            nats,
            opts,
            http,
            clients: Mutex::new(HashMap::new()),
            cancels: Mutex::new(HashMap::new()),
            credits: Mutex::new(HashMap::new()),
            limiter,
            breakers,
            usage_tasks: TaskTracker::new(),
        });
        Ok(Self {
            shared,
            requests: futures::stream::select_all(subs),
            cancel_sub,
            credit_sub,
            embed_marker,
            count_marker,
            background,
            health_stop,
        })
    }

    /// Serves until `shutdown` fires, then stops taking requests (other workers in the queue group
    /// get them) and waits for in-flight ones to finish.
    pub async fn serve(self, shutdown: CancellationToken) {
        let Self {
            shared,
            mut requests,
            mut cancel_sub,
            mut credit_sub,
            embed_marker,
            count_marker,
            background,
            health_stop,
        } = self;
        let tracker = TaskTracker::new();
        // Also stopped when the request subscriptions end without `shutdown`.
        let stop_probes = shutdown.child_token();
        background.spawn(crate::prober::run(shared.clone(), stop_probes.clone()));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(msg) = cancel_sub.next() => {
                    if let Ok(id) = std::str::from_utf8(&msg.payload).unwrap_or("").parse::<Uuid>()
                        && let Some(tok) = shared.cancels.lock().get(&id)
                    {
                        tok.cancel();
                    }
                }
                Some(msg) = credit_sub.next() => {
                    if let Ok(c) = serde_json::from_slice::<Credit>(&msg.payload)
                        && let Some(tx) = shared.credits.lock().get(&(c.id, c.attempt))
                    {
                        // Grants are cumulative: keep the highest, wake the sender only on a rise.
                        tx.send_if_modified(|upto| {
                            let rise = c.upto > *upto;
                            *upto = (*upto).max(c.upto);
                            rise
                        });
                    }
                }
                msg = requests.next() => {
                    let Some(msg) = msg else { break };
                    // Boxed: a request's future is ~5 KB, which the runtime would otherwise copy
                    // into the task and again when it ends.
                    if msg.subject.contains(embed_marker.as_str()) {
                        tracker.spawn(Box::pin(crate::embed::handle(shared.clone(), msg)));
                    } else if msg.subject.contains(count_marker.as_str()) {
                        tracker.spawn(Box::pin(crate::count::handle(shared.clone(), msg)));
                    } else {
                        tracker.spawn(Box::pin(handle(shared.clone(), msg)));
                    }
                }
            }
        }
        drop(requests);
        stop_probes.cancel();
        tracker.close();
        tracker.wait().await;
        shared.usage_tasks.close();
        shared.usage_tasks.wait().await;
        // The prober's last usage event goes out before the publisher closes; the breakers'
        // last health events before the health publisher stops.
        shared.breakers.close().await;
        health_stop.cancel();
        background.close();
        background.wait().await;
        shared.usage.close().await;
        // TPM corrections of the last requests may still be in a batch.
        shared.limiter.close().await;
    }
}

/// How the upstream calls of one attempt ended.
struct Outcome {
    /// Sum of the usage every call reported (`None` when none did).
    usage: Option<Usage>,
    status: UsageStatus,
    error: Option<ErrorClass>,
    called_upstream: bool,
    ttft_ms: Option<u64>,
    output_chars: usize,
    /// The `end` frame's reason (`None` without one).
    finish_reason: Option<FinishReason>,
    /// `usage` is a provisional report (e.g. Anthropic's `message_start` input counts) of a call
    /// the client abandoned: its output is billed from the text delivered.
    partial_usage: bool,
    /// A batch item's `end` frame, sent only once its `upstream` usage event is stored: a worker
    /// killed between the answer and the publish would otherwise leave a stored result whose
    /// upstream call has no usage record. (Interactive requests do not wait: the client's latency
    /// would pay a JetStream round trip.)
    held_end: Option<FrameBody>,
}

enum Waited<T> {
    Ready(T),
    TimedOut,
    Cancelled,
}

/// Awaits `fut` for at most `limit`, sending heartbeats while waiting (and a held `start` once
/// [`START_HOLD`] passed).
async fn wait_beating<F: std::future::Future>(
    fut: F,
    limit: Duration,
    heartbeat: Duration,
    sink: &mut FrameSink,
    cancel: &CancellationToken,
) -> Waited<F::Output> {
    tokio::pin!(fut);
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Waited::Cancelled,
            r = &mut fut => return Waited::Ready(r),
            _ = tokio::time::sleep_until(deadline) => return Waited::TimedOut,
            _ = tokio::time::sleep(START_HOLD), if sink.start_held => sink.flush().await,
            _ = tokio::time::sleep(heartbeat) => sink.heartbeat().await,
        }
    }
}

/// One request message, in its span ([`crate::spans::worker`]) and with its request id for the
/// upstream's `X-Request-Id` ([`crate::spans::in_request`]).
fn handle(shared: Arc<Shared>, msg: async_nats::Message) -> impl std::future::Future<Output = ()> {
    crate::spans::in_request(msg, |msg| handle_request(shared, msg))
}

async fn handle_request(shared: Arc<Shared>, msg: async_nats::Message) {
    let Some(reply) = msg.reply.clone() else {
        tracing::warn!(subject = %msg.subject, "request without reply subject dropped");
        return;
    };
    let window = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(WINDOW_HEADER))
        .and_then(|v| v.as_str().parse::<u32>().ok());
    let token = CancellationToken::new();
    let mut sink = FrameSink {
        nats: shared.nats.clone(),
        reply,
        seq: 0,
        content_sent: false,
        flow: None,
        cancel: token.clone(),
        halted: None,
        batch: None,
        start_held: false,
    };
    let req: ChatRequest = match serde_json::from_slice(&msg.payload) {
        Ok(r) => r,
        Err(e) => {
            sink.error(ErrorInfo::new(
                ErrorClass::Internal,
                format!("worker cannot decode request: {e}"),
            ))
            .await;
            return;
        }
    };
    let config = shared.opts.config.get();
    let Some(target) = config.target(&req.target.id).cloned() else {
        let msg = format!("target `{}` is not configured on worker", req.target.id);
        sink.error(ErrorInfo::new(ErrorClass::NotFound, msg)).await;
        return;
    };
    // Admission: breaker/cooldown (local), then concurrency, RPM, TPM. Rejected → answered now.
    let permit = match shared.breakers.admit(&config, &target) {
        Ok(p) => p,
        Err(e) => return sink.error(e).await,
    };
    let admission = match shared.limiter.admit(&target, &req).await {
        Ok(a) => a,
        Err(e) => {
            shared
                .opts
                .metrics
                .counter(
                    switchyard_schemas::metrics::REFUSALS,
                    &[("kind", "target_limit")],
                )
                .increment(1);
            drop(permit);
            return sink.error(e).await;
        }
    };
    shared.cancels.lock().insert(req.id, token.clone());
    let flow_key = (req.id, req.attempt);
    if let Some(w) = window {
        let (tx, upto) = watch::channel(w.max(1));
        shared.credits.lock().insert(flow_key, tx);
        sink.flow = Some(Flow {
            upto,
            stall: Duration::from_millis(config.timeouts.stall_ms),
        });
        // An ingress that sends a window also reads coalesced frames; it aggregates a
        // non-streamed answer, so nothing is gained by sending its frames one by one.
        if !req.stream {
            sink.batch = Some(Vec::new());
        }
    }
    sink.send(FrameBody::Start {
        worker: shared.opts.worker_id.clone(),
        target: target.id.clone(),
        upstream_model: target.upstream_model.clone(),
    })
    .await;
    let started = Instant::now();
    let call = Call {
        shared: &shared,
        config: &config,
        target: &target,
        req: &req,
    };
    let mut outcome = call.run(&mut sink, &token, permit).await;
    let (usage, estimated) = final_usage(&req, &outcome);
    let latency_ms = started.elapsed().as_millis() as u64;
    let held_end = outcome.held_end.take();
    // Tracked: a shutdown waits for the publication.
    let published = outcome.called_upstream.then(|| {
        shared.usage_tasks.spawn(publish_usage(
            &shared, &req, &target, &outcome, usage, estimated, latency_ms,
        ))
    });
    // Corrects the TPM charge with what the attempt used; then the concurrency slot is freed.
    shared
        .limiter
        .settle(&admission, usage.total_tokens())
        .await;
    if let Some(end) = held_end {
        // A batch item: `end` once its usage event is stored, with heartbeats meanwhile (a
        // JetStream stall must not look like a dead worker); at the deadline or on a cancel
        // `end` goes anyway (the publication goes on in its task).
        if let Some(published) = published {
            let heartbeat = TargetTimeouts::of(&config, &target).heartbeat;
            let left = Duration::from_millis(req.deadline_ms.saturating_sub(now_ms()));
            let _ = wait_beating(published, left, heartbeat, &mut sink, &token).await;
        }
        sink.send(end).await;
    }
    shared.cancels.lock().remove(&req.id);
    shared.credits.lock().remove(&flow_key);
}

/// Timeouts of one target: the global ones with the target's overrides, ms.
#[derive(Debug, Clone, Copy)]
struct TargetTimeouts {
    heartbeat: Duration,
    connect_ms: u64,
    first_byte: Duration,
    idle: Duration,
    total: Duration,
}

impl TargetTimeouts {
    fn of(config: &GatewayConfig, target: &TargetConfig) -> Self {
        let (g, o) = (&config.timeouts, &target.timeouts);
        Self {
            heartbeat: Duration::from_millis(g.heartbeat_ms),
            connect_ms: o.connect_ms.unwrap_or(g.connect_ms),
            first_byte: Duration::from_millis(o.first_byte_ms.unwrap_or(g.first_byte_ms)),
            idle: Duration::from_millis(o.idle_ms.unwrap_or(g.idle_ms)),
            total: Duration::from_millis(o.total_ms.unwrap_or(g.total_ms)),
        }
    }
}

/// One ingress attempt: the upstream call and its retries.
struct Call<'a> {
    shared: &'a Shared,
    config: &'a Arc<GatewayConfig>,
    target: &'a TargetConfig,
    req: &'a ChatRequest,
}

impl Call<'_> {
    /// Calls the upstream (retrying per `retry`) and forwards its frames; `permit` is the
    /// breaker's permission for the first call.
    async fn run(
        &self,
        sink: &mut FrameSink,
        cancel: &CancellationToken,
        permit: Permit,
    ) -> Outcome {
        let timeouts = TargetTimeouts::of(self.config, self.target);
        let started = Instant::now();
        let left = Duration::from_millis(self.req.deadline_ms.saturating_sub(now_ms()));
        let deadline = started + left.min(timeouts.total);
        let mut out = Outcome {
            usage: None,
            status: UsageStatus::Error,
            error: None,
            called_upstream: false,
            ttft_ms: None,
            output_chars: 0,
            finish_reason: None,
            partial_usage: false,
            held_end: None,
        };
        if left.is_zero() {
            let e = ErrorInfo::new(
                ErrorClass::Timeout,
                "request deadline passed before the upstream call",
            );
            return fail(sink, out, e).await;
        }
        let mut first = Some(permit);
        let mut last_error: Option<ErrorInfo> = None;
        let mut calls = 0u32;
        let mut waited = Duration::ZERO;
        loop {
            let permit = match first.take() {
                Some(p) => p,
                // A retry that cannot be admitted ends with the error it was meant to cure.
                None => match self.readmit().await {
                    Ok(p) => p,
                    Err(e) => return fail(sink, out, last_error.unwrap_or(e)).await,
                },
            };
            calls += 1;
            out.called_upstream = true;
            let call_started = Instant::now();
            let span =
                crate::spans::upstream(self.target, self.req, &base_url(self.shared, self.target));
            let once = self.once(sink, cancel, &timeouts, deadline, started, &mut out);
            let end = tracing::Instrument::instrument(once, span.clone()).await;
            let error = match &end {
                CallEnd::Done => None,
                CallEnd::Failed(e) => Some(e.clone()),
                // A stalled client says nothing about the upstream's health.
                CallEnd::Cancelled | CallEnd::Stalled => {
                    Some(ErrorInfo::new(ErrorClass::Cancelled, ""))
                }
            };
            if let Some(e) = &error {
                switchyard_schemas::trace::fail(&span, e.class.as_str());
            }
            drop(span);
            permit.record(CallResult::of(error.as_ref()), call_started.elapsed());
            let e = match end {
                CallEnd::Done => {
                    out.status = UsageStatus::Ok;
                    return out;
                }
                CallEnd::Cancelled => return cancelled(out),
                CallEnd::Stalled => {
                    let ms = self.config.timeouts.stall_ms;
                    let msg =
                        format!("the client stopped reading: no flow-control credit for {ms} ms");
                    sink.error(ErrorInfo::new(ErrorClass::Cancelled, msg)).await;
                    return cancelled(out);
                }
                CallEnd::Failed(e) => e,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = match crate::retry::decide(
                &self.target.retry,
                calls,
                waited,
                left,
                &e,
                sink.content_sent,
            ) {
                crate::retry::Decision::Retry(wait) => wait,
                crate::retry::Decision::GiveUp => return fail(sink, out, e).await,
            };
            tracing::debug!(request = %self.req.id, target = %self.target.id, error = %e,
                wait_ms = wait.as_millis() as u64, "retrying the upstream call");
            let pause = tokio::time::sleep(wait);
            match wait_beating(pause, wait, timeouts.heartbeat, sink, cancel).await {
                Waited::Cancelled => return cancelled(out),
                Waited::Ready(()) | Waited::TimedOut => {}
            }
            waited += wait;
            self.shared
                .opts
                .metrics
                .counter(
                    switchyard_schemas::metrics::RETRIES,
                    &[("target", &self.target.id)],
                )
                .increment(1);
            last_error = Some(e);
        }
    }

    /// Admission of a retry: the breaker (it may have opened meanwhile) and one RPM token.
    async fn readmit(&self) -> Result<Permit, ErrorInfo> {
        let permit = self.shared.breakers.admit(self.config, self.target)?;
        self.shared
            .limiter
            .take_request(self.target, self.req.batch_id.is_some())
            .await?;
        Ok(permit)
    }

    /// One upstream call: forwards its frames; a failure is returned, not sent.
    async fn once(
        &self,
        sink: &mut FrameSink,
        cancel: &CancellationToken,
        timeouts: &TargetTimeouts,
        deadline: Instant,
        started: Instant,
        out: &mut Outcome,
    ) -> CallEnd {
        let call_started = Instant::now();
        // Time to the first content is bounded from the call's start (headers included).
        let first_deadline = (call_started + timeouts.first_byte).min(deadline);
        let provider = adapter(self.target.provider);
        let http = self.shared.http_for(timeouts.connect_ms);
        let base = base_url(self.shared, self.target);
        let up = Upstream {
            http: &http,
            target: self.target,
            base_url: &base,
        };
        let call = provider.stream_chat(up, self.req);
        let limit = first_deadline.saturating_duration_since(call_started);
        let mut stream: EventStream =
            match wait_beating(call, limit, timeouts.heartbeat, sink, cancel).await {
                Waited::Ready(Ok(s)) => s,
                Waited::Ready(Err(e)) => return CallEnd::Failed(e),
                Waited::TimedOut => return timed_out("upstream response headers"),
                Waited::Cancelled => return CallEnd::Cancelled,
            };
        let mut usage: Option<Usage> = None;
        let mut got_content = false;
        // Per choice, per tool-call index: whether any non-blank argument piece went out (FC-38).
        let mut bare = BareArgs::default();
        let end = loop {
            // The window is used up: stop reading the upstream until ingress grants more.
            if !sink.credit().await {
                break sink.halt_end();
            }
            let now = Instant::now();
            let limit = if got_content {
                timeouts.idle.min(deadline.saturating_duration_since(now))
            } else {
                first_deadline.saturating_duration_since(now)
            };
            match wait_beating(stream.next(), limit, timeouts.heartbeat, sink, cancel).await {
                Waited::Ready(Some(Ok(FrameBody::Usage { usage: u }))) => {
                    // A report before any content is provisional (Anthropic's `message_start`
                    // input counts): ingress gets it now, so a client that leaves mid-stream is
                    // charged from it; later reports go out once, summed, with the end.
                    if !got_content {
                        sink.send(FrameBody::Usage { usage: u }).await;
                    }
                    usage = Some(u);
                }
                Waited::Ready(Some(Ok(end @ FrameBody::End { finish_reason }))) => {
                    out.finish_reason = Some(finish_reason);
                    // FC-38: a tool called without arguments gets `{}`, streamed or not, from
                    // every provider (some stream no argument piece at all, or only "").
                    for frame in bare.flush_all() {
                        sink.send(frame).await;
                    }
                    if let FrameBody::End { finish_reason } = &end {
                        crate::spans::answered(
                            &self.target.upstream_model,
                            usage.as_ref(),
                            *finish_reason,
                        );
                    }
                    add_usage(out, usage.take());
                    if let Some(usage) = out.usage {
                        sink.send(FrameBody::Usage { usage }).await;
                    }
                    if self.req.batch_id.is_some() && sink.halted.is_none() {
                        out.held_end = Some(end);
                        break CallEnd::Done;
                    }
                    sink.send(end).await;
                    if sink.halted.is_some() {
                        break sink.halt_end();
                    }
                    break CallEnd::Done;
                }
                Waited::Ready(Some(Ok(body))) => {
                    if body.is_content() {
                        got_content = true;
                        if out.ttft_ms.is_none() {
                            out.ttft_ms = Some(started.elapsed().as_millis() as u64);
                        }
                    }
                    if let FrameBody::Text { text } = &body {
                        out.output_chars += text.len();
                    }
                    // A choice's bare calls get their `{}` before that choice ends.
                    for frame in bare.observe(&body) {
                        sink.send(frame).await;
                    }
                    sink.send(body).await;
                }
                Waited::Ready(Some(Err(e))) => break CallEnd::Failed(e),
                Waited::Ready(None) => {
                    break CallEnd::Failed(ErrorInfo::new(
                        ErrorClass::Protocol,
                        "upstream stream ended without an end event",
                    ));
                }
                Waited::TimedOut if got_content => break timed_out("next chunk (idle)"),
                Waited::TimedOut => break timed_out("first token"),
                Waited::Cancelled => break CallEnd::Cancelled,
            }
        };
        // A usage report still held here came before the end (the final one went out with it).
        match end {
            // A failed call contributes only a final report (retries sum what was billed).
            CallEnd::Failed(_) => usage = None,
            CallEnd::Cancelled | CallEnd::Stalled => out.partial_usage |= usage.is_some(),
            CallEnd::Done => {}
        }
        add_usage(out, usage);
        end
    }
}

/// FC-38 bookkeeping: per choice and tool-call index, whether a non-blank argument piece went
/// out; a call without one gets an `arguments: "{}"` piece before its choice ends (its
/// `choice_end`, or the attempt's `end`).
#[derive(Debug, Default)]
struct BareArgs {
    /// The choice frames belong to now.
    current: u32,
    /// Per choice: per call index, `Some(had arguments)` once the call was seen.
    calls: std::collections::BTreeMap<u32, Vec<Option<bool>>>,
}

impl BareArgs {
    /// Records `body`; returns the `{}` pieces to send before it (at a `choice_end`).
    fn observe(&mut self, body: &FrameBody) -> Vec<FrameBody> {
        match body {
            FrameBody::Choice { index } => self.current = *index,
            FrameBody::ToolCall {
                index, arguments, ..
            } => {
                let calls = self.calls.entry(self.current).or_default();
                let i = *index as usize;
                if calls.len() <= i {
                    calls.resize(i + 1, None);
                }
                let sent = calls.get(i).copied().flatten().unwrap_or(false);
                if let Some(c) = calls.get_mut(i) {
                    *c = Some(sent || !arguments.trim().is_empty());
                }
            }
            FrameBody::ChoiceEnd { index, .. } => return self.pieces(*index, false),
            _ => {}
        }
        Vec::new()
    }

    /// The `{}` pieces of `choice` (cleared), opened by a `choice` frame when `switch` and the
    /// frames are elsewhere.
    fn pieces(&mut self, choice: u32, switch: bool) -> Vec<FrameBody> {
        let Some(calls) = self.calls.remove(&choice) else {
            return Vec::new();
        };
        let mut out: Vec<FrameBody> = calls
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == Some(false))
            .map(|(index, _)| FrameBody::ToolCall {
                index: index as u32,
                id: None,
                name: None,
                arguments: "{}".into(),
            })
            .collect();
        if switch && !out.is_empty() && choice != self.current {
            self.current = choice;
            out.insert(0, FrameBody::Choice { index: choice });
        }
        out
    }

    /// The `{}` pieces of every choice not ended yet (at the attempt's `end`).
    fn flush_all(&mut self) -> Vec<FrameBody> {
        let choices: Vec<u32> = self.calls.keys().copied().collect();
        choices
            .into_iter()
            .flat_map(|c| self.pieces(c, true))
            .collect()
    }
}

fn add_usage(out: &mut Outcome, usage: Option<Usage>) {
    let Some(u) = usage else { return };
    let sum = out.usage.get_or_insert_with(Usage::default);
    sum.prompt_tokens = sum.prompt_tokens.saturating_add(u.prompt_tokens);
    sum.cached_tokens = sum.cached_tokens.saturating_add(u.cached_tokens);
    sum.cache_write_tokens = sum.cache_write_tokens.saturating_add(u.cache_write_tokens);
    sum.completion_tokens = sum.completion_tokens.saturating_add(u.completion_tokens);
    sum.reasoning_tokens = sum.reasoning_tokens.saturating_add(u.reasoning_tokens);
    sum.cache_write_1h_tokens = sum
        .cache_write_1h_tokens
        .saturating_add(u.cache_write_1h_tokens);
    sum.audio_input_tokens = sum.audio_input_tokens.saturating_add(u.audio_input_tokens);
    sum.audio_output_tokens = sum
        .audio_output_tokens
        .saturating_add(u.audio_output_tokens);
    sum.service_tier = sum.service_tier.or(u.service_tier);
}

fn timed_out(what: &str) -> CallEnd {
    CallEnd::Failed(ErrorInfo::new(
        ErrorClass::Timeout,
        format!("timed out waiting for {what}"),
    ))
}

/// Sends the attempt's final error frame.
async fn fail(sink: &mut FrameSink, mut out: Outcome, e: ErrorInfo) -> Outcome {
    out.error = Some(e.class);
    sink.error(e).await;
    out
}

fn cancelled(mut out: Outcome) -> Outcome {
    // The client is gone: nobody reads further frames. Dropping the stream aborts the HTTP call.
    out.status = UsageStatus::Cancelled;
    out.error = Some(ErrorClass::Cancelled);
    out
}

/// A rough token estimate (4 bytes per token) for calls aborted before the upstream reported usage.
fn estimate_tokens(bytes: usize) -> u64 {
    bytes.div_ceil(4) as u64
}

/// The attempt's usage as billed: the sum the upstream reported; for a call the client abandoned
/// after a provisional report, that report's input counts and the larger of its output count
/// and the delivered text's estimate; or an estimate from the text seen when it was aborted
/// before reporting (second value: whether an estimate was used).
fn final_usage(req: &ChatRequest, o: &Outcome) -> (Usage, bool) {
    match o.usage {
        Some(mut u) if o.partial_usage => {
            let delivered = estimate_tokens(o.output_chars);
            let estimated = delivered > u.completion_tokens;
            u.completion_tokens = u.completion_tokens.max(delivered);
            (u, estimated)
        }
        Some(u) => (u, false),
        None if o.output_chars > 0 => (
            Usage {
                prompt_tokens: estimate_tokens(req.prompt_text().len()),
                completion_tokens: estimate_tokens(o.output_chars),
                ..Usage::default()
            },
            true,
        ),
        None => (Usage::default(), false),
    }
}

/// The attempt's `upstream` usage event, as a future that returns once it is stored or spooled.
fn publish_usage(
    shared: &Arc<Shared>,
    req: &ChatRequest,
    target: &TargetConfig,
    o: &Outcome,
    usage: Usage,
    estimated: bool,
    latency_ms: u64,
) -> futures::future::BoxFuture<'static, ()> {
    let event = UsageEvent {
        attempt: req.attempt,
        tenant: req.tenant.clone(),
        key_id: req.key_id.clone(),
        target: Some(target.id.clone()),
        upstream_model: Some(target.upstream_model.clone()),
        usage,
        estimated,
        status: o.status,
        error_class: o.error,
        ttft_ms: o.ttft_ms,
        latency_ms,
        batch_id: req.batch_id.clone(),
        finish_reason: o.finish_reason,
        ..UsageEvent::new(req.id, UsageKind::Upstream, now_ms(), req.model.clone())
    };
    let usage = shared.usage.clone();
    Box::pin(async move {
        usage.publish(event).await;
    })
}
