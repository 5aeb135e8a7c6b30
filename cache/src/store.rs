//! The store path of the cache service: index an entry, embed its query off the message loop,
//! write it to KV.
//!
//! A store from a semantic route needs its query embedded: milliseconds of CPU with the real
//! model. Embedded inside the subscription loop, it held up every message behind it, exact
//! lookups included, which then missed ingress's lookup timeout under load. Now the loop indexes
//! the entry at once without its vector (an exact lookup finds it) and queues the embedding here.
//! One task takes queued queries in batches of up to [`BATCH`], embeds them in one call on the
//! blocking pool, swaps each vector into its entry if the index still holds that very entry (same
//! `stored_ms`; a newer store of the key or a purge wins), then writes the entry to KV, so other
//! instances learn it with its vector.
//!
//! Ordering: a semantic lookup of a scope with store embeddings pending waits for them (at most
//! [`WAIT`]), so on one instance a lookup that follows a store still finds it semantically.
//! Backpressure: beyond [`QUEUE`] queued embeddings a store stays exact-only (counted, logged).

use crate::index::{self, Entry};
use crate::service::{Service, delete_keys};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use switchyard_schemas::cache::StoreRequest;
use tokio::sync::{mpsc, watch};

/// Store embeddings queued at most; one more leaves its entry exact-only.
pub const QUEUE: usize = 1024;
/// Queries embedded in one model call at most.
pub const BATCH: usize = 16;
/// Longest a semantic lookup waits for its scope's pending store embeddings.
pub const WAIT: Duration = Duration::from_secs(2);

/// Store embeddings queued or running, by scope: what a semantic lookup must wait for.
pub(crate) struct Pending {
    /// Per scope, the sequence number of its latest queued embedding; and the next number.
    scopes: Mutex<(HashMap<String, u64>, u64)>,
    /// The sequence number up to which every embedding has finished (they finish in order).
    done: watch::Sender<u64>,
    /// Stores left exact-only because the queue was full.
    skipped: AtomicU64,
}

impl Default for Pending {
    fn default() -> Self {
        Self {
            scopes: Mutex::new((HashMap::new(), 1)),
            done: watch::channel(0).0,
            skipped: AtomicU64::new(0),
        }
    }
}

impl Pending {
    /// The sequence number a lookup of `scope` must wait for, if an embedding of it is pending.
    pub(crate) fn latest(&self, scope: &str) -> Option<u64> {
        self.scopes.lock().0.get(scope).copied()
    }

    /// Waits (at most [`WAIT`]) until embedding `seq` and all before it have finished.
    pub(crate) async fn wait(&self, seq: u64) {
        let mut done = self.done.subscribe();
        let _ = tokio::time::timeout(WAIT, done.wait_for(|d| *d >= seq)).await;
    }

    fn begin(&self, scope: &str) -> u64 {
        let mut s = self.scopes.lock();
        let seq = s.1;
        s.1 += 1;
        s.0.insert(scope.to_owned(), seq);
        seq
    }

    fn finish(&self, up_to: u64) {
        self.scopes.lock().0.retain(|_, s| *s > up_to);
        self.done.send_replace(up_to);
    }
}

/// One entry waiting for its vector.
struct Job {
    seq: u64,
    key: String,
    stored_ms: u64,
    query: String,
}

/// The queue of store embeddings of one cache instance; dropping it lets the worker finish what
/// is queued and end.
pub(crate) struct StoreEmbeddings {
    tx: mpsc::Sender<Job>,
    service: Arc<Service>,
}

impl StoreEmbeddings {
    /// Starts the worker on `tasks`: it embeds for `service` and writes finished entries to `kv`.
    pub(crate) fn start(
        service: Arc<Service>,
        nats: async_nats::Client,
        kv: async_nats::jetstream::kv::Store,
        tasks: &tokio_util::task::TaskTracker,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tasks.spawn(work(rx, service.clone(), nats, kv));
        Self { tx, service }
    }

    /// Queues the embedding of `entry` (already indexed without its vector); false when the
    /// queue is full (the entry stays exact-only; the caller writes it to KV as it is).
    pub(crate) fn queue(&self, entry: &Entry) -> bool {
        let Some(query) = entry.query.clone() else {
            return false;
        };
        let pending = &self.service.pending;
        // The permit first: a sequence number is only taken by a job that will finish it.
        let Ok(permit) = self.tx.try_reserve() else {
            let n = pending.skipped.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(1000) {
                tracing::warn!(
                    queued = QUEUE,
                    skipped = n + 1,
                    "cache store embeddings queue full; entry kept exact-only"
                );
            }
            return false;
        };
        permit.send(Job {
            seq: pending.begin(&entry.scope),
            key: entry.key.clone(),
            stored_ms: entry.stored_ms,
            query,
        });
        true
    }
}

/// The worker: batches of queued jobs, one model call each, then the vectors into the index and
/// the entries into KV.
async fn work(
    mut rx: mpsc::Receiver<Job>,
    service: Arc<Service>,
    nats: async_nats::Client,
    kv: async_nats::jetstream::kv::Store,
) {
    let mut jobs = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut jobs, BATCH).await > 0 {
        let last = jobs.last().map_or(0, |j| j.seq);
        let batch = std::mem::take(&mut jobs);
        let embedder = service.embedder();
        let embedded = tokio::task::spawn_blocking(move || {
            let vectors = embedder.as_ref().map(|e| {
                let texts: Vec<&str> = batch.iter().map(|j| j.query.as_str()).collect();
                e.embed(&texts)
                    .map(|v| (v, e.model_id().to_owned()))
                    .map_err(|err| err.to_string())
            });
            (batch, vectors)
        })
        .await;
        let Ok((batch, vectors)) = embedded else {
            // The blocking task panicked: its entries stay exact-only and out of KV.
            tracing::error!("cache store embedding task failed");
            service.pending.finish(last);
            continue;
        };
        let vectors = match vectors {
            Some(Ok((v, model))) if v.len() == batch.len() => Some((v, model)),
            Some(Ok(_)) => {
                tracing::warn!(
                    "embedding returned a wrong number of vectors; entries kept exact-only"
                );
                None
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "embedding stored queries failed; entries kept exact-only");
                None
            }
            None => None,
        };
        let mut vectors = vectors.map(|(v, model)| (v.into_iter(), model));
        let mut finished = Vec::with_capacity(batch.len());
        for job in batch {
            let vector = vectors
                .as_mut()
                .and_then(|(v, model)| Some((index::encode_vector(&v.next()?), model.clone())));
            if let Some(entry) = service.attach_vector(&job.key, job.stored_ms, vector) {
                finished.push(entry);
            }
        }
        // The index has the vectors: lookups waiting on them may go.
        service.pending.finish(last);
        for entry in finished {
            match serde_json::to_vec(&entry) {
                Ok(body) => share_entry(&nats, &kv, &entry.key, body, &[]).await,
                Err(e) => tracing::warn!(error = %e, "cache entry not serialisable"),
            }
        }
    }
}

/// Stores one answer: prepared (hashing only) and indexed before the loop takes the next
/// message, so a lookup that follows its store finds it, then shared through KV. An entry that
/// wants its query embedded is written to KV by [`StoreEmbeddings`] once it has its vector.
pub(crate) async fn store(
    service: &Arc<Service>,
    nats: &async_nats::Client,
    kv: &async_nats::jetstream::kv::Store,
    tasks: &tokio_util::task::TaskTracker,
    embeddings: &StoreEmbeddings,
    req: StoreRequest,
) {
    let Some((entry, unembedded)) = service.prepare_unembedded(&req) else {
        return;
    };
    let queued = unembedded && embeddings.queue(&entry);
    let Some((key, body, evicted)) = index_entry(service, entry, !queued) else {
        return;
    };
    if evicted.is_empty() && !kv.use_jetstream_prefix {
        // An unacknowledged put only queues a message: no task needed.
        if let Some(body) = body {
            share_entry(nats, kv, &key, body, &[]).await;
        }
    } else {
        let (nats, kv) = (nats.clone(), kv.clone());
        tasks.spawn(async move {
            match body {
                Some(body) => share_entry(&nats, &kv, &key, body, &evicted).await,
                None => {
                    delete_keys(&kv, &evicted).await;
                }
            }
        });
    }
}

/// Adds a prepared entry to this instance's index: its KV key, its JSON body (with `body`;
/// else the entry goes to KV later) and the keys the index evicted, for [`share_entry`]; `None`
/// when it cannot be serialised.
fn index_entry(
    service: &Service,
    entry: Entry,
    body: bool,
) -> Option<(String, Option<Vec<u8>>, Vec<String>)> {
    let body = match body.then(|| serde_json::to_vec(&entry)).transpose() {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "cache entry not serialisable");
            return None;
        }
    };
    let key = entry.key.clone();
    Some((key, body, service.apply(entry)))
}

/// Writes an entry to the shared KV bucket (so the other cache instances learn it) and deletes
/// what the index evicted.
async fn share_entry(
    nats: &async_nats::Client,
    kv: &async_nats::jetstream::kv::Store,
    key: &str,
    body: Vec<u8>,
    evicted: &[String],
) {
    if body.len() <= MAX_KV_ENTRY {
        if let Err(e) = put_unacknowledged(nats, kv, key, body).await {
            tracing::warn!(error = %e, "cache KV put failed; entry kept in this instance only");
        }
    } else {
        tracing::info!(
            bytes = body.len(),
            "cache entry too large for KV; kept in this instance only"
        );
    }
    delete_keys(kv, evicted).await;
}

/// Writes `key` like [`async_nats::jetstream::kv::Store::put`] but as a plain publish with no
/// reply subject, so JetStream stores it without sending an acknowledgement: one NATS message
/// fewer per store. A cache entry is best effort (this instance already serves it), and what
/// JetStream refuses is the same as a lost put. With a JetStream API prefix (a domain) the
/// acknowledged put is used, since the subject then depends on the context's private prefix.
async fn put_unacknowledged(
    nats: &async_nats::Client,
    kv: &async_nats::jetstream::kv::Store,
    key: &str,
    body: Vec<u8>,
) -> Result<(), String> {
    if kv.use_jetstream_prefix {
        return kv
            .put(key, body.into())
            .await
            .map(drop)
            .map_err(|e| e.to_string());
    }
    let prefix = kv.put_prefix.as_ref().unwrap_or(&kv.prefix);
    nats.publish(format!("{prefix}{key}"), body.into())
        .await
        .map_err(|e| e.to_string())
}

/// Largest entry written to KV; bigger answers are served from this instance's memory only.
const MAX_KV_ENTRY: usize = 900 * 1024;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    #![allow(clippy::disallowed_methods, reason = "tasks end with their test")]
    use crate::embed::{Embed, EmbedError, TrigramEmbedder};
    use crate::service::{ServiceOptions, run_with_ready};
    use futures::StreamExt as _;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;
    use switchyard_schemas::FinishReason;
    use switchyard_schemas::cache::{
        CacheKey, CacheOutcome, CachedAnswer, LookupReply, LookupRequest, StoreRequest,
    };
    use switchyard_schemas::subjects::Subjects;

    /// [`TrigramEmbedder`] behind a gate: every call waits until the test opens it.
    struct Gated(Arc<(Mutex<bool>, Condvar)>);

    impl Embed for Gated {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            let (open, cv) = &*self.0;
            let guard = open.lock().unwrap();
            drop(cv.wait_while(guard, |o| !*o).unwrap());
            TrigramEmbedder.embed(texts)
        }
        fn dims(&self) -> usize {
            TrigramEmbedder.dims()
        }
        fn model_id(&self) -> &str {
            TrigramEmbedder.model_id()
        }
    }

    fn key(text: &str) -> CacheKey {
        serde_json::from_value(serde_json::json!({"route": "r",
            "messages": [{"role": "user", "content": text}], "params": {"max_tokens": 16}}))
        .unwrap()
    }

    async fn lookup(nats: &async_nats::Client, text: &str) -> LookupReply {
        let req = LookupRequest {
            key: key(text),
            semantic: true,
            threshold: 0.5,
        };
        let body = serde_json::to_vec(&req).unwrap();
        let msg = tokio::time::timeout(
            Duration::from_secs(10),
            nats.request(Subjects::default().cache_lookup(), body.into()),
        )
        .await
        .unwrap()
        .unwrap();
        serde_json::from_slice(&msg.payload).unwrap()
    }

    /// While a semantic route's store waits for its embedding, the exact layer answers it at
    /// once; a semantic lookup sent after the store waits for the embedding and then finds it;
    /// the entry reaches KV with its vector.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_embedding_holds_up_no_exact_lookup_and_semantic_lookups_wait_for_it() {
        let server = switchyard_natsd::NatsServer::start_temp().unwrap();
        let nats = async_nats::connect(server.url()).await.unwrap();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let opts = ServiceOptions::new(Subjects::default(), Some(Arc::new(Gated(gate.clone()))));
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
        let service = tokio::spawn(run_with_ready(
            nats.clone(),
            opts,
            async {
                let _ = stop.await;
            },
            move || {
                let _ = ready_tx.send(());
            },
        ));
        ready.await.unwrap();

        let text = "How do I turn on dark mode?";
        let store = StoreRequest {
            key: key(text),
            answer: CachedAnswer {
                chunks: vec!["Settings, then Appearance.".into()],
                tool_calls: vec![],
                finish_reason: FinishReason::Stop,
                usage: Default::default(),
            },
            target: Some("t".into()),
            upstream_model: Some("m".into()),
            ttl_s: 60,
            semantic: true,
        };
        let body = serde_json::to_vec(&[&store]).unwrap();
        nats.publish(Subjects::default().cache_store(), body.into())
            .await
            .unwrap();
        // The gate is shut: only an answer that needs no embedding can come back.
        let exact = lookup(&nats, text).await;
        assert_eq!(exact.outcome, CacheOutcome::Hit, "{:?}", exact.reason);
        let near = {
            let nats = nats.clone();
            tokio::spawn(async move { lookup(&nats, "how do I turn on dark mode").await })
        };
        // The KV entry appears only once embedded: watch for it before opening the gate.
        let js = async_nats::jetstream::new(nats.clone());
        let kv = js.get_key_value(crate::BUCKET).await.unwrap();
        let entry_key = crate::canon::canonical(&store.key).unwrap().exact;
        let mut watch = kv.watch_with_history(&entry_key).await.unwrap();
        {
            let (open, cv) = &*gate;
            *open.lock().unwrap() = true;
            cv.notify_all();
        }
        let near = near.await.unwrap();
        assert_eq!(near.outcome, CacheOutcome::SemanticHit, "{:?}", near.reason);
        assert_eq!(near.answer.unwrap().text(), "Settings, then Appearance.");
        let put = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let stored: crate::index::Entry = serde_json::from_slice(&put.value).unwrap();
        assert_eq!(stored.embed_model.as_deref(), Some("trigram:256"));
        assert!(stored.vector.is_some());
        stop_tx.send(()).unwrap();
        service.await.unwrap().unwrap();
    }
}
