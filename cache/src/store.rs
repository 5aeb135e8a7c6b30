//! The store path of the cache service: index an entry, embed its query off the message loop,
//! write it to KV.
//!
//! A store from a semantic route needs its query embedded, unless a lookup of the same text
//! embedded it a moment before (the service keeps recent lookup vectors): milliseconds of CPU
//! with the real model. Embedded inside the subscription loop, it held up every message behind
//! it, exact lookups included, which then missed ingress's lookup timeout under load; that is the
//! first store of every conversation turn, whose scope (the history) was new to its lookup. Now
//! the loop indexes the entry at once without its vector (an exact lookup finds it) and queues
//! the embedding here. One task takes queued queries in batches of up to [`BATCH`], embeds them
//! in one call on the blocking pool, and swaps each vector into its entry if the index still
//! holds that very entry (same `stored_ms`; a newer store of the key or a purge wins).
//!
//! Lookups do not wait for queued embeddings: a near-duplicate asked while its original is
//! still being embedded misses (one upstream call) instead of every lookup of a busy scope
//! queueing behind the stores, which under load fed on itself (docs/BENCHMARKS.md).
//!
//! KV: every KV write of an instance happens in its message loop, in order with its stores and
//! purges, each after checking that the index still holds that entry unexpired
//! ([`put_current`]); so a purge, an eviction or a newer store of the key always wins. An entry
//! being embedded reaches KV once it has its vector.
//!
//! Backpressure: beyond [`QUEUE`] queued embeddings a store stays exact-only (counted, logged).

use crate::index;
use crate::service::{Service, delete_keys};
use std::sync::Arc;
use switchyard_schemas::cache::StoreRequest;
use tokio::sync::mpsc;

/// Store embeddings queued at most; one more leaves its entry exact-only.
pub const QUEUE: usize = 1024;
/// Queries embedded in one model call at most.
pub const BATCH: usize = 16;

/// One entry waiting for its vector.
struct Job {
    key: String,
    stored_ms: u64,
    query: String,
}

/// The queue of store embeddings of one cache instance. The worker hands every entry it is done
/// with back through [`StoreEmbeddings::finished`], and the message loop writes it to KV.
pub(crate) struct StoreEmbeddings {
    tx: Option<mpsc::Sender<Job>>,
    /// Stores left exact-only because the queue was full.
    skipped: u64,
    /// (key, stored_ms) of entries embedded (or given up on), to be written to KV.
    finished: mpsc::Receiver<(String, u64)>,
}

impl StoreEmbeddings {
    /// Starts the worker on `tasks`, embedding for `service`.
    pub(crate) fn start(service: Arc<Service>, tasks: &tokio_util::task::TaskTracker) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let (done_tx, finished) = mpsc::channel(QUEUE);
        tasks.spawn(work(rx, done_tx, service.clone()));
        Self {
            tx: Some(tx),
            skipped: 0,
            finished,
        }
    }

    /// Queues the embedding of `query`, the query of the entry `key` stored at
    /// `stored_ms` (already indexed without its vector); false when the queue is full or closed
    /// (the entry stays exact-only).
    fn queue(&mut self, key: &str, stored_ms: u64, query: &str) -> bool {
        let Some(tx) = &self.tx else {
            return false;
        };
        let Ok(permit) = tx.try_reserve() else {
            self.skipped += 1;
            if self.skipped % 1000 == 1 {
                tracing::warn!(
                    queued = QUEUE,
                    skipped = self.skipped,
                    "cache store embeddings queue full; entry kept exact-only"
                );
            }
            return false;
        };
        permit.send(Job {
            key: key.to_owned(),
            stored_ms,
            query: query.to_owned(),
        });
        true
    }

    /// The next entry the worker is done with: (key, stored_ms); `None` once the worker ended
    /// (after [`Self::close`]).
    pub(crate) async fn finished(&mut self) -> Option<(String, u64)> {
        self.finished.recv().await
    }

    /// Takes no more jobs: the worker finishes what is queued, hands it over and ends.
    pub(crate) fn close(&mut self) {
        self.tx = None;
    }
}

/// The worker: batches of queued jobs, one model call each, the vectors into the index, then
/// the entries back to the loop.
async fn work(
    mut rx: mpsc::Receiver<Job>,
    done: mpsc::Sender<(String, u64)>,
    service: Arc<Service>,
) {
    let mut jobs = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut jobs, BATCH).await > 0 {
        let texts: Vec<String> = jobs.iter().map(|j| j.query.clone()).collect();
        let embedder = service.embedder();
        let embedded = tokio::task::spawn_blocking(move || {
            embedder.map(|e| {
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                e.embed(&texts)
                    .map(|v| (v, e.model_id().to_owned()))
                    .map_err(|err| err.to_string())
            })
        })
        .await;
        let vectors = match embedded {
            Ok(Some(Ok((v, model)))) if v.len() == jobs.len() => Some((v, model)),
            Ok(Some(Ok(_))) => {
                tracing::warn!(
                    "embedding returned a wrong number of vectors; entries kept exact-only"
                );
                None
            }
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "embedding stored queries failed; entries kept exact-only");
                None
            }
            Ok(None) => None,
            Err(e) => {
                tracing::error!(error = %e, "cache store embedding task failed; entries kept exact-only");
                None
            }
        };
        if let Some((vectors, model)) = vectors {
            for (job, v) in jobs.iter().zip(vectors) {
                service.attach_vector(&job.key, job.stored_ms, index::encode_vector(&v), &model);
            }
        }
        for job in jobs.drain(..) {
            // The loop is gone only after it stopped taking these: nothing left to write.
            let _ = done.send((job.key, job.stored_ms)).await;
        }
    }
}

/// Stores one answer: prepared (hashing only) and indexed before the loop takes the next
/// message, so a lookup that follows its store finds it, then shared through KV. An entry that
/// wants its query embedded is written to KV once [`StoreEmbeddings`] is done with it
/// ([`put_current`]).
pub(crate) async fn store(
    service: &Arc<Service>,
    nats: &async_nats::Client,
    kv: &async_nats::jetstream::kv::Store,
    tasks: &tokio_util::task::TaskTracker,
    embeddings: &mut StoreEmbeddings,
    req: StoreRequest,
) {
    let Some((entry, unembedded)) = service.prepare_unembedded(&req) else {
        return;
    };
    let (key, stored_ms) = (entry.key.clone(), entry.stored_ms);
    let query = entry.query.clone().filter(|_| unembedded);
    // An entry that needs no vector is serialised before it moves into the index, so the hot
    // path (every exact-only store) copies nothing out of the index again.
    let body = if query.is_none() {
        encode(&entry)
    } else {
        None
    };
    // Indexed before it is queued, so the worker always finds it.
    let evicted = service.apply(entry);
    let queued = query.is_some_and(|q| embeddings.queue(&key, stored_ms, &q));
    if !evicted.is_empty() {
        let kv = kv.clone();
        tasks.spawn(async move {
            delete_keys(&kv, &evicted).await;
        });
    }
    match body {
        Some(body) => write(nats, kv, tasks, &key, body).await,
        // The queue was full: written as it is.
        None if !queued => put_current(service, nats, kv, tasks, &key, stored_ms).await,
        None => {}
    }
}

/// Writes the entry `key` stored at `stored_ms` to KV if the index still holds it unexpired (a
/// purge, eviction or newer store since wins).
pub(crate) async fn put_current(
    service: &Service,
    nats: &async_nats::Client,
    kv: &async_nats::jetstream::kv::Store,
    tasks: &tokio_util::task::TaskTracker,
    key: &str,
    stored_ms: u64,
) {
    if let Some(body) = service.current(key, stored_ms).as_ref().and_then(encode) {
        write(nats, kv, tasks, key, body).await;
    }
}

/// An entry's KV value (JSON); `None`, logged, when it cannot be serialised.
fn encode(entry: &index::Entry) -> Option<Vec<u8>> {
    serde_json::to_vec(entry)
        .inspect_err(|e| tracing::warn!(error = %e, "cache entry not serialisable"))
        .ok()
}

/// Writes `body` as KV key `key`: in the loop when that is only queueing a message, else (an
/// acknowledged put, with a JetStream domain) on a task, so the loop does not wait.
async fn write(
    nats: &async_nats::Client,
    kv: &async_nats::jetstream::kv::Store,
    tasks: &tokio_util::task::TaskTracker,
    key: &str,
    body: Vec<u8>,
) {
    if kv.use_jetstream_prefix {
        let (nats, kv, key) = (nats.clone(), kv.clone(), key.to_owned());
        tasks.spawn(async move { share_entry(&nats, &kv, &key, body).await });
    } else {
        share_entry(nats, kv, key, body).await;
    }
}

/// Writes an entry to the shared KV bucket, so the other cache instances learn it.
async fn share_entry(
    nats: &async_nats::Client,
    kv: &async_nats::jetstream::kv::Store,
    key: &str,
    body: Vec<u8>,
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
    use crate::service::tests::key;
    use crate::service::{ServiceOptions, run_with_ready};
    use futures::StreamExt as _;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;
    use switchyard_schemas::cache::{
        CacheOutcome, LookupReply, LookupRequest, PurgeReply, PurgeRequest, purge_subject,
    };
    use switchyard_schemas::subjects::Subjects;

    /// [`TrigramEmbedder`] behind a gate: every call waits until the test opens it.
    #[derive(Default)]
    struct Gated {
        open: Mutex<bool>,
        cv: Condvar,
        /// Texts embedded so far.
        texts: AtomicUsize,
    }

    impl Gated {
        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.cv.notify_all();
        }
    }

    impl Embed for Gated {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            let guard = self.open.lock().unwrap();
            drop(self.cv.wait_while(guard, |o| !*o).unwrap());
            self.texts.fetch_add(texts.len(), Ordering::SeqCst);
            TrigramEmbedder.embed(texts)
        }
        fn dims(&self) -> usize {
            TrigramEmbedder.dims()
        }
        fn model_id(&self) -> &str {
            TrigramEmbedder.model_id()
        }
    }

    /// A nats-server and a cache service whose model is a shut [`Gated`].
    struct Setup {
        _server: switchyard_natsd::NatsServer,
        nats: async_nats::Client,
        kv: async_nats::jetstream::kv::Store,
        gate: Arc<Gated>,
        stop: tokio::sync::oneshot::Sender<()>,
        service: tokio::task::JoinHandle<Result<(), crate::CacheError>>,
    }

    impl Setup {
        async fn start() -> Self {
            let server = switchyard_natsd::NatsServer::start_temp().unwrap();
            let nats = async_nats::connect(server.url()).await.unwrap();
            let gate = Arc::new(Gated::default());
            let opts = ServiceOptions::new(Subjects::default(), Some(gate.clone()));
            let (ready_tx, ready) = tokio::sync::oneshot::channel();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let service = tokio::spawn(run_with_ready(
                nats.clone(),
                opts,
                async {
                    let _ = stopped.await;
                },
                move || {
                    let _ = ready_tx.send(());
                },
            ));
            ready.await.unwrap();
            let js = async_nats::jetstream::new(nats.clone());
            let kv = js.get_key_value(crate::BUCKET).await.unwrap();
            Self {
                _server: server,
                nats,
                kv,
                gate,
                stop,
                service,
            }
        }

        async fn store(&self, text: &str) -> String {
            let store = crate::service::tests::store(text, 16);
            let body = serde_json::to_vec(&[&store]).unwrap();
            self.nats
                .publish(Subjects::default().cache_store(), body.into())
                .await
                .unwrap();
            crate::canon::canonical(&store.key).unwrap().exact
        }

        async fn stop(self) {
            self.stop.send(()).unwrap();
            self.service.await.unwrap().unwrap();
        }
    }

    async fn lookup(nats: &async_nats::Client, text: &str) -> LookupReply {
        let req = LookupRequest {
            key: key(text, 16),
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

    /// The next KV change of the bucket: (key, stored entry; `None` for a delete).
    async fn next_change(
        watch: &mut async_nats::jetstream::kv::Watch,
    ) -> (String, Option<crate::index::Entry>) {
        let e = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let entry = (e.operation == async_nats::jetstream::kv::Operation::Put)
            .then(|| serde_json::from_slice(&e.value).unwrap());
        (e.key, entry)
    }

    /// While a semantic route's store waits for its embedding, the exact layer answers it at
    /// once and a semantic lookup misses at once (nothing waits for the model); the entry reaches
    /// KV with its vector, and from then on the semantic layer finds it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_embedding_holds_up_no_lookup() {
        let s = Setup::start().await;
        let mut watch = s.kv.watch_all().await.unwrap();
        let text = "How do I turn on dark mode?";
        let entry_key = s.store(text).await;
        // The gate is shut: only answers that need no embedding can come back.
        let exact = lookup(&s.nats, text).await;
        assert_eq!(exact.outcome, CacheOutcome::Hit, "{:?}", exact.reason);
        let near = lookup(&s.nats, "how do I turn on dark mode").await;
        assert_eq!(near.outcome, CacheOutcome::Miss, "{:?}", near.reason);
        s.gate.open();
        // The first KV write of the entry already carries its vector.
        let (k, stored) = next_change(&mut watch).await;
        assert_eq!(k, entry_key);
        let stored = stored.unwrap();
        assert_eq!(stored.embed_model.as_deref(), Some("trigram:256"));
        assert!(stored.vector.is_some());
        let near = lookup(&s.nats, "how do I turn on dark mode").await;
        assert_eq!(near.outcome, CacheOutcome::SemanticHit, "{:?}", near.reason);
        assert_eq!(near.answer.unwrap().text(), format!("answer to {text}"));
        s.stop().await;
    }

    /// An entry purged while its embedding is pending does not come back: its embedding ends
    /// without a KV write (a store queued after it is written, and nothing of the purged one
    /// before it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_purge_during_a_pending_embedding_is_not_undone() {
        let s = Setup::start().await;
        let purged = s.store("What is Rust?").await;
        let req = serde_json::to_vec(&PurgeRequest {
            all: true,
            ..Default::default()
        })
        .unwrap();
        let reply = s
            .nats
            .request(purge_subject(&Subjects::default()), req.into())
            .await
            .unwrap();
        let reply: PurgeReply = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(reply.error, None);
        let mut watch = s.kv.watch_all().await.unwrap();
        let kept = s.store("What is Go?").await;
        s.gate.open();
        let (k, stored) = next_change(&mut watch).await;
        assert_eq!((k.as_str(), stored.is_some()), (kept.as_str(), true));
        assert_ne!(k, purged);
        let lookup_purged = lookup(&s.nats, "What is Rust?").await;
        assert_eq!(lookup_purged.outcome, CacheOutcome::Miss);
        s.stop().await;
    }
}
