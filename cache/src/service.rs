//! Lookup, store and purge, and the KV persistence that keeps every instance's index in step.
//!
//! Ordering: stores are applied in the order they arrive (in the subscription loop), lookups are
//! answered concurrently after everything received before them was applied — so on one instance a
//! lookup that follows a store sees it through the exact layer, and through the semantic layer
//! once the store's query is embedded (off the loop, see [`crate::store`]). Across instances a
//! store becomes visible when the KV watch delivers it (a few milliseconds; a semantic route's
//! store once it is embedded).

use crate::canon::{self, Canonical};
use crate::embed::{Embed, OnDemand};
use crate::index::{self, Entry, Index};
use crate::store::{StoreEmbeddings, put_current, store};
use crate::verify;
use futures::StreamExt;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use switchyard_schemas::cache::{
    CacheKey, CacheOutcome, LookupReply, LookupRequest, PurgeReply, PurgeRequest, StoreRequest,
    purge_subject,
};
use switchyard_schemas::now_ms;
use switchyard_schemas::subjects::Subjects;
use tokio_util::sync::CancellationToken;

/// Cache service failures.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Subscribing failed.
    #[error("NATS subscribe failed: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    /// The KV bucket could not be opened or read.
    #[error("cache KV bucket: {0}")]
    Kv(String),
}

fn kv_err(e: impl std::fmt::Display) -> CacheError {
    CacheError::Kv(e.to_string())
}

/// A lookup whose exact layer missed and whose semantic layer may answer: what
/// [`Service::lookup_semantic`] needs (the canonical form and the loaded embedding model).
pub struct SemanticProbe {
    c: Canonical,
    embedder: Arc<dyn Embed>,
}

/// Settings of one cache instance.
#[derive(Clone)]
pub struct ServiceOptions {
    /// Subject names.
    pub subjects: Subjects,
    /// KV bucket name.
    pub bucket: String,
    /// Entries kept (LRU eviction beyond).
    pub max_entries: usize,
    /// Longest time to live, seconds (also the bucket's `max_age`).
    pub max_ttl_s: u64,
    /// Requests with a `temperature` above this skip the semantic layer.
    pub semantic_max_temperature: f64,
    /// Conversations with more user messages than this skip the semantic layer.
    pub semantic_max_turns: usize,
    /// The embedding model, loaded; `None` = exact layer only unless [`Self::on_demand`] is set.
    pub embedder: Option<Arc<dyn Embed>>,
    /// A model loaded on first need (used when `embedder` is `None`): a lookup or store of a
    /// route with the semantic layer on starts its load (the caller also starts it when the
    /// config turns semantic caching on); until loaded, the exact layer answers.
    pub on_demand: Option<Arc<OnDemand>>,
    /// How often expired entries are deleted.
    pub sweep_every: Duration,
}

impl std::fmt::Debug for ServiceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceOptions")
            .field("bucket", &self.bucket)
            .field("max_entries", &self.max_entries)
            .field("max_ttl_s", &self.max_ttl_s)
            .field("semantic_max_temperature", &self.semantic_max_temperature)
            .field("semantic_max_turns", &self.semantic_max_turns)
            .field(
                "embedder",
                &self.embedder.as_ref().map(|e| e.model_id().to_owned()),
            )
            .field("on_demand", &self.on_demand)
            .finish()
    }
}

impl ServiceOptions {
    /// Defaults: bucket [`crate::BUCKET`], 100 000 entries, 7 days maximum TTL, semantic layer up
    /// to temperature 1.0 and 4 user turns, sweep every 30 s.
    pub fn new(subjects: Subjects, embedder: Option<Arc<dyn Embed>>) -> Self {
        Self {
            subjects,
            bucket: crate::BUCKET.to_owned(),
            max_entries: 100_000,
            max_ttl_s: 7 * 86_400,
            semantic_max_temperature: 1.0,
            semantic_max_turns: 4,
            embedder,
            on_demand: None,
            sweep_every: Duration::from_secs(30),
        }
    }
}

/// Query vectors of recent lookups by exact key, so storing the answer of a miss does not embed
/// the same text again.
#[derive(Default)]
struct Recent {
    map: HashMap<String, Vec<f32>>,
    order: VecDeque<String>,
}

const RECENT: usize = 1024;

impl Recent {
    fn put(&mut self, key: String, v: Vec<f32>) {
        if self.map.insert(key.clone(), v).is_none() {
            self.order.push_back(key);
            while self.order.len() > RECENT {
                if let Some(old) = self.order.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
    }
}

/// One instance's state: the index, the model, and recent query vectors.
pub struct Service {
    opts: ServiceOptions,
    index: RwLock<Index>,
    recent: Mutex<Recent>,
}

impl Service {
    /// An empty instance.
    pub fn new(opts: ServiceOptions) -> Self {
        Self {
            index: RwLock::new(Index::new(opts.max_entries)),
            recent: Mutex::new(Recent::default()),
            opts,
        }
    }

    /// The settings.
    pub fn options(&self) -> &ServiceOptions {
        &self.opts
    }

    /// The embedding model, if there is one loaded.
    pub fn embedder(&self) -> Option<Arc<dyn Embed>> {
        self.opts
            .embedder
            .clone()
            .or_else(|| self.opts.on_demand.as_ref().and_then(|o| o.get()))
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.index.read().len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.index.read().is_empty()
    }

    /// Why the semantic layer may not answer a request with `key` (canonical form `c`) on a
    /// route whose `cache.semantic` is `semantic`, if it may not. The same rules decide whether
    /// a store is embedded: an entry no lookup of its scope may compare needs no vector.
    fn semantic_block(&self, semantic: bool, key: &CacheKey, c: &Canonical) -> Option<String> {
        let p = &key.params;
        if !semantic {
            return Some("semantic layer off for this route".into());
        }
        if self.embedder().is_none() {
            if let Some(od) = &self.opts.on_demand {
                od.request();
                if od.is_loading() {
                    return Some("semantic layer loading (embedding model)".into());
                }
            }
            return Some("semantic layer unavailable (no embedding model)".into());
        }
        if p.n.is_some_and(|n| n > 1) {
            return Some("n > 1".into());
        }
        if let Some(t) = p.temperature
            && t > self.opts.semantic_max_temperature
        {
            return Some(format!(
                "temperature {t} above {}",
                self.opts.semantic_max_temperature
            ));
        }
        if c.user_turns > self.opts.semantic_max_turns {
            return Some(format!(
                "{} user turns, more than {}",
                c.user_turns, self.opts.semantic_max_turns
            ));
        }
        if c.query.is_none() {
            return Some("the conversation does not end with a user text".into());
        }
        None
    }

    /// Answers a lookup (CPU work: the embedding; call off the async executor).
    pub fn lookup(&self, req: &LookupRequest) -> LookupReply {
        match self.lookup_exact(req) {
            Ok(reply) => reply,
            Err(probe) => self.lookup_semantic(req, probe),
        }
    }

    /// The cheap part of [`Service::lookup`] (canonical form, exact probe, the semantic layer's
    /// preconditions; microseconds, fine on the async executor): the answer, or the
    /// [`SemanticProbe`] still to run, which embeds the query and belongs on the blocking pool.
    pub fn lookup_exact(&self, req: &LookupRequest) -> Result<LookupReply, SemanticProbe> {
        let c = match canon::canonical(&req.key) {
            Ok(c) => c,
            // No key, no lookup: a partial key could match another request's answer.
            Err(e) => {
                let reason = format!("request not encodable: {e}");
                return Ok(LookupReply::empty(CacheOutcome::Bypass, reason));
            }
        };
        let now = now_ms();
        if req.key.params.n.is_some_and(|n| n > 1) {
            return Ok(LookupReply::empty(CacheOutcome::Bypass, "n > 1"));
        }
        if let Some(slot) = self.index.read().exact(&c.exact, now) {
            return Ok(LookupReply {
                outcome: CacheOutcome::Hit,
                similarity: None,
                answer: Some(slot.entry.answer.clone()),
                entry: Some(slot.entry.key.clone()),
                reason: None,
            });
        }
        if let Some(why) = self.semantic_block(req.semantic, &req.key, &c) {
            return Ok(LookupReply::empty(
                CacheOutcome::Miss,
                format!("exact miss; {why}"),
            ));
        }
        let Some(embedder) = self.embedder().filter(|_| c.query.is_some()) else {
            return Ok(LookupReply::empty(CacheOutcome::Miss, "exact miss"));
        };
        // Nothing to compare with: answer at once, without embedding.
        if !self.index.read().has_vectors(&c.scope) {
            return Ok(LookupReply::empty(
                CacheOutcome::Miss,
                "exact miss; no entry in this scope",
            ));
        }
        Err(SemanticProbe { c, embedder })
    }

    /// The semantic layer of a lookup whose exact part missed (CPU work: embeds the query).
    pub fn lookup_semantic(&self, req: &LookupRequest, probe: SemanticProbe) -> LookupReply {
        let SemanticProbe { c, embedder } = probe;
        let now = now_ms();
        let Some(query) = c.query.as_deref() else {
            return LookupReply::empty(CacheOutcome::Miss, "exact miss");
        };
        let vector = match embedder.embed(&[query]) {
            Ok(mut v) if !v.is_empty() => v.swap_remove(0),
            Ok(_) => return LookupReply::empty(CacheOutcome::Miss, "embedding returned nothing"),
            Err(e) => return LookupReply::empty(CacheOutcome::Miss, format!("embedding: {e}")),
        };
        let index = self.index.read();
        let candidates =
            index.candidates(&c.scope, embedder.model_id(), &vector, req.threshold, now);
        self.recent.lock().put(c.exact.clone(), vector);
        if candidates.is_empty() {
            return LookupReply::empty(
                CacheOutcome::Miss,
                format!("no entry of this scope at similarity >= {}", req.threshold),
            );
        }
        let qf = verify::features(query);
        let mut first_rejection = None;
        for cand in candidates.iter().take(8) {
            let Some(f) = cand.slot.features.as_ref() else {
                continue;
            };
            match verify::compare(&qf, f) {
                Ok(()) => {
                    index.touch(&cand.slot);
                    return LookupReply {
                        outcome: CacheOutcome::SemanticHit,
                        similarity: Some(cand.similarity),
                        answer: Some(cand.slot.entry.answer.clone()),
                        entry: Some(cand.slot.entry.key.clone()),
                        reason: None,
                    };
                }
                Err(r) => {
                    first_rejection.get_or_insert((r, cand.similarity));
                }
            }
        }
        let reason = match first_rejection {
            Some((r, s)) => format!(
                "semantic candidate at {s:.3} rejected: {} differs",
                r.as_str()
            ),
            None => "no verifiable candidate".into(),
        };
        LookupReply::empty(CacheOutcome::Miss, reason)
    }

    /// Turns a store request into an entry (CPU work: the embedding when not cached).
    pub fn prepare(&self, req: &StoreRequest) -> Option<Entry> {
        let (mut entry, unembedded) = self.prepare_unembedded(req)?;
        if let (true, Some(embedder), Some(query)) =
            (unembedded, self.embedder(), entry.query.as_deref())
        {
            match embedder.embed(&[query]) {
                Ok(mut v) if !v.is_empty() => {
                    entry.vector = Some(index::encode_vector(&v.swap_remove(0)));
                    entry.embed_model = Some(embedder.model_id().to_owned());
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "embedding a stored query failed; exact layer only");
                }
            }
        }
        Some(entry)
    }

    /// The cheap part of [`Service::prepare`] (no embedding): the entry, with its vector when a
    /// recent lookup of the same text embedded it, and whether it still wants one: a semantic
    /// route's store that its scope's lookups may compare by meaning (the lookup's rules:
    /// temperature, turns, a final user text), with a model loaded.
    pub(crate) fn prepare_unembedded(&self, req: &StoreRequest) -> Option<(Entry, bool)> {
        if req.key.params.n.is_some_and(|n| n > 1) {
            return None;
        }
        let c = match canon::canonical(&req.key) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cache store skipped: request not encodable");
                return None;
            }
        };
        let now = now_ms();
        let ttl_s = req.ttl_s.min(self.opts.max_ttl_s);
        if ttl_s == 0 {
            return None;
        }
        let mut vector = None;
        let mut embed_model = None;
        let mut unembedded = false;
        let embedder = self
            .embedder()
            .filter(|_| self.semantic_block(req.semantic, &req.key, &c).is_none());
        if let Some(embedder) = embedder {
            match self.recent.lock().map.get(&c.exact) {
                Some(v) => {
                    vector = Some(index::encode_vector(v));
                    embed_model = Some(embedder.model_id().to_owned());
                }
                None => unembedded = true,
            }
        }
        let entry = Entry {
            key: c.exact,
            scope: c.scope,
            route: req.key.route.clone(),
            target: req.target.clone(),
            upstream_model: req.upstream_model.clone(),
            query: c.query,
            vector,
            embed_model,
            answer: req.answer.clone(),
            stored_ms: now,
            expires_ms: now.saturating_add(ttl_s.saturating_mul(1000)),
        };
        Some((entry, unembedded))
    }

    /// Gives the held entry `key` stored at `stored_ms` its `vector` (encoded) of `model`;
    /// nothing when the index no longer holds that entry (a newer store of the key replaced it,
    /// or it was purged or evicted).
    pub(crate) fn attach_vector(&self, key: &str, stored_ms: u64, vector: String, model: &str) {
        let mut ix = self.index.write();
        let Some(slot) = ix.get(key).filter(|s| s.entry.stored_ms == stored_ms) else {
            return;
        };
        let mut entry = slot.entry.clone();
        entry.vector = Some(vector);
        entry.embed_model = Some(model.to_owned());
        // Replaces the slot: the index size is unchanged, so nothing is evicted.
        let _ = ix.insert(entry);
    }

    /// A copy of the held entry `key` stored at `stored_ms`, unless it was replaced, removed or
    /// has expired.
    pub(crate) fn current(&self, key: &str, stored_ms: u64) -> Option<Entry> {
        let ix = self.index.read();
        let slot = ix.get(key)?;
        (slot.entry.stored_ms == stored_ms && slot.entry.expires_ms > now_ms())
            .then(|| slot.entry.clone())
    }

    /// Adds `entry` to the index (unless already there); returns the evicted keys.
    pub fn apply(&self, entry: Entry) -> Vec<String> {
        if self.index.read().has(&entry.key, entry.stored_ms) {
            return Vec::new();
        }
        self.index.write().insert(entry)
    }

    /// Adds an entry learned from KV (any instance's store), like [`Service::apply`]; an instance
    /// that can never embed (an ingress replica, a service without a model) does not keep its
    /// vector in memory. What the index evicts stays in KV: the instance that stored an entry
    /// deletes what its own index evicts, which reaches every instance as a delete.
    fn apply_shared(&self, mut entry: Entry) {
        if self.opts.embedder.is_none() && self.opts.on_demand.is_none() {
            entry.vector = None;
            entry.embed_model = None;
        }
        let _ = self.apply(entry);
    }

    /// Removes an entry from the index.
    pub fn remove(&self, key: &str) -> bool {
        self.index.write().remove(key)
    }

    /// Keys matching a purge request's filters.
    pub fn matching(&self, req: &PurgeRequest) -> Vec<String> {
        self.index.read().select(|e| {
            req.route.as_ref().is_none_or(|r| &e.route == r)
                && req
                    .model
                    .as_ref()
                    .is_none_or(|m| e.upstream_model.as_ref() == Some(m))
                && req
                    .key_prefix
                    .as_ref()
                    .is_none_or(|p| e.key.starts_with(p.as_str()))
        })
    }

    /// Keys of expired entries.
    pub fn expired(&self) -> Vec<String> {
        self.index.read().expired(now_ms())
    }

    /// (entries, scopes, largest scope).
    pub fn stats(&self) -> (usize, usize, usize) {
        let ix = self.index.read();
        let (scopes, largest) = ix.scope_stats();
        (ix.len(), scopes, largest)
    }
}

/// Gets or creates the entry bucket (history 1, `max_age` = the longest TTL).
pub async fn bucket(
    js: &async_nats::jetstream::Context,
    name: &str,
    max_ttl_s: u64,
) -> Result<async_nats::jetstream::kv::Store, CacheError> {
    match js.get_key_value(name).await {
        Ok(kv) => Ok(kv),
        Err(_) => js
            .create_key_value(switchyard_schemas::replicas::kv(
                async_nats::jetstream::kv::Config {
                    bucket: name.to_owned(),
                    history: 1,
                    max_age: Duration::from_secs(max_ttl_s.max(1)),
                    description:
                        "Switchyard cache entries (key = hex SHA-256 of the canonical request)"
                            .to_owned(),
                    ..Default::default()
                },
            ))
            .await
            .map_err(kv_err),
    }
}

/// The part of a stored entry's JSON that tells whether the index already holds it.
#[derive(serde::Deserialize)]
struct Stamp {
    stored_ms: u64,
}

fn apply_kv(service: &Service, entry: &async_nats::jetstream::kv::Entry) {
    use async_nats::jetstream::kv::Operation;
    match entry.operation {
        // The watch also delivers this instance's own stores: those are recognised from the
        // stamp alone, without building the whole entry again.
        Operation::Put
            if serde_json::from_slice::<Stamp>(&entry.value)
                .is_ok_and(|s| service.index.read().has(&entry.key, s.stored_ms)) => {}
        Operation::Put => match serde_json::from_slice::<Entry>(&entry.value) {
            Ok(e) => service.apply_shared(e),
            Err(e) => {
                tracing::warn!(key = %entry.key, error = %e, "unreadable cache entry skipped")
            }
        },
        Operation::Delete | Operation::Purge => {
            service.remove(&entry.key);
        }
    }
}

/// Loads every entry of the bucket into `service`, then keeps applying changes in the background
/// (a task on `tasks`) until `shutdown` fires.
async fn rebuild_and_watch(
    service: Arc<Service>,
    kv: async_nats::jetstream::kv::Store,
    shutdown: CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<(), CacheError> {
    let pending = {
        let js_info = kv.status().await.map_err(kv_err)?;
        js_info.values()
    };
    let mut watch = kv.watch_with_history(">").await.map_err(kv_err)?;
    if pending > 0 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let next = tokio::time::timeout_at(deadline, watch.next()).await;
            let entry = match next {
                Ok(Some(Ok(e))) => e,
                Ok(Some(Err(e))) => return Err(kv_err(e)),
                Ok(None) => return Err(CacheError::Kv("watch ended during rebuild".into())),
                Err(_) => {
                    tracing::warn!("cache rebuild still incomplete after 60 s; serving anyway");
                    break;
                }
            };
            apply_kv(&service, &entry);
            if entry.delta == 0 {
                break;
            }
        }
    }
    tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                next = watch.next() => match next {
                    Some(Ok(e)) => apply_kv(&service, &e),
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "cache KV watch error");
                    }
                    None => {
                        tracing::error!("cache KV watch ended; this instance no longer sees other instances' stores");
                        return;
                    }
                }
            }
        }
    });
    Ok(())
}

pub(crate) async fn delete_keys(kv: &async_nats::jetstream::kv::Store, keys: &[String]) -> u64 {
    let mut n = 0;
    for k in keys {
        match kv.purge(k).await {
            Ok(()) => n += 1,
            Err(e) => tracing::warn!(key = %k, error = %e, "cache KV purge failed"),
        }
    }
    n
}

async fn purge(
    service: &Service,
    kv: &async_nats::jetstream::kv::Store,
    req: &PurgeRequest,
) -> PurgeReply {
    if !req.is_valid() {
        return PurgeReply {
            deleted: 0,
            error: Some("name a filter (route, model, key prefix) or `all`".into()),
        };
    }
    let filtered = req.route.is_some() || req.model.is_some() || req.key_prefix.is_some();
    let mut keys = service.matching(req);
    if !filtered {
        // `all`: also what this instance has not indexed (yet).
        if let Ok(mut all) = kv.keys().await {
            while let Some(Ok(k)) = all.next().await {
                keys.push(k);
            }
        }
        keys.sort();
        keys.dedup();
    }
    // Out of the index first: nothing of this instance writes them to KV again (its KV writes
    // check the index, see `crate::store`).
    for k in &keys {
        service.remove(k);
    }
    let deleted = delete_keys(kv, &keys).await;
    tracing::info!(?req, deleted, "cache purge");
    PurgeReply {
        deleted,
        error: None,
    }
}

/// An exact-layer replica of the index for another process (ingress, `cache_replica` in the
/// config): opens (or creates) the KV bucket, rebuilds the index from it, then keeps applying the
/// bucket's changes (a task on `tasks`) until `shutdown` is cancelled. It does not subscribe to
/// `<prefix>.cache.*` (it answers only its own process's lookups, with [`Service::lookup_exact`])
/// and never writes KV: stores and purges still go through the cache service, and reach the
/// replica through the watch. Without an embedding model in `opts` it keeps no vectors.
pub async fn replica(
    nats: async_nats::Client,
    opts: ServiceOptions,
    shutdown: CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<Arc<Service>, CacheError> {
    let js = async_nats::jetstream::new(nats);
    let kv = bucket(&js, &opts.bucket, opts.max_ttl_s).await?;
    let service = Arc::new(Service::new(opts));
    rebuild_and_watch(service.clone(), kv, shutdown, tasks).await?;
    Ok(service)
}

/// Runs one cache instance until `shutdown` resolves: opens (or creates) the KV bucket, rebuilds
/// the index from it, then serves `<prefix>.cache.lookup`, `.store` and `.purge` in queue group
/// [`crate::QUEUE_GROUP`].
pub async fn run(
    nats: async_nats::Client,
    opts: ServiceOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), CacheError> {
    run_with_ready(nats, opts, shutdown, || {}).await
}

/// Like [`run`], calling `on_ready` once the index is rebuilt and the subscription is registered
/// with the server (the moment lookups are answered).
pub async fn run_with_ready(
    nats: async_nats::Client,
    opts: ServiceOptions,
    shutdown: impl std::future::Future<Output = ()>,
    on_ready: impl FnOnce(),
) -> Result<(), CacheError> {
    let js = async_nats::jetstream::new(nats.clone());
    let kv = bucket(&js, &opts.bucket, opts.max_ttl_s).await?;
    let subjects = opts.subjects.clone();
    let sweep_every = opts.sweep_every;
    let service = Arc::new(Service::new(opts));
    let stop = CancellationToken::new();
    let started = std::time::Instant::now();
    // The KV watch and the sweeper: they end on `stop`, and shutdown waits for them.
    let background = tokio_util::task::TaskTracker::new();
    rebuild_and_watch(service.clone(), kv.clone(), stop.clone(), &background).await?;
    let (entries, scopes, largest) = service.stats();
    tracing::info!(
        entries,
        scopes,
        largest_scope = largest,
        ms = started.elapsed().as_millis() as u64,
        embedder = ?service.embedder().map(|e| e.model_id().to_owned()),
        "cache index rebuilt from KV"
    );
    // Expired entries leave KV (and so every index).
    {
        let (service, kv, stop) = (service.clone(), kv.clone(), stop.clone());
        background.spawn(async move {
            let mut tick = tokio::time::interval(sweep_every);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {
                        let expired = service.expired();
                        if !expired.is_empty() {
                            for k in &expired {
                                service.remove(k);
                            }
                            let n = delete_keys(&kv, &expired).await;
                            tracing::debug!(expired = n, "cache sweep");
                        }
                    }
                }
            }
        });
    }
    let lookup_subject = subjects.cache_lookup();
    let store_subject = subjects.cache_store();
    let purge_subject = purge_subject(&subjects);
    let all = format!("{}.cache.*", subjects.prefix());
    let mut sub = nats.queue_subscribe(all, crate::QUEUE_GROUP.into()).await?;
    // Make sure the server has the subscription before anyone is told we are up.
    if let Err(e) = nats.flush().await {
        tracing::warn!(error = %e, "flush after subscribe failed");
    }
    tracing::info!("cache service ready");
    on_ready();
    // Lookups waiting on an embedding, stores writing KV and the store embeddings; shutdown
    // waits for them.
    let tasks = tokio_util::task::TaskTracker::new();
    let mut embeddings = StoreEmbeddings::start(service.clone(), &tasks);
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            Some((key, stored_ms)) = embeddings.finished() => {
                put_current(&service, &nats, &kv, &tasks, &key, stored_ms).await;
            }
            msg = sub.next() => {
                let Some(msg) = msg else { break Ok(()) };
                let subject = msg.subject.as_str();
                if subject == lookup_subject {
                    let Some(reply) = msg.reply.clone() else { continue };
                    let req: LookupRequest = match serde_json::from_slice(&msg.payload) {
                        Ok(r) => r,
                        Err(e) => {
                            let body = serde_json::to_vec(&LookupReply::empty(CacheOutcome::Bypass, format!("bad lookup: {e}"))).unwrap_or_default();
                            let _ = nats.publish(reply, body.into()).await;
                            continue;
                        }
                    };
                    let span = lookup_span(msg.headers.as_ref());
                    // The exact layer answers in the loop; only an embedding leaves it, for the
                    // blocking pool (a thread hand-off per lookup cost more than the lookup).
                    match service.lookup_exact(&req) {
                        Ok(reply_body) => send_lookup_reply(&nats, reply, span, reply_body).await,
                        Err(probe) => {
                            let (service, nats) = (service.clone(), nats.clone());
                            tasks.spawn(async move {
                                let answer = tokio::task::spawn_blocking(move || service.lookup_semantic(&req, probe)).await;
                                let reply_body = match answer {
                                    Ok(r) => r,
                                    Err(e) => LookupReply::empty(CacheOutcome::Bypass, format!("lookup failed: {e}")),
                                };
                                send_lookup_reply(&nats, reply, span, reply_body).await;
                            });
                        }
                    }
                } else if subject == store_subject {
                    let reqs = match StoreRequest::decode_batch(&msg.payload) {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::warn!(error = %e, "bad cache store ignored");
                            continue;
                        }
                    };
                    for req in reqs {
                        store(&service, &nats, &kv, &tasks, &mut embeddings, req).await;
                    }
                } else if subject == purge_subject {
                    let Some(reply) = msg.reply.clone() else { continue };
                    let out = match serde_json::from_slice::<PurgeRequest>(&msg.payload) {
                        Ok(req) => purge(&service, &kv, &req).await,
                        Err(e) => PurgeReply { deleted: 0, error: Some(format!("bad purge request: {e}")) },
                    };
                    let body = serde_json::to_vec(&out).unwrap_or_default();
                    if let Err(e) = nats.publish(reply, body.into()).await {
                        tracing::warn!(error = %e, "cache purge reply failed");
                    }
                }
            }
        }
    };
    // No more messages to this instance (the queue group sends them to the others), then the
    // embedding worker finishes what is queued and this loop writes it to KV.
    if let Err(e) = sub.unsubscribe().await {
        tracing::warn!(error = %e, "cache unsubscribe failed");
    }
    embeddings.close();
    while let Some((key, stored_ms)) = embeddings.finished().await {
        put_current(&service, &nats, &kv, &tasks, &key, stored_ms).await;
    }
    tasks.close();
    tasks.wait().await;
    stop.cancel();
    background.close();
    background.wait().await;
    result
}

/// Publishes a lookup's answer to its requester, noting the outcome on the lookup's span.
async fn send_lookup_reply(
    nats: &async_nats::Client,
    reply: async_nats::Subject,
    span: tracing::Span,
    reply_body: LookupReply,
) {
    if !span.is_none() {
        use switchyard_schemas::trace::OpenTelemetrySpanExt;
        span.set_attribute("switchyard.cache.outcome", reply_body.outcome.as_str());
    }
    drop(span);
    let body = serde_json::to_vec(&reply_body).unwrap_or_default();
    if let Err(e) = nats.publish(reply, body.into()).await {
        tracing::warn!(error = %e, "cache reply failed");
    }
}

/// The server span of one lookup (`switchyard.cache.lookup`, docs/tracing.md), child of the
/// ingress span whose `traceparent` the request carries; `Span::none` when export is off.
fn lookup_span(headers: Option<&async_nats::HeaderMap>) -> tracing::Span {
    if !switchyard_schemas::trace::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(target: "switchyard::cache", "lookup",
        otel.name = "switchyard.cache.lookup", otel.kind = "server");
    switchyard_schemas::trace::adopt(&span, headers);
    if let Some(id) = switchyard_schemas::trace::request_id(headers) {
        use switchyard_schemas::trace::OpenTelemetrySpanExt;
        span.set_attribute("switchyard.request_id", id);
    }
    span
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::embed::TrigramEmbedder;
    use serde_json::json;
    use switchyard_schemas::FinishReason;
    use switchyard_schemas::cache::CachedAnswer;

    /// A one-message request of route `r`.
    pub(crate) fn key(text: &str, max_tokens: u32) -> CacheKey {
        serde_json::from_value(
            json!({"route": "r", "messages": [{"role": "user", "content": text}],
            "params": {"max_tokens": max_tokens}}),
        )
        .unwrap()
    }

    /// A store of `key(text, max_tokens)` answered "answer to {text}" (a semantic route's).
    pub(crate) fn store(text: &str, max_tokens: u32) -> StoreRequest {
        StoreRequest {
            key: key(text, max_tokens),
            answer: CachedAnswer {
                chunks: vec![format!("answer to {text}")],
                tool_calls: vec![],
                finish_reason: FinishReason::Stop,
                usage: Default::default(),
            },
            target: Some("t".into()),
            upstream_model: Some("m".into()),
            ttl_s: 60,
            semantic: true,
        }
    }

    fn lookup(text: &str, max_tokens: u32, threshold: f32) -> LookupRequest {
        LookupRequest {
            key: key(text, max_tokens),
            semantic: true,
            threshold,
        }
    }

    fn service() -> Service {
        Service::new(ServiceOptions::new(
            Subjects::default(),
            Some(Arc::new(TrigramEmbedder)),
        ))
    }

    #[test]
    fn exact_semantic_and_verified_misses() {
        let s = service();
        let e = s
            .prepare(&store("How do I turn on dark mode?", 16))
            .unwrap();
        assert!(e.vector.is_some());
        s.apply(e);
        let r = s.lookup(&lookup("How do I turn on dark mode?", 16, 0.5));
        assert_eq!(r.outcome, CacheOutcome::Hit);
        assert_eq!(
            r.answer.unwrap().text(),
            "answer to How do I turn on dark mode?"
        );
        let r = s.lookup(&lookup("how do I turn on dark mode", 16, 0.5));
        assert_eq!(r.outcome, CacheOutcome::SemanticHit, "{:?}", r.reason);
        assert!(r.similarity.unwrap() >= 0.5);
        let r = s.lookup(&lookup("How do I turn off dark mode?", 16, 0.5));
        assert_eq!(r.outcome, CacheOutcome::Miss);
        assert!(r.reason.unwrap().contains("polarity"));
        // Another max_tokens is another scope.
        let r = s.lookup(&lookup("How do I turn on dark mode?", 400, 0.1));
        assert_eq!(r.outcome, CacheOutcome::Miss);
    }

    /// A store from an exact-only route is not embedded (no lookup could compare its vector),
    /// and the exact layer still answers it.
    #[test]
    fn an_exact_only_store_is_not_embedded() {
        let s = service();
        let mut st = store("How do I turn on dark mode?", 16);
        st.semantic = false;
        let e = s.prepare(&st).unwrap();
        assert_eq!(e.vector, None);
        assert_eq!(e.embed_model, None);
        s.apply(e);
        let mut l = lookup("How do I turn on dark mode?", 16, 0.5);
        l.semantic = false;
        assert_eq!(s.lookup(&l).outcome, CacheOutcome::Hit);
    }

    /// A semantic route's store that no lookup of its scope could compare by meaning (here a
    /// temperature above the semantic layer's limit) is not embedded either.
    #[test]
    fn a_store_its_lookups_cannot_compare_is_not_embedded() {
        let s = service();
        let mut st = store("What is Rust?", 16);
        st.key.params.temperature = Some(1.5);
        let (e, unembedded) = s.prepare_unembedded(&st).unwrap();
        assert_eq!((e.vector, unembedded), (None, false));
        let (e, unembedded) = s.prepare_unembedded(&store("What is Rust?", 16)).unwrap();
        assert_eq!((e.vector, unembedded), (None, true));
    }

    /// The model loads only when a semantic lookup needs it, once; meanwhile the exact layer
    /// answers, afterwards the semantic one.
    #[tokio::test]
    async fn on_demand_model_loads_on_first_semantic_need() {
        let loads = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = loads.clone();
        let od = OnDemand::new(Arc::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Arc::new(TrigramEmbedder) as Arc<dyn Embed>)
        }));
        let s = Arc::new(Service::new(ServiceOptions {
            on_demand: Some(od.clone()),
            ..ServiceOptions::new(Subjects::default(), None)
        }));
        s.apply(s.prepare(&store("What is Rust?", 16)).unwrap());
        let mut exact_only = lookup("what is Rust", 16, 0.5);
        exact_only.semantic = false;
        assert_eq!(s.lookup(&exact_only).outcome, CacheOutcome::Miss);
        assert_eq!(loads.load(std::sync::atomic::Ordering::SeqCst), 0);
        let r = s.lookup(&lookup("what is Rust", 16, 0.5));
        assert!(r.reason.unwrap().contains("loading"));
        od.load().await.unwrap();
        assert_eq!(loads.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Entries stored from now on carry vectors.
        s.apply(s.prepare(&store("What is Go?", 16)).unwrap());
        let r = s.lookup(&lookup("what is Go", 16, 0.5));
        assert_eq!(r.outcome, CacheOutcome::SemanticHit, "{:?}", r.reason);
        od.request();
        assert_eq!(loads.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn semantic_bypass_rules() {
        let s = service();
        s.apply(s.prepare(&store("What is Rust?", 16)).unwrap());
        let mut l = lookup("what is Rust", 16, 0.5);
        l.semantic = false;
        assert_eq!(s.lookup(&l).outcome, CacheOutcome::Miss);
        let mut l = lookup("What is Rust?", 16, 0.5);
        l.key.params.n = Some(2);
        assert_eq!(s.lookup(&l).outcome, CacheOutcome::Bypass);
        let mut st = store("What is Go?", 16);
        st.key.params.temperature = Some(1.5);
        s.apply(s.prepare(&st).unwrap());
        let mut l = lookup("what is Go", 16, 0.1);
        l.key.params.temperature = Some(1.5);
        let r = s.lookup(&l);
        assert_eq!(r.outcome, CacheOutcome::Miss);
        assert!(r.reason.unwrap().contains("temperature"));
    }

    /// A replica (no model, none on demand) keeps entries from KV without their vectors and
    /// answers them from the exact layer.
    #[test]
    fn a_replica_keeps_no_vectors() {
        let entry = service().prepare(&store("What is Rust?", 16)).unwrap();
        assert!(entry.vector.is_some());
        let scope = entry.scope.clone();
        let replica = Service::new(ServiceOptions::new(Subjects::default(), None));
        replica.apply_shared(entry);
        assert!(!replica.index.read().has_vectors(&scope));
        let mut l = lookup("What is Rust?", 16, 0.5);
        l.semantic = false;
        assert_eq!(replica.lookup(&l).outcome, CacheOutcome::Hit);
    }

    #[test]
    fn purge_filters() {
        let s = service();
        for (t, route) in [("a", "r1"), ("b", "r1"), ("c", "r2")] {
            let mut st = store(t, 1);
            st.key.route = route.into();
            s.apply(s.prepare(&st).unwrap());
        }
        let by_route = s.matching(&PurgeRequest {
            route: Some("r1".into()),
            ..Default::default()
        });
        assert_eq!(by_route.len(), 2);
        let by_model = s.matching(&PurgeRequest {
            model: Some("m".into()),
            ..Default::default()
        });
        assert_eq!(by_model.len(), 3);
        let k = &by_route[0];
        let by_prefix = s.matching(&PurgeRequest {
            key_prefix: Some(k[..12].to_owned()),
            ..Default::default()
        });
        assert_eq!(by_prefix, vec![k.clone()]);
    }
}
