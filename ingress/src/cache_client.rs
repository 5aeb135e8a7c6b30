//! The cache hook of the front doors: ask the cache service before routing, serve a hit without
//! an upstream call, and store a complete answer after a miss.
//!
//! * **Lookup** — `<prefix>.cache.lookup` request/reply with a tight timeout
//!   ([`DEFAULT_TIMEOUT_MS`]); no answer in time, no cache instance, or any error is a `bypass`:
//!   the cache can slow a request by at most the timeout and never fail it.
//! * **Store** — after a successful, complete answer (finish `stop`, `length` or `tool_calls`, no
//!   error frame) ingress publishes the answer on `<prefix>.cache.store`, fire-and-forget; the
//!   stores of [`STORE_LINGER_MS`] go out as one message (a JSON array), and a lookup that must
//!   ask the service first sends what is queued, so it follows its own ingress's stores.
//! * **Client control** — `Cache-Control: no-cache` skips the lookup (the fresh answer is still
//!   stored), `no-store` skips the store, `x-switchyard-cache-ttl: <seconds>` sets the stored
//!   answer's time to live; a route opts out with `cache: {enabled: false}` in the config.
//! * **Response headers** — `x-switchyard-cache: hit | semantic-hit | miss | bypass` and, on
//!   semantic hits, `x-switchyard-cache-similarity`.
//! * **Serving a hit** — a new request id; the stored answer is replayed as frames
//!   ([`replay_frames`]: the original text pieces, tool calls, usage, end) through the front
//!   door's own encoder ([`crate::front_door`]), so a hit is byte-for-byte the shape of a live
//!   answer (OpenAI: role chunk … `[DONE]`; Anthropic: `message_start` … `message_stop`). No upstream call happens, so
//!   no `upstream` usage event; the `charge` event carries `cache_hit: true` and the original
//!   usage (see [`crate::charge::Charge::cache_hit`]).

use crate::AppState;
use crate::charge::Charge;
use crate::context::RequestContext;
use crate::route::{self, Aggregate, Inbound, Served};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use switchyard_schemas::cache::{
    CacheKey, CacheOutcome, CachedAnswer, CachedToolCall, DEFAULT_TTL_S, HEADER_CACHE,
    HEADER_SIMILARITY, HEADER_TTL, LookupReply, LookupRequest, RouteCache, StoreRequest,
};
use switchyard_schemas::{FinishReason, FrameBody, Usage};
use uuid::Uuid;

/// Default lookup timeout, ms (`SWITCHYARD_CACHE_TIMEOUT_MS` overrides it).
pub const DEFAULT_TIMEOUT_MS: u64 = 50;

/// Longest a store of this ingress lives in its own replica before the cache service's copy
/// (delivered by the KV watch, with the full TTL) replaces it, seconds.
pub const LOCAL_TTL_S: u64 = 60;

/// How long a store waits for others to share its message, ms. One message per answer was a
/// sixth of the request path's NATS messages at 1,000 requests/s (docs/BENCHMARKS.md, "Fewer
/// messages per request"); other ingresses see a store this much later (its own ingress at once,
/// through the key set or replica and the flush before a lookup).
pub const STORE_LINGER_MS: u64 = 5;
/// Most stores in one message.
const STORE_BATCH: usize = 64;
/// Most bytes of stores in one message (a store carries its whole prompt, up to the server's
/// `max_payload` itself): a larger store goes alone, as before batching.
const STORE_BATCH_BYTES: usize = 256 * 1024;

/// This ingress's stores waiting to go out together, each already encoded.
#[derive(Default)]
struct StoreQueue {
    stores: Vec<Vec<u8>>,
    bytes: usize,
}

/// The cache client of one ingress process.
#[derive(Default)]
pub struct CacheClient {
    /// Stores waiting to go out together.
    stores: parking_lot::Mutex<StoreQueue>,
    /// Held from taking the queued stores until they are handed to the connection, so a lookup
    /// that flushes first cannot overtake a batch another task took a moment earlier.
    sending: tokio::sync::Mutex<()>,
    timeout_ms: Timeout,
    /// The exact-layer replica (`cache_replica` in the config), when on.
    replica: Option<Arc<switchyard_cache::Service>>,
    /// The stored exact keys (`cache_replica.key_set`, when the replica is off).
    key_set: Option<Arc<switchyard_cache::key_set::KeySet>>,
}

impl std::fmt::Debug for CacheClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheClient")
            .field("timeout_ms", &self.timeout_ms.0)
            .field("replica", &self.replica.as_ref().map(|r| r.len()))
            .field("key_set", &self.key_set.as_ref().map(|k| k.len()))
            .finish()
    }
}

#[derive(Debug)]
struct Timeout(AtomicU64);

impl Default for Timeout {
    fn default() -> Self {
        let ms = std::env::var("SWITCHYARD_CACHE_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_TIMEOUT_MS);
        Self(AtomicU64::new(ms))
    }
}

impl CacheClient {
    /// A client that answers from `replica` what it can (see [`CacheClient::local`]).
    pub fn with_replica(replica: Option<Arc<switchyard_cache::Service>>) -> Self {
        Self {
            replica,
            ..Self::default()
        }
    }

    /// The client of `config`: with the exact-layer replica when `cache_replica.enabled`, else
    /// with the key set unless `cache_replica.key_set: false`. Either is rebuilt from the KV
    /// bucket before this returns; its feed is a task on `tasks` that ends when `stop` is
    /// cancelled. One that cannot be started is left out (then every lookup asks the service).
    pub async fn start(
        nats: &async_nats::Client,
        config: &switchyard_schemas::config::GatewayConfig,
        subjects: &switchyard_schemas::subjects::Subjects,
        tasks: &tokio_util::task::TaskTracker,
        stop: tokio_util::sync::CancellationToken,
    ) -> Self {
        let settings = &config.cache_replica;
        if settings.enabled {
            return Self::with_replica(
                Self::start_replica(nats, config, subjects, tasks, stop).await,
            );
        }
        if !settings.key_set {
            return Self::default();
        }
        let max_ttl_s = switchyard_cache::ServiceOptions::new(subjects.clone(), None).max_ttl_s;
        let bucket = switchyard_cache::BUCKET;
        match switchyard_cache::key_set::start(nats.clone(), bucket, max_ttl_s, stop, tasks).await {
            Ok(k) => {
                tracing::info!(keys = k.len(), "cache key set rebuilt from KV");
                Self {
                    key_set: Some(k),
                    ..Self::default()
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cache key set unavailable; every lookup asks the cache service");
                Self::default()
            }
        }
    }

    async fn start_replica(
        nats: &async_nats::Client,
        config: &switchyard_schemas::config::GatewayConfig,
        subjects: &switchyard_schemas::subjects::Subjects,
        tasks: &tokio_util::task::TaskTracker,
        stop: tokio_util::sync::CancellationToken,
    ) -> Option<Arc<switchyard_cache::Service>> {
        let settings = &config.cache_replica;
        let opts = switchyard_cache::ServiceOptions {
            max_entries: settings.max_entries,
            ..switchyard_cache::ServiceOptions::new(subjects.clone(), None)
        };
        match switchyard_cache::replica(nats.clone(), opts, stop, tasks).await {
            Ok(r) => {
                tracing::info!(entries = r.len(), "cache replica rebuilt from KV");
                Some(r)
            }
            Err(e) => {
                tracing::error!(error = %e, "cache replica unavailable; every lookup asks the cache service");
                None
            }
        }
    }

    /// The replica's answer to `req`, when it may give it: any answer on an exact-only route,
    /// and on a semantic route anything but an exact miss (that one the semantic layer of the
    /// cache service may still answer). Without a replica, the key set's miss of an exact-only
    /// route whose key (`exact`, when computed) no cache instance holds.
    pub fn local(&self, req: &LookupRequest, exact: Option<&str>) -> Option<LookupReply> {
        if let Some(r) = &self.replica {
            let reply = r.lookup_exact(req).ok()?;
            return (!req.semantic || reply.outcome != CacheOutcome::Miss).then_some(reply);
        }
        let held = self.key_set.as_ref()?.contains(exact?)?;
        (!req.semantic && !held)
            .then(|| LookupReply::empty(CacheOutcome::Miss, "exact miss (key set)"))
    }

    /// The exact key of `key` when the key set may answer its lookups (an exact-only route) or
    /// must learn its store; `None` otherwise (no key set, or not encodable: then the service
    /// decides, as without a key set).
    fn exact_key(&self, key: &CacheKey, semantic: bool) -> Option<String> {
        if semantic || self.key_set.is_none() {
            return None;
        }
        switchyard_cache::canon::exact_key(key).ok()
    }

    /// Adds a store of this process to its replica at once (read-your-writes on one ingress;
    /// the cache service's copy replaces it when the KV watch delivers it). The local copy lives
    /// at most [`LOCAL_TTL_S`]: one the service never stores (it was down, or the answer was too
    /// large for KV) does not outlive a purge for long.
    fn remember(&self, req: &StoreRequest, exact: Option<&str>) {
        if let (Some(k), Some(exact)) = (&self.key_set, exact) {
            k.insert(exact);
        }
        if let Some(r) = &self.replica {
            let mut local = req.clone();
            local.ttl_s = local.ttl_s.min(LOCAL_TTL_S);
            if let Some(entry) = r.prepare(&local) {
                r.apply(entry);
            }
        }
    }

    /// Queues `req` for the cache service: it goes out with the others queued within
    /// [`STORE_LINGER_MS`] (at once when [`STORE_BATCH`] are queued), from a task on `app.tasks`
    /// (a shutdown waits for it).
    fn queue_store(app: &Arc<AppState>, req: &StoreRequest) {
        let Ok(body) = serde_json::to_vec(req) else {
            tracing::debug!("cache store not encodable");
            return;
        };
        let (first, full) = {
            let mut q = app.cache.stores.lock();
            q.bytes += body.len();
            q.stores.push(body);
            (
                q.stores.len() == 1,
                q.stores.len() >= STORE_BATCH || q.bytes >= STORE_BATCH_BYTES,
            )
        };
        if !first && !full {
            return;
        }
        let app = app.clone();
        app.tasks.clone().spawn(async move {
            if !full {
                tokio::time::sleep(Duration::from_millis(STORE_LINGER_MS)).await;
            }
            app.cache.flush_stores(&app).await;
        });
    }

    /// Publishes the queued stores, if any: a JSON array of at most [`STORE_BATCH_BYTES`] per
    /// message (a lone or larger store as itself).
    async fn flush_stores(&self, app: &AppState) {
        let _sending = self.sending.lock().await;
        let queued = std::mem::take(&mut *self.stores.lock());
        for body in store_messages(queued.stores) {
            if let Err(e) = app
                .nats
                .publish(app.subjects.cache_store(), body.into())
                .await
            {
                tracing::debug!(error = %e, "cache store not published");
            }
        }
    }

    /// The lookup timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.0.load(Ordering::Relaxed))
    }

    /// Changes the lookup timeout.
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .0
            .store(timeout.as_millis() as u64, Ordering::Relaxed);
    }
}

/// The client's cache directives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Directives {
    /// `Cache-Control: no-cache`: do not answer from the cache.
    pub no_cache: bool,
    /// `Cache-Control: no-store`: do not store the answer.
    pub no_store: bool,
    /// `x-switchyard-cache-ttl`: seconds.
    pub ttl_s: Option<u64>,
}

impl Directives {
    /// Reads `Cache-Control` and `x-switchyard-cache-ttl`.
    pub fn from_headers(h: &HeaderMap) -> Self {
        let mut d = Self::default();
        for v in h.get_all(axum::http::header::CACHE_CONTROL) {
            for part in v.to_str().unwrap_or("").split(',') {
                match part.trim().to_ascii_lowercase().as_str() {
                    "no-cache" => d.no_cache = true,
                    "no-store" => d.no_store = true,
                    _ => {}
                }
            }
        }
        d.ttl_s = h
            .get(HEADER_TTL)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        d
    }
}

/// What the cache said about one request.
pub struct Check {
    /// The header value.
    pub outcome: CacheOutcome,
    /// Similarity of a semantic hit.
    pub similarity: Option<f32>,
    /// The stored answer, on a hit.
    pub answer: Option<CachedAnswer>,
    /// The routed model id.
    route: String,
    /// The route caches answers (else the audit outcome is `off`).
    caches: bool,
    /// Where a fresh answer is stored, when it may be: the key, TTL (s) and whether the route
    /// is semantic.
    store: Option<(CacheKey, u64, bool)>,
    /// The exact key, when the key set is consulted ([`CacheClient::local`]).
    exact: Option<String>,
    admitted: Instant,
    prompt_bytes: usize,
}

impl Check {
    fn bypass(admitted: Instant, caches: bool) -> Self {
        Self {
            outcome: CacheOutcome::Bypass,
            similarity: None,
            answer: None,
            route: String::new(),
            caches,
            store: None,
            exact: None,
            admitted,
            prompt_bytes: 0,
        }
    }

    /// The audit log's cache outcome
    /// ([`switchyard_schemas::audit::CACHE_OUTCOMES`]): the lookup's, or `off` for a route
    /// without cache.
    pub fn audit_outcome(&self) -> &'static str {
        if self.caches {
            self.outcome.as_str()
        } else {
            "off"
        }
    }

    /// Whether the request is answered from the cache.
    pub fn is_hit(&self) -> bool {
        self.answer.is_some()
    }

    /// On a hit: publishes its `charge` event (a new request id, no upstream call) and returns
    /// that id with the stored answer.
    pub fn hit(&self, app: &Arc<AppState>, ctx: &RequestContext) -> Option<(Uuid, &CachedAnswer)> {
        let answer = self.answer.as_ref()?;
        Some((charge_hit(app, ctx, self, answer.usage), answer))
    }

    /// Adds `x-switchyard-cache` (and the similarity on semantic hits).
    pub fn apply_headers(&self, resp: &mut Response) {
        let h = resp.headers_mut();
        h.insert(
            HEADER_CACHE,
            HeaderValue::from_static(self.outcome.as_str()),
        );
        if let Some(s) = self.similarity
            && let Ok(v) = HeaderValue::from_str(&format!("{s:.4}"))
        {
            h.insert(HEADER_SIMILARITY, v);
        }
    }

    /// A recorder that stores the answer of the routed request once it completes (`None` when
    /// storing is off for this request).
    pub fn capture(&self, app: &Arc<AppState>, served: &Served) -> Option<Capture> {
        let (key, ttl_s, semantic) = self.store.clone()?;
        let upstream_model = app
            .config
            .get()
            .target(&served.target)
            .map(|t| t.upstream_model.clone());
        Some(Capture {
            app: app.clone(),
            key,
            exact: self.exact.clone(),
            ttl_s,
            semantic,
            target: served.target.clone(),
            upstream_model,
            answer: CachedAnswer {
                chunks: Vec::new(),
                tool_calls: Vec::new(),
                finish_reason: FinishReason::Stop,
                usage: Usage::default(),
            },
            failed: false,
        })
    }
}

/// Passthrough fields that only mirror the normalised request (`system`, `tools`, `metadata`)
/// or are caching hints (`cache_control`); any other (`thinking`, `output_config`, `logit_bias`,
/// …) may change the answer and is not part of the cache key, so such a request bypasses the
/// cache.
const NEUTRAL_PASSTHROUGH: &[&str] = &["system", "tools", "metadata", "cache_control"];

fn shapes_answer(inbound: &Inbound) -> bool {
    inbound
        .passthrough
        .values()
        .flat_map(|p| p.body.keys())
        .any(|k| !NEUTRAL_PASSTHROUGH.contains(&k.as_str()))
}

/// Asks the cache about `inbound` (a `bypass` when the route opts out, the client said
/// `no-cache`, `n` > 1, a provider passthrough field may shape the answer, or the cache does not
/// answer within the timeout).
pub async fn check(
    app: &Arc<AppState>,
    ctx: &RequestContext,
    headers: &HeaderMap,
    inbound: &Inbound,
) -> Check {
    let admitted = Instant::now();
    let directives = Directives::from_headers(headers);
    let config = app.config.get();
    let Ok(model) = route::routed_model(&config, &inbound.model, &ctx.hints) else {
        return Check::bypass(admitted, false);
    };
    let settings = model.cache.clone().unwrap_or_default();
    if !settings.enabled {
        return Check::bypass(admitted, false);
    }
    if inbound.params.n.is_some_and(|n| n > 1) || shapes_answer(inbound) {
        return Check::bypass(admitted, true);
    }
    let key = CacheKey {
        route: model.id.clone(),
        messages: inbound.messages.clone(),
        tools: inbound.tools.clone(),
        tool_choice: inbound.tool_choice.clone(),
        params: inbound.params.clone(),
        tenant: ctx.caller.tenant.clone(),
    };
    let ttl_s = directives.ttl_s.or(settings.ttl_s).unwrap_or(DEFAULT_TTL_S);
    let prompt_bytes = key
        .messages
        .iter()
        .filter_map(|m| m.content.as_ref().map(|c| c.text().len()))
        .sum();
    let mut check = Check {
        outcome: CacheOutcome::Bypass,
        similarity: None,
        answer: None,
        route: model.id.clone(),
        caches: true,
        store: (!directives.no_store && ttl_s > 0).then(|| (key.clone(), ttl_s, settings.semantic)),
        exact: app.cache.exact_key(&key, settings.semantic),
        admitted,
        prompt_bytes,
    };
    if directives.no_cache {
        return check;
    }
    let reply = lookup(app, ctx, key, check.exact.as_deref(), &settings).await;
    check.outcome = reply.outcome;
    if matches!(reply.outcome, CacheOutcome::Hit | CacheOutcome::SemanticHit) {
        match reply.answer {
            Some(a) => {
                check.answer = Some(a);
                check.similarity = reply.similarity;
            }
            None => check.outcome = CacheOutcome::Miss,
        }
    }
    if let Some(r) = &reply.reason {
        tracing::debug!(outcome = check.outcome.as_str(), reason = %r, "cache lookup");
    }
    check
}

async fn lookup(
    app: &AppState,
    ctx: &RequestContext,
    key: CacheKey,
    exact: Option<&str>,
    settings: &RouteCache,
) -> LookupReply {
    let req = LookupRequest {
        key,
        semantic: settings.semantic,
        threshold: settings.threshold(),
    };
    // Answered by this process's replica or key set: no round trip (same reply, so same headers
    // and metrics).
    if let Some(reply) = app.cache.local(&req, exact) {
        return reply;
    }
    let Ok(body) = serde_json::to_vec(&req) else {
        return LookupReply::empty(CacheOutcome::Bypass, "unserialisable request");
    };
    let timeout = app.cache.timeout();
    let deadline = tokio::time::Instant::now() + timeout;
    // The service sees this ingress's queued stores before the lookup (one connection keeps
    // the order), so a repeat of an answer just given finds it. Within the lookup's deadline:
    // a connection that takes no messages (NATS away, its buffer full) must not hold the
    // request longer than a lookup could.
    let _ = tokio::time::timeout_at(deadline, app.cache.flush_stores(app)).await;
    let span = crate::spans::client("switchyard.cache.lookup");
    let mut headers = async_nats::HeaderMap::new();
    // A batch item's lookup carries no request id (it has no HTTP request).
    if ctx.batch.is_none() {
        let shown = ctx.shown_request_id(ctx.gateway_id);
        span.in_scope(|| crate::spans::nats_headers(&mut headers, &shown));
    }
    let asked = app
        .nats
        .request_with_headers(app.subjects.cache_lookup(), headers, body.into());
    let reply = match tracing::Instrument::instrument(
        tokio::time::timeout_at(deadline, asked),
        span.clone(),
    )
    .await
    {
        Ok(Ok(msg)) => serde_json::from_slice(&msg.payload).unwrap_or_else(|e| {
            LookupReply::empty(CacheOutcome::Bypass, format!("bad cache reply: {e}"))
        }),
        Ok(Err(e)) => LookupReply::empty(CacheOutcome::Bypass, format!("cache unavailable: {e}")),
        Err(_) => LookupReply::empty(
            CacheOutcome::Bypass,
            format!("no cache answer within {} ms", timeout.as_millis()),
        ),
    };
    if !span.is_none() {
        use switchyard_schemas::trace::OpenTelemetrySpanExt;
        span.set_attribute("switchyard.cache.outcome", reply.outcome.as_str());
    }
    reply
}

/// Records the frames of a routed answer and stores it when it completes.
pub struct Capture {
    app: Arc<AppState>,
    key: CacheKey,
    exact: Option<String>,
    ttl_s: u64,
    /// The route is semantic (see [`StoreRequest::semantic`]).
    semantic: bool,
    target: String,
    upstream_model: Option<String>,
    answer: CachedAnswer,
    failed: bool,
}

impl Capture {
    /// Sees one frame (before it is encoded); `End` publishes the store.
    pub fn frame(&mut self, frame: &FrameBody) {
        match frame {
            FrameBody::Text { text } => {
                if !text.is_empty() {
                    self.answer.chunks.push(text.clone());
                }
            }
            FrameBody::ToolCall { .. } => {
                frame.accumulate_tool_call(&mut self.answer.tool_calls);
            }
            FrameBody::Usage { usage } => self.answer.usage = *usage,
            FrameBody::End { finish_reason } => {
                self.answer.finish_reason = *finish_reason;
                self.publish();
            }
            FrameBody::Error { .. } => self.failed = true,
            // A cached answer has no place for reasoning, and a replay without its signed
            // thinking blocks could not be continued on Anthropic: such answers are not stored.
            // Nor has it a place for log probabilities.
            FrameBody::Reasoning { .. }
            | FrameBody::ReasoningSignature { .. }
            | FrameBody::RedactedReasoning { .. }
            | FrameBody::Logprobs { .. } => self.failed = true,
            // Nor for several choices (`n > 1` bypasses the cache anyway).
            FrameBody::Choice { .. } | FrameBody::ChoiceEnd { .. } => self.failed = true,
            FrameBody::Start { .. } | FrameBody::Heartbeat | FrameBody::UpstreamHeaders { .. } => {}
        }
    }

    /// Stores a complete non-streamed answer.
    pub fn aggregate(mut self, agg: &Aggregate) {
        // Not stored with reasoning: see `frame`.
        self.failed |= !agg.thinking.is_empty() || !agg.logprobs.is_empty();
        if !agg.text.is_empty() {
            self.answer.chunks.push(agg.text.clone());
        }
        self.answer.tool_calls = agg
            .tool_calls
            .iter()
            .map(|c| CachedToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect();
        self.answer.usage = agg.usage.unwrap_or_default();
        self.answer.finish_reason = agg.finish;
        self.publish();
    }

    fn publish(&mut self) {
        let complete = matches!(
            self.answer.finish_reason,
            FinishReason::Stop | FinishReason::Length | FinishReason::ToolCalls
        );
        let empty = self.answer.chunks.is_empty() && self.answer.tool_calls.is_empty();
        if self.failed || !complete || empty {
            return;
        }
        let req = StoreRequest {
            key: self.key.clone(),
            answer: self.answer.clone(),
            target: Some(self.target.clone()),
            upstream_model: self.upstream_model.clone(),
            ttl_s: self.ttl_s,
            semantic: self.semantic,
        };
        self.failed = true; // once
        self.app.cache.remember(&req, self.exact.as_deref());
        self.app.metrics.cache("store");
        CacheClient::queue_store(&self.app, &req);
    }
}

/// Encoded stores grouped into messages: consecutive stores joined into one JSON array while it
/// stays within [`STORE_BATCH_BYTES`]; a group of one is sent as itself.
fn store_messages(stores: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut groups: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut size = 0;
    for s in stores {
        match groups.last_mut() {
            Some(g) if size + s.len() < STORE_BATCH_BYTES => {
                size += s.len() + 1;
                g.push(s);
            }
            _ => {
                size = s.len() + 2;
                groups.push(vec![s]);
            }
        }
    }
    groups
        .into_iter()
        .map(|mut g| {
            if g.len() == 1 {
                g.swap_remove(0)
            } else {
                [&b"["[..], &g.join(&b','), b"]"].concat()
            }
        })
        .collect()
}

/// The answer as the frames a worker would have sent (text pieces, tool calls, usage, end).
pub(crate) fn replay_frames(answer: &CachedAnswer) -> Vec<FrameBody> {
    let mut frames: Vec<FrameBody> = answer
        .chunks
        .iter()
        .map(|t| FrameBody::Text { text: t.clone() })
        .collect();
    for (i, c) in answer.tool_calls.iter().enumerate() {
        frames.push(FrameBody::ToolCall {
            index: i as u32,
            id: Some(c.id.clone()),
            name: Some(c.name.clone()),
            arguments: c.arguments.clone(),
        });
    }
    frames.push(FrameBody::Usage {
        usage: answer.usage,
    });
    frames.push(FrameBody::End {
        finish_reason: answer.finish_reason,
    });
    frames
}

pub(crate) fn aggregate(answer: &CachedAnswer) -> Aggregate {
    Aggregate {
        more_choices: Vec::new(),
        text: answer.text(),
        tool_calls: answer.tool_calls.clone(),
        finish: answer.finish_reason,
        usage: Some(answer.usage),
        thinking: Vec::new(),
        logprobs: Vec::new(),
    }
}

/// Publishes the hit's `charge` event and returns its new request id.
fn charge_hit(app: &Arc<AppState>, ctx: &RequestContext, check: &Check, usage: Usage) -> Uuid {
    let id = ctx.new_request_id();
    let mut charge = Charge::start(
        app.clone(),
        ctx,
        id,
        &check.route,
        ctx.caller.clone(),
        check.prompt_bytes,
        check.admitted,
    );
    charge.cache_hit(usage);
    charge.cache_outcome(check.audit_outcome());
    charge.finish(None);
    id
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stores_are_grouped_into_arrays_within_the_byte_cap() {
        let store = |n: usize| serde_json::to_vec(&"x".repeat(n)).unwrap();
        let msgs = store_messages(vec![store(1), store(2)]);
        assert_eq!(msgs, [br#"["x","xx"]"#.to_vec()]);
        // A lone store goes as itself; one past the cap starts a new message.
        let big = STORE_BATCH_BYTES;
        let msgs = store_messages(vec![store(1), store(big), store(3), store(4)]);
        let values: Vec<serde_json::Value> = msgs
            .iter()
            .map(|m| serde_json::from_slice(m).unwrap())
            .collect();
        assert_eq!(values.len(), 3);
        assert_eq!(values[0], serde_json::json!("x"));
        assert_eq!(values[1], serde_json::json!("x".repeat(big)));
        assert_eq!(values[2], serde_json::json!(["xxx", "xxxx"]));
        assert!(msgs.iter().all(|m| m.len() <= STORE_BATCH_BYTES + 2));
        assert!(store_messages(Vec::new()).is_empty());
    }

    #[test]
    fn directives_from_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "cache-control",
            HeaderValue::from_static("No-Cache, max-age=0"),
        );
        h.append("cache-control", HeaderValue::from_static("no-store"));
        h.insert(HEADER_TTL, HeaderValue::from_static(" 60 "));
        let d = Directives::from_headers(&h);
        assert_eq!(
            d,
            Directives {
                no_cache: true,
                no_store: true,
                ttl_s: Some(60)
            }
        );
        assert_eq!(
            Directives::from_headers(&HeaderMap::new()),
            Directives::default()
        );
    }

    /// The replica answers exact-only lookups (hit or miss) and exact hits; an exact miss of a
    /// semantic route is left to the cache service.
    #[test]
    fn the_replica_answers_what_the_exact_layer_decides() {
        let replica = Arc::new(switchyard_cache::Service::new(
            switchyard_cache::ServiceOptions::new(Default::default(), None),
        ));
        let key = |text: &str| -> CacheKey {
            serde_json::from_value(serde_json::json!({
                "route": "r", "messages": [{"role": "user", "content": text}], "params": {}
            }))
            .unwrap()
        };
        let client = CacheClient::with_replica(Some(replica));
        client.remember(
            &StoreRequest {
                key: key("stored"),
                answer: CachedAnswer {
                    chunks: vec!["yes".into()],
                    tool_calls: vec![],
                    finish_reason: FinishReason::Stop,
                    usage: Usage::default(),
                },
                target: None,
                upstream_model: None,
                ttl_s: 60,
                semantic: false,
            },
            None,
        );
        let ask = |text: &str, semantic: bool| {
            client
                .local(
                    &LookupRequest {
                        key: key(text),
                        semantic,
                        threshold: 0.9,
                    },
                    None,
                )
                .map(|r| r.outcome)
        };
        assert_eq!(ask("stored", false), Some(CacheOutcome::Hit));
        assert_eq!(ask("stored", true), Some(CacheOutcome::Hit));
        assert_eq!(ask("other", false), Some(CacheOutcome::Miss));
        assert_eq!(ask("other", true), None);
        assert_eq!(
            CacheClient::default()
                .local(
                    &LookupRequest {
                        key: key("stored"),
                        semantic: false,
                        threshold: 0.9,
                    },
                    None
                )
                .map(|r| r.outcome),
            None
        );
    }

    #[test]
    fn replay_frames_end_with_usage_and_end() {
        let a = CachedAnswer {
            chunks: vec!["Hel".into(), "lo".into()],
            tool_calls: vec![],
            finish_reason: FinishReason::Length,
            usage: Usage {
                prompt_tokens: 12,
                completion_tokens: 5,
                ..Usage::default()
            },
        };
        let f = replay_frames(&a);
        assert_eq!(f.len(), 4);
        assert_eq!(
            f[3],
            FrameBody::End {
                finish_reason: FinishReason::Length
            }
        );
        assert_eq!(aggregate(&a).text, "Hello");
    }
}
