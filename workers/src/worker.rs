//! The worker loop: one queue subscription per served provider, one task per request.
//!
//! For each request the worker sends, on the request's reply subject, `start`, the adapter's
//! normalised events, one `usage`, and `end` or `error` — numbered by `seq`. While the upstream is
//! silent it sends `heartbeat` every `timeouts.heartbeat_ms`, so ingress can tell a dead worker from
//! a slow model. A message on `<prefix>.cancel.<worker-id>` naming the request aborts the upstream
//! call. Every upstream call leaves exactly one `upstream` usage event on JetStream (deduplicated by
//! `Nats-Msg-Id`), estimated from text length when the upstream was aborted before reporting.

use crate::provider::{EventStream, Provider};
use crate::providers::openai::OpenAiProvider;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::config::{
    BUILTIN_LOCAL_MODEL_URL, BUILTIN_MOCK_URL, ConfigHandle, ProviderKind, TargetConfig,
};
use switchyard_schemas::publish::publish_usage_event;
use switchyard_schemas::subjects::{CAP_CHAT, CAP_EMBED, Subjects};
use switchyard_schemas::usage::UsageStatus;
use switchyard_schemas::{
    ChatRequest, ErrorClass, ErrorInfo, Frame, FrameBody, Usage, UsageEvent, UsageKind, now_ms,
};
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

/// What a worker process serves and how.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Unique id of this worker process (appears in `start` frames and its cancel subject).
    pub worker_id: String,
    /// Subject names.
    pub subjects: Subjects,
    /// The live gateway config (targets and timeouts); each request uses one snapshot.
    pub config: ConfigHandle,
    /// Providers whose queue groups this worker joins; empty = every provider with a target.
    pub providers: Vec<ProviderKind>,
    /// Resolved address of the built-in mock upstream (`builtin:mock` targets), e.g. `http://127.0.0.1:9000/v1`.
    pub builtin_mock_url: Option<String>,
    /// Resolved address of the local model server (`builtin:local-model` targets), e.g.
    /// `http://127.0.0.1:9001/v1`.
    pub builtin_local_model_url: Option<String>,
}

/// Returns the adapter for a provider family.
pub fn adapter(kind: ProviderKind) -> Arc<dyn Provider> {
    match kind {
        ProviderKind::Openai => Arc::new(OpenAiProvider::openai()),
        ProviderKind::OpenaiCompatible => Arc::new(OpenAiProvider::compatible()),
        ProviderKind::Anthropic => Arc::new(crate::providers::anthropic::AnthropicProvider),
        ProviderKind::Gemini => Arc::new(crate::providers::gemini::GeminiProvider),
        ProviderKind::AzureOpenai => Arc::new(crate::providers::azure::AzureOpenAiProvider),
        ProviderKind::Bedrock => Arc::new(crate::providers::bedrock::BedrockProvider),
    }
}

/// What every request task of one worker shares.
pub(crate) struct Shared {
    pub(crate) nats: async_nats::Client,
    pub(crate) js: async_nats::jetstream::Context,
    pub(crate) opts: WorkerOptions,
    pub(crate) http: reqwest::Client,
    cancels: Mutex<HashMap<Uuid, CancellationToken>>,
}

/// A worker whose queue subscriptions are registered with the server (so a request published
/// after [`Worker::subscribe`] returns reaches it), ready to [`Worker::serve`].
pub struct Worker {
    shared: Arc<Shared>,
    requests: futures::stream::SelectAll<async_nats::Subscriber>,
    cancel_sub: async_nats::Subscriber,
    /// `.req.embed.`: tells embeddings requests from chat ones by subject.
    embed_marker: String,
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
        let t = &config.timeouts;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(t.connect_ms))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()?;
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
        }
        let embed_marker = format!(".req.{CAP_EMBED}.");
        let cancel_sub = nats
            .subscribe(opts.subjects.cancel(&opts.worker_id))
            .await?;
        if !switchyard_schemas::publish::sync_with_server(&nats).await {
            tracing::warn!("could not confirm the worker's subscriptions with the NATS server");
        }
        tracing::info!(worker = %opts.worker_id, providers = ?kinds, "worker serving");
        let shared = Arc::new(Shared {
            js: async_nats::jetstream::new(nats.clone()),
            nats,
            opts,
            http,
            cancels: Mutex::new(HashMap::new()),
        });
        Ok(Self {
            shared,
            requests: futures::stream::select_all(subs),
            cancel_sub,
            embed_marker,
        })
    }

    /// Serves until `shutdown` fires, then stops taking requests (other workers in the queue group
    /// get them) and waits for in-flight ones to finish.
    pub async fn serve(self, shutdown: CancellationToken) {
        let Self {
            shared,
            mut requests,
            mut cancel_sub,
            embed_marker,
        } = self;
        let tracker = TaskTracker::new();
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
                msg = requests.next() => {
                    let Some(msg) = msg else { break };
                    if msg.subject.contains(embed_marker.as_str()) {
                        tracker.spawn(crate::embed::handle(shared.clone(), msg));
                    } else {
                        tracker.spawn(handle(shared.clone(), msg));
                    }
                }
            }
        }
        drop(requests);
        tracker.close();
        tracker.wait().await;
    }
}

/// Publishes frames with increasing `seq` on one reply subject.
struct FrameSink {
    nats: async_nats::Client,
    reply: async_nats::Subject,
    seq: u32,
    content_sent: bool,
}

impl FrameSink {
    async fn send(&mut self, body: FrameBody) {
        self.content_sent |= body.is_content();
        let frame = Frame {
            seq: self.seq,
            body,
        };
        self.seq += 1;
        match serde_json::to_vec(&frame) {
            Ok(bytes) => {
                if let Err(e) = self.nats.publish(self.reply.clone(), bytes.into()).await {
                    tracing::warn!(error = %e, "publishing frame failed");
                }
            }
            Err(e) => tracing::error!(error = %e, "encoding frame failed"),
        }
    }

    async fn error(&mut self, error: ErrorInfo) {
        let content_sent = self.content_sent;
        self.send(FrameBody::Error {
            error,
            content_sent,
        })
        .await;
    }
}

/// How one upstream call ended.
struct Outcome {
    usage: Option<Usage>,
    status: UsageStatus,
    error: Option<ErrorClass>,
    called_upstream: bool,
    ttft_ms: Option<u64>,
    output_chars: usize,
}

enum Waited<T> {
    Ready(T),
    TimedOut,
    Cancelled,
}

/// Awaits `fut` for at most `limit`, sending heartbeats while waiting.
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
            _ = tokio::time::sleep(heartbeat) => sink.send(FrameBody::Heartbeat).await,
        }
    }
}

async fn handle(shared: Arc<Shared>, msg: async_nats::Message) {
    let Some(reply) = msg.reply.clone() else {
        tracing::warn!(subject = %msg.subject, "request without reply subject dropped");
        return;
    };
    let mut sink = FrameSink {
        nats: shared.nats.clone(),
        reply,
        seq: 0,
        content_sent: false,
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
    let token = CancellationToken::new();
    shared.cancels.lock().insert(req.id, token.clone());
    sink.send(FrameBody::Start {
        worker: shared.opts.worker_id.clone(),
        target: target.id.clone(),
        upstream_model: target.upstream_model.clone(),
    })
    .await;
    let started = Instant::now();
    let outcome = call_upstream(&shared, &target, &req, &mut sink, &token).await;
    shared.cancels.lock().remove(&req.id);
    if outcome.called_upstream {
        publish_usage(
            &shared,
            &req,
            &target,
            outcome,
            started.elapsed().as_millis() as u64,
        );
    }
}

/// The target's base URL, with `builtin:` addresses resolved.
pub(crate) fn base_url(shared: &Shared, target: &TargetConfig) -> String {
    if target.base_url == BUILTIN_MOCK_URL {
        shared.opts.builtin_mock_url.clone().unwrap_or_default()
    } else if target.base_url == BUILTIN_LOCAL_MODEL_URL {
        shared
            .opts
            .builtin_local_model_url
            .clone()
            .unwrap_or_default()
    } else {
        target.base_url.clone()
    }
}

async fn call_upstream(
    shared: &Shared,
    target: &TargetConfig,
    req: &ChatRequest,
    sink: &mut FrameSink,
    cancel: &CancellationToken,
) -> Outcome {
    let config = shared.opts.config.get();
    let t = &config.timeouts;
    let hb = Duration::from_millis(t.heartbeat_ms);
    let started = Instant::now();
    let remaining = Duration::from_millis(req.deadline_ms.saturating_sub(now_ms()));
    let mut out = Outcome {
        usage: None,
        status: UsageStatus::Error,
        error: None,
        called_upstream: false,
        ttft_ms: None,
        output_chars: 0,
    };
    if remaining.is_zero() {
        out.error = Some(ErrorClass::Timeout);
        sink.error(ErrorInfo::new(
            ErrorClass::Timeout,
            "request deadline passed before the upstream call",
        ))
        .await;
        return out;
    }
    let provider = adapter(target.provider);
    out.called_upstream = true;
    let call = provider.stream_chat(&shared.http, target, &base_url(shared, target), req);
    let first_limit = Duration::from_millis(t.first_byte_ms).min(remaining);
    let mut stream: EventStream = match wait_beating(call, first_limit, hb, sink, cancel).await {
        Waited::Ready(Ok(s)) => s,
        Waited::Ready(Err(e)) => {
            out.error = Some(e.class);
            sink.error(e).await;
            return out;
        }
        Waited::TimedOut => return timed_out(sink, out, "upstream response headers").await,
        Waited::Cancelled => return cancelled(out),
    };
    let deadline = Instant::now() + remaining.saturating_sub(started.elapsed());
    loop {
        let gap = if out.ttft_ms.is_none() {
            t.first_byte_ms
        } else {
            t.idle_ms
        };
        let limit =
            Duration::from_millis(gap).min(deadline.saturating_duration_since(Instant::now()));
        match wait_beating(stream.next(), limit, hb, sink, cancel).await {
            Waited::Ready(Some(Ok(FrameBody::Usage { usage }))) => out.usage = Some(usage),
            Waited::Ready(Some(Ok(end @ FrameBody::End { .. }))) => {
                if let Some(usage) = out.usage {
                    sink.send(FrameBody::Usage { usage }).await;
                }
                sink.send(end).await;
                out.status = UsageStatus::Ok;
                return out;
            }
            Waited::Ready(Some(Ok(body))) => {
                if body.is_content() && out.ttft_ms.is_none() {
                    out.ttft_ms = Some(started.elapsed().as_millis() as u64);
                }
                if let FrameBody::Text { text } = &body {
                    out.output_chars += text.len();
                }
                sink.send(body).await;
            }
            Waited::Ready(Some(Err(e))) => {
                out.error = Some(e.class);
                sink.error(e).await;
                return out;
            }
            Waited::Ready(None) => {
                let e = ErrorInfo::new(
                    ErrorClass::Protocol,
                    "upstream stream ended without an end event",
                );
                out.error = Some(e.class);
                sink.error(e).await;
                return out;
            }
            Waited::TimedOut => {
                let what = if out.ttft_ms.is_none() {
                    "first token"
                } else {
                    "next chunk (idle)"
                };
                return timed_out(sink, out, what).await;
            }
            Waited::Cancelled => return cancelled(out),
        }
    }
}

async fn timed_out(sink: &mut FrameSink, mut out: Outcome, what: &str) -> Outcome {
    out.error = Some(ErrorClass::Timeout);
    sink.error(ErrorInfo::new(
        ErrorClass::Timeout,
        format!("timed out waiting for {what}"),
    ))
    .await;
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

fn publish_usage(
    shared: &Arc<Shared>,
    req: &ChatRequest,
    target: &TargetConfig,
    o: Outcome,
    latency_ms: u64,
) {
    let estimated = o.usage.is_none() && o.output_chars > 0;
    let usage = o.usage.unwrap_or_else(|| {
        if o.output_chars > 0 {
            Usage {
                prompt_tokens: estimate_tokens(req.prompt_text().len()),
                completion_tokens: estimate_tokens(o.output_chars),
                ..Usage::default()
            }
        } else {
            Usage::default()
        }
    });
    let event = UsageEvent {
        request_id: req.id,
        kind: UsageKind::Upstream,
        attempt: req.attempt,
        ts_ms: now_ms(),
        tenant: req.tenant.clone(),
        key_id: req.key_id.clone(),
        model: req.model.clone(),
        target: Some(target.id.clone()),
        upstream_model: Some(target.upstream_model.clone()),
        usage,
        estimated,
        status: o.status,
        error_class: o.error,
        ttft_ms: o.ttft_ms,
        latency_ms,
        fallbacks: 0,
        cache_hit: false,
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        publish_usage_event(&shared.js, &shared.opts.subjects, &event).await;
    });
}
