//! Group commit (flat combining) of one process's operations on one KV entry.
//!
//! Callers queue an operation; the first one that finds no batch in progress becomes the
//! leader: it takes every queued operation, has [`Batch::apply`] apply them in arrival order to
//! the entry at a known revision, writes the result once with compare-and-set, and delivers
//! every answer. Callers that arrive meanwhile queue for the next batch. So a process makes one
//! write per batch instead of one per request, and the writers contending for an entry are the
//! processes sharing it. A conflict (another process wrote) re-reads the entry and re-applies
//! the whole batch after a jittered [`backoff`], until [`Batch::max_contention`] has passed.
//!
//! The leader's work runs in a task of the [`Combiners`]' tracker: the batch carries other
//! callers' operations, so it finishes even if the leading caller goes away.
//!
//! **Deferred operations** ([`Combiner::submit_deferred`]) do not start a batch: they wait for
//! the next one (ahead of its operations) or for a flush after a short delay, whichever comes
//! first. For operations nobody waits on the critical path — settlements after the answer was
//! sent — so under load they ride the next admission's write instead of costing one of their
//! own (one JetStream write and acknowledgement less per request).

use crate::cas::{KvError, Stored, WriteError, backoff, load, write};
use async_nats::jetstream::kv;
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

/// What one key's batches do: the policy and arithmetic of the entry; the combiner owns the
/// protocol. The value is only touched by the leader, so `&mut self` holds leader-only state
/// (e.g. a holder's own sum).
pub trait Batch: Send + 'static {
    /// The entry's JSON value.
    type Value: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// One queued operation.
    type Op: Send + 'static;
    /// The answer to one operation.
    type Answer: Send + 'static;

    /// How long compare-and-set conflicts are retried before every operation of the batch is
    /// answered [`KvError::Contention`].
    fn max_contention(&self) -> Duration;

    /// Conflicts in a row retried at once, before the jittered [`backoff`] starts (a sleep
    /// costs at least the timer's 1 ms tick; one writer losing to another seldom loses twice).
    fn immediate_retries(&self) -> u32 {
        0
    }

    /// The value to compute from, for the entry as read: the policy for an absent entry and
    /// for one that does not parse (`Err` fails the batch, e.g. fail closed).
    fn decode(&self, key: &str, stored: Stored<Self::Value>) -> Result<Self::Value, KvError>;

    /// Whether `op` is still applied when its caller no longer waits for the answer.
    fn needed_unawaited(&self, op: &Self::Op) -> bool;

    /// Applies `ops` in arrival order to `value`, the entry at the revision the write will
    /// replace; `fresh` when it was read from the store for this attempt (else it is what this
    /// process last wrote or read). Returns one answer per operation, in order.
    fn apply(
        &mut self,
        value: &mut Self::Value,
        ops: &[Self::Op],
        fresh: bool,
    ) -> Plan<Self::Answer>;

    /// The write of the last [`Self::apply`] was stored.
    fn committed(&mut self) {}

    /// `op` was applied but its caller had gone: an operation undoing it, if one is needed
    /// (applied in the next batch).
    fn undo(&self, op: Self::Op, answer: Self::Answer) -> Option<Self::Op>;

    /// The answer to an operation that could not be applied because of `e`.
    fn failed(&self, e: &KvError) -> Self::Answer;
}

/// What to do with an applied batch.
#[derive(Debug)]
pub enum Plan<A> {
    /// Write the new value, then deliver these answers.
    Write(Vec<A>),
    /// Nothing changed: deliver these answers without writing.
    Answer(Vec<A>),
    /// Read the entry again and re-apply (e.g. a refusal computed from a cached value must be
    /// confirmed). Returned for a fresh value it counts as a conflict.
    Refresh,
}

/// The leader of one batch finished without answering (its task panicked or was aborted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("batch aborted")]
pub struct Aborted;

/// A queued operation and where its answer goes.
type Queued<B> = (<B as Batch>::Op, oneshot::Sender<<B as Batch>::Answer>);
/// Where an operation's answer goes (`None`: an undo nobody waits for).
type Waiter<B> = Option<oneshot::Sender<<B as Batch>::Answer>>;

struct Leader<B: Batch> {
    kv: kv::Store,
    key: String,
    batch: B,
    /// `(revision, value)` last written or read.
    cached: Option<(u64, B::Value)>,
}

/// Operations waiting for the next batch.
struct Queue<B: Batch> {
    ops: Vec<Queued<B>>,
    /// When the scheduled flush of deferred operations runs, if one is.
    flush_at: Option<tokio::time::Instant>,
}

/// The combiner of one key.
pub struct Combiner<B: Batch> {
    queue: Arc<Mutex<Queue<B>>>,
    leader: Arc<tokio::sync::Mutex<Leader<B>>>,
    tasks: TaskTracker,
}

impl<B: Batch> Combiner<B> {
    /// Queues `op` and returns its answer, leading the batch when no other caller of this
    /// process is writing the entry.
    pub async fn submit(&self, op: B::Op) -> Result<B::Answer, Aborted> {
        let (tx, mut rx) = oneshot::channel();
        self.queue.lock().ops.push((op, tx));
        let guard = tokio::select! {
            biased;
            answer = &mut rx => return answer.map_err(|_| Aborted),
            guard = self.leader.clone().lock_owned() => guard,
        };
        if let Ok(answer) = rx.try_recv() {
            return Ok(answer);
        }
        let batch = std::mem::take(&mut self.queue.lock().ops);
        if !batch.is_empty() {
            let leader = self.tasks.spawn(async move {
                let mut guard = guard;
                guard.commit(batch).await;
            });
            let _ = leader.await;
        }
        rx.await.map_err(|_| Aborted)
    }

    /// Queues `op` for the next batch without starting one: it is applied ahead of the next
    /// [`Self::submit`]'s operations, or by a flush `within` after it was queued, whichever
    /// comes first. The answer arrives then. The flush runs in the tracker [`Combiners::close`]
    /// waits on.
    pub async fn submit_deferred(&self, op: B::Op, within: Duration) -> Result<B::Answer, Aborted> {
        let (tx, rx) = oneshot::channel();
        let at = tokio::time::Instant::now() + within;
        let arm = {
            let mut q = self.queue.lock();
            q.ops.push((op, tx));
            // A flush already due sooner takes this one too.
            let arm = q.flush_at.is_none_or(|t| t > at);
            if arm {
                q.flush_at = Some(at);
            }
            arm
        };
        if arm {
            let (leader, queue) = (self.leader.clone(), self.queue.clone());
            self.tasks.spawn(async move {
                tokio::time::sleep_until(at).await;
                let mut guard = leader.lock_owned().await;
                let batch = {
                    let mut q = queue.lock();
                    if q.flush_at == Some(at) {
                        q.flush_at = None;
                    }
                    std::mem::take(&mut q.ops)
                };
                if !batch.is_empty() {
                    guard.commit(batch).await;
                }
            });
        }
        rx.await.map_err(|_| Aborted)
    }

    /// Runs `f` on the key's leader-only state, between batches.
    pub async fn with_state<R>(&self, f: impl FnOnce(&mut B) -> R) -> R {
        f(&mut self.leader.lock().await.batch)
    }
}

impl<B: Batch> Leader<B> {
    async fn commit(&mut self, batch: Vec<Queued<B>>) {
        let (mut ops, mut waiters): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|(op, tx)| (op, Some(tx))).unzip();
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            // Nobody waits for these any more and they need not happen.
            let kept: Vec<_> = ops
                .drain(..)
                .zip(waiters.drain(..))
                .filter(|(op, w)| {
                    w.as_ref().is_some_and(|w| !w.is_closed()) || self.batch.needed_unawaited(op)
                })
                .collect();
            (ops, waiters) = kept.into_iter().unzip();
            if ops.is_empty() {
                return;
            }
            let (revision, mut value, fresh) = match self.cached.take() {
                Some((r, v)) => (r, v, false),
                None => {
                    let read = load(&self.kv, &self.key)
                        .await
                        .and_then(|(r, stored)| Ok((r, self.batch.decode(&self.key, stored)?)));
                    match read {
                        Ok((r, v)) => (r, v, true),
                        Err(e) => return self.fail(waiters, &e),
                    }
                }
            };
            let conflict = match self.batch.apply(&mut value, &ops, fresh) {
                Plan::Refresh if !fresh => continue,
                Plan::Refresh => true,
                Plan::Answer(answers) => {
                    self.cached = Some((revision, value));
                    (ops, waiters) = self.deliver(ops, waiters, answers);
                    continue;
                }
                Plan::Write(answers) => match write(&self.kv, &self.key, &value, revision).await {
                    Ok(new_revision) => {
                        self.batch.committed();
                        self.cached = Some((new_revision, value));
                        (ops, waiters) = self.deliver(ops, waiters, answers);
                        attempt = 0;
                        continue;
                    }
                    Err(WriteError::Conflict) => true,
                    Err(WriteError::Failed(e)) => return self.fail(waiters, &e),
                },
            };
            if conflict {
                if started.elapsed() >= self.batch.max_contention() {
                    tracing::warn!(key = %self.key, "KV compare-and-set contention for too long");
                    return self.fail(waiters, &KvError::Contention(self.key.clone()));
                }
                attempt += 1;
                match attempt.checked_sub(self.batch.immediate_retries()) {
                    Some(n) if n > 0 => backoff(n).await,
                    _ => tokio::task::yield_now().await,
                }
            }
        }
    }

    /// Sends every answer; returns the undo operations of answers nobody received.
    fn deliver(
        &self,
        ops: Vec<B::Op>,
        waiters: Vec<Waiter<B>>,
        answers: Vec<B::Answer>,
    ) -> (Vec<B::Op>, Vec<Waiter<B>>) {
        let mut undo = Vec::new();
        for ((op, waiter), answer) in ops.into_iter().zip(waiters).zip(answers) {
            if let Some(tx) = waiter
                && let Err(answer) = tx.send(answer)
            {
                undo.extend(self.batch.undo(op, answer));
            }
        }
        let none = undo.iter().map(|_| None).collect();
        (undo, none)
    }

    fn fail(&self, waiters: Vec<Waiter<B>>, e: &KvError) {
        for tx in waiters.into_iter().flatten() {
            let _ = tx.send(self.batch.failed(e));
        }
    }
}

/// The combiners of every key of one bucket in this process, and the tasks their leaders run
/// in.
pub struct Combiners<B: Batch> {
    kv: kv::Store,
    keys: Mutex<HashMap<String, Arc<Combiner<B>>>>,
    tasks: TaskTracker,
}

impl<B: Batch> Combiners<B> {
    /// Combiners writing to `kv`.
    pub fn new(kv: kv::Store) -> Self {
        Self {
            kv,
            keys: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
        }
    }

    /// The bucket.
    pub fn store(&self) -> &kv::Store {
        &self.kv
    }

    /// The combiner of `key`, created with `init` (its leader-only state) on first use.
    pub fn get(&self, key: &str, init: impl FnOnce() -> B) -> Arc<Combiner<B>> {
        self.keys
            .lock()
            .entry(key.to_owned())
            .or_insert_with(|| {
                Arc::new(Combiner {
                    queue: Arc::new(Mutex::new(Queue {
                        ops: Vec::new(),
                        flush_at: None,
                    })),
                    leader: Arc::new(tokio::sync::Mutex::new(Leader {
                        kv: self.kv.clone(),
                        key: key.to_owned(),
                        batch: init(),
                        cached: None,
                    })),
                    tasks: self.tasks.clone(),
                })
            })
            .clone()
    }

    /// Waits until every batch in progress has been written (shutdown).
    pub async fn close(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Runs `tick` every `period` on `tasks` until `stop` is cancelled (a missed tick is delayed, not
/// bunched): the lease renewals of budgets and limits. The caller's shutdown cancels `stop` and
/// waits on `tasks`.
pub fn every<F, Fut>(
    tasks: &TaskTracker,
    period: Duration,
    stop: tokio_util::sync::CancellationToken,
    mut tick: F,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tasks.spawn(async move {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = interval.tick() => tick().await,
            }
        }
    });
}
