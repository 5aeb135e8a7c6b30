//! The shared budget store: one JetStream KV entry per scope, written by group commit.
//!
//! Every ingress process is a *holder*. Its open reservations in a scope are stored as one sum
//! (`Spend::held[holder]`), and every change to the entry is a compare-and-set on the entry's
//! revision. Concurrent requests of one process for one scope are combined: the first caller
//! becomes the leader, takes every queued operation, applies them in arrival order to the
//! entry it last read, and writes once; the others receive their answers. So the number of
//! writers contending for an entry is the number of ingress processes, not the number of
//! requests, and a conflict (another process wrote) is retried with a short jittered backoff
//! for up to [`MAX_CONTENTION`] — contention never turns into a refusal.
//!
//! Exactness: each write is computed from the entry at the revision it replaces, and admits a
//! reservation only if `settled + every holder's held + demand ≤ limit` at that revision; a
//! write based on a stale revision is rejected by the server and recomputed. Holders write
//! their own sum absolutely (it is authoritative in the holder's memory), so a lost answer can
//! not double-release. A holder that dies leaves its sum until its `until_ms` (deadline + grace).

use crate::spend::{Demand, Exceeded, Spend};
use async_nats::jetstream::{self, kv};
use parking_lot::Mutex;
use rand::Rng;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::now_ms;
use switchyard_schemas::tenancy::Budget;
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

/// The KV bucket holding one [`Spend`] per key and tenant.
pub const BUDGETS_BUCKET: &str = "SY_BUDGETS";

/// How long a batch keeps retrying compare-and-set conflicts before giving up.
pub const MAX_CONTENTION: Duration = Duration::from_secs(10);

/// Limit on one KV round trip.
const KV_TIMEOUT: Duration = Duration::from_secs(5);

/// The budget store cannot be read or written (or an entry is unreadable: fail closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget store unavailable: {0}")]
pub struct Unavailable(pub String);

/// Why a reservation was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// A limit would be exceeded.
    #[error("budget exceeded: {0:?}")]
    Exceeded(Exceeded),
    /// The store cannot be reached.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
}

enum OpKind {
    Reserve {
        budget: Budget,
        demand: Demand,
        until_ms: u64,
    },
    Settle {
        reserved: Demand,
        actual: Demand,
    },
}

struct Op {
    kind: OpKind,
    done: Option<oneshot::Sender<Result<(), ReserveError>>>,
}

/// This holder's view of one scope; only the batch leader touches it.
#[derive(Default)]
struct Local {
    /// This holder's open reservations in the scope (authoritative).
    held: Demand,
    /// The latest `until_ms` of them.
    until_ms: u64,
    /// The entry as last written or read: `(revision, value)`.
    cached: Option<(u64, Spend)>,
}

struct Combiner {
    queue: Mutex<Vec<Op>>,
    local: Arc<tokio::sync::Mutex<Local>>,
}

/// Handle to [`BUDGETS_BUCKET`] for one holder. Cheap to clone.
#[derive(Clone)]
pub struct BudgetStore {
    inner: Arc<Inner>,
}

struct Inner {
    kv: Option<kv::Store>,
    holder: String,
    scopes: Mutex<HashMap<String, Arc<Combiner>>>,
    tasks: TaskTracker,
}

impl std::fmt::Debug for BudgetStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetStore")
            .field("holder", &self.inner.holder)
            .field("shared", &self.inner.kv.is_some())
            .finish()
    }
}

impl BudgetStore {
    /// Opens (or creates, in file storage) [`BUDGETS_BUCKET`] for `holder` (unique per process).
    /// Without JetStream the store is absent and every operation is [`Unavailable`].
    pub async fn connect(js: &jetstream::Context, holder: &str) -> Self {
        let kv = match js.get_key_value(BUDGETS_BUCKET).await {
            Ok(kv) => Some(kv),
            Err(_) => {
                let created = js
                    .create_key_value(kv::Config {
                        bucket: BUDGETS_BUCKET.to_owned(),
                        description:
                            "Switchyard budgets: settled spend and open reservations per scope"
                                .to_owned(),
                        history: 1,
                        // Monthly windows must outlive a quiet month's last write.
                        max_age: Duration::from_secs(40 * 24 * 3600),
                        storage: jetstream::stream::StorageType::File,
                        ..Default::default()
                    })
                    .await;
                match created {
                    Ok(kv) => Some(kv),
                    // Another replica may have created it in between.
                    Err(e) => js.get_key_value(BUDGETS_BUCKET).await.ok().or_else(|| {
                        tracing::warn!(error = %e, "no JetStream KV for budgets: callers with budgets are refused");
                        None
                    }),
                }
            }
        };
        Self {
            inner: Arc::new(Inner {
                kv,
                holder: holder.to_owned(),
                scopes: Mutex::new(HashMap::new()),
                tasks: TaskTracker::new(),
            }),
        }
    }

    /// This process's holder id.
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// Waits until every batch in progress has been written (shutdown).
    pub async fn close(&self) {
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    fn kv(&self) -> Result<&kv::Store, Unavailable> {
        self.inner
            .kv
            .as_ref()
            .ok_or_else(|| Unavailable("no JetStream KV".into()))
    }

    /// The current state of the entry `key` (`key.<id>` or `tenant.<id>`).
    pub async fn peek(&self, key: &str) -> Result<Spend, Unavailable> {
        let (_, s) = load(self.kv()?, key).await?;
        Ok(s.at(now_ms()))
    }

    /// Reserves `demand` in scope `key` under `budget` until `until_ms` (ms since the epoch).
    pub async fn reserve(
        &self,
        key: &str,
        budget: &Budget,
        demand: Demand,
        until_ms: u64,
    ) -> Result<(), ReserveError> {
        self.submit(
            key,
            OpKind::Reserve {
                budget: budget.clone(),
                demand,
                until_ms,
            },
        )
        .await
    }

    /// Releases a reservation of `reserved` in scope `key` and adds `actual` to its spend.
    pub async fn settle(
        &self,
        key: &str,
        reserved: Demand,
        actual: Demand,
    ) -> Result<(), Unavailable> {
        match self.submit(key, OpKind::Settle { reserved, actual }).await {
            Ok(()) => Ok(()),
            Err(ReserveError::Unavailable(e)) => Err(e),
            Err(ReserveError::Exceeded(_)) => Ok(()),
        }
    }

    /// Drops a reservation of `reserved` from this holder's sum without writing: its settlement
    /// is handed to [`Self::settle_late`] elsewhere, and the next write of this holder stores the
    /// lower sum.
    pub async fn forget(&self, key: &str, reserved: Demand) {
        let combiner = self.combiner(key);
        let mut local = combiner.local.lock().await;
        local.held = local.held.minus(reserved);
    }

    /// Adds `actual` to scope `key` for `request_id` once, however often it is called (the entry
    /// remembers the last [`crate::spend::LATE_IDS_KEPT`] ids). For settlements a holder could not
    /// write itself; the holder's reservation is released by the holder ([`Self::forget`]) or
    /// lapses with it.
    pub async fn settle_late(
        &self,
        key: &str,
        request_id: &str,
        actual: Demand,
    ) -> Result<(), Unavailable> {
        let kv = self.kv()?;
        let started = Instant::now();
        for attempt in 0u32.. {
            let (revision, stored) = load(kv, key).await?;
            let mut s = stored.at(now_ms());
            if !s.note_late(request_id) {
                return Ok(());
            }
            s.add(actual);
            match write(kv, key, &s, revision).await {
                Ok(_) => return Ok(()),
                Err(Write::Conflict) if started.elapsed() < MAX_CONTENTION => {
                    backoff(attempt).await;
                }
                Err(Write::Conflict) => break,
                Err(Write::Failed(e)) => return Err(e),
            }
        }
        Err(Unavailable("too much contention".into()))
    }

    fn combiner(&self, key: &str) -> Arc<Combiner> {
        self.inner
            .scopes
            .lock()
            .entry(key.to_owned())
            .or_insert_with(|| {
                Arc::new(Combiner {
                    queue: Mutex::new(Vec::new()),
                    local: Arc::new(tokio::sync::Mutex::new(Local::default())),
                })
            })
            .clone()
    }

    /// Queues `kind` for scope `key` and returns its answer, leading the batch when no other
    /// caller of this process is writing the entry.
    async fn submit(&self, key: &str, kind: OpKind) -> Result<(), ReserveError> {
        let kv = self.kv()?.clone();
        let combiner = self.combiner(key);
        let (tx, mut rx) = oneshot::channel();
        combiner.queue.lock().push(Op {
            kind,
            done: Some(tx),
        });
        let local = combiner.local.clone().lock_owned().await;
        if let Ok(answer) = rx.try_recv() {
            // A leader before us took our operation.
            return answer;
        }
        let batch = std::mem::take(&mut *combiner.queue.lock());
        let (holder, key) = (self.inner.holder.clone(), key.to_owned());
        // The batch carries other callers' operations: finish it even if this caller goes away.
        let leader = self.inner.tasks.spawn(async move {
            let mut local = local;
            commit(&kv, &holder, &key, &mut local, batch).await;
        });
        let _ = leader.await;
        rx.await
            .unwrap_or_else(|_| Err(Unavailable("budget batch aborted".into()).into()))
    }
}

/// Applies `batch` to the entry in one compare-and-set, retrying on conflict; answers every
/// operation. A reservation whose caller went away before its answer is released again.
async fn commit(kv: &kv::Store, holder: &str, key: &str, local: &mut Local, mut batch: Vec<Op>) {
    let started = Instant::now();
    let mut attempt = 0u32;
    while !batch.is_empty() {
        // Nobody waits for these any more: do not reserve for them.
        batch.retain(|op| {
            !matches!(op.kind, OpKind::Reserve { .. })
                || op.done.as_ref().is_some_and(|d| !d.is_closed())
        });
        let (revision, stored) = match local.cached.take() {
            Some(c) => c,
            None => match load(kv, key).await {
                Ok(c) => c,
                Err(e) => return answer_all(batch, &e),
            },
        };
        let now = now_ms();
        let mut s = stored.at(now);
        let others = s.held_by_others(holder);
        let (mut mine, mut until) = (local.held, local.until_ms);
        let mut results = Vec::with_capacity(batch.len());
        for op in &batch {
            results.push(match &op.kind {
                OpKind::Settle { reserved, actual } => {
                    mine = mine.minus(*reserved);
                    s.add(*actual);
                    Ok(())
                }
                OpKind::Reserve {
                    budget,
                    demand,
                    until_ms,
                } => match s.exceeded(budget, others.plus(mine), *demand) {
                    Some(e) => Err(ReserveError::Exceeded(e)),
                    None => {
                        mine = mine.plus(*demand);
                        until = until.max(*until_ms);
                        Ok(())
                    }
                },
            });
        }
        s.set_held(holder, mine, until);
        match write(kv, key, &s, revision).await {
            Ok(new_revision) => {
                local.held = mine;
                local.until_ms = until;
                local.cached = Some((new_revision, s));
                let mut release = Vec::new();
                for (mut op, result) in batch.drain(..).zip(results) {
                    let reserved = match (&op.kind, &result) {
                        (OpKind::Reserve { demand, .. }, Ok(())) => Some(*demand),
                        _ => None,
                    };
                    let delivered = op.done.take().is_some_and(|d| d.send(result).is_ok());
                    if let (Some(demand), false) = (reserved, delivered) {
                        release.push(Op {
                            kind: OpKind::Settle {
                                reserved: demand,
                                actual: Demand::default(),
                            },
                            done: None,
                        });
                    }
                }
                batch = release;
                attempt = 0;
            }
            Err(Write::Conflict) if started.elapsed() < MAX_CONTENTION => {
                attempt += 1;
                backoff(attempt).await;
            }
            Err(Write::Conflict) => {
                tracing::warn!(key, "budget store: compare-and-set contention for too long");
                return answer_all(batch, &Unavailable("contention".into()));
            }
            Err(Write::Failed(e)) => return answer_all(batch, &e),
        }
    }
}

fn answer_all(batch: Vec<Op>, e: &Unavailable) {
    for mut op in batch {
        if let Some(d) = op.done.take() {
            let _ = d.send(Err(e.clone().into()));
        }
    }
}

/// Up to 2^min(attempt, 5) × 100 µs, random: replicas that collided do not collide again.
async fn backoff(attempt: u32) {
    let cap = 100u64 << attempt.min(5);
    let us = rand::rng().random_range(0..=cap);
    tokio::time::sleep(Duration::from_micros(us)).await;
}

enum Write {
    Conflict,
    Failed(Unavailable),
}

async fn write(kv: &kv::Store, key: &str, s: &Spend, revision: u64) -> Result<u64, Write> {
    let bytes = serde_json::to_vec(s).map_err(|e| Write::Failed(Unavailable(e.to_string())))?;
    match tokio::time::timeout(KV_TIMEOUT, kv.update(key, bytes.into(), revision)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Err(Write::Conflict),
        Ok(Err(e)) => {
            tracing::warn!(key, error = %e, "budget store write failed");
            Err(Write::Failed(Unavailable(e.to_string())))
        }
        Err(_) => Err(Write::Failed(Unavailable("write timed out".into()))),
    }
}

/// `(revision, state)` of `key`; revision 0 = absent (then `update` creates it). An entry that
/// does not parse fails closed: admitting against an unknown spend could overspend.
async fn load(kv: &kv::Store, key: &str) -> Result<(u64, Spend), Unavailable> {
    match tokio::time::timeout(KV_TIMEOUT, kv.entry(key)).await {
        Ok(Ok(Some(e))) if e.operation == kv::Operation::Put => {
            match serde_json::from_slice(&e.value) {
                Ok(s) => Ok((e.revision, s)),
                Err(err) => {
                    tracing::error!(key, error = %err, "budget entry unreadable: refusing its callers until it is repaired or deleted");
                    Err(Unavailable(format!("entry `{key}` unreadable: {err}")))
                }
            }
        }
        Ok(Ok(Some(e))) => Ok((e.revision, Spend::default())),
        Ok(Ok(None)) => Ok((0, Spend::default())),
        Ok(Err(e)) => {
            tracing::warn!(key, error = %e, "budget store read failed");
            Err(Unavailable(e.to_string()))
        }
        Err(_) => Err(Unavailable("read timed out".into())),
    }
}
