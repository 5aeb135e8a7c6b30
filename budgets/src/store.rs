//! The shared budget store: one JetStream KV entry per scope, written by group commit.
//!
//! Every ingress process is a *holder*. Its open reservations in a scope are stored as one sum
//! (`Spend::held[holder]`), and every change to the entry is a compare-and-set on the entry's
//! revision. Concurrent requests of one process for one scope are combined
//! ([`switchyard_kv::combine`]): the first caller becomes the leader, takes every queued
//! operation, applies them in arrival order to the entry it last read, and writes once; the
//! others receive their answers. So the number of
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
use rust_decimal::Decimal;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_kv::combine::{Batch, Combiner, Combiners, Plan};
use switchyard_kv::{KvError, Stored, WriteError, backoff, load, write};
use switchyard_schemas::now_ms;
use switchyard_schemas::tenancy::Budget;

/// The KV bucket holding one [`Spend`] per key and tenant.
pub const BUDGETS_BUCKET: &str = "SY_BUDGETS";

/// How long a batch keeps retrying compare-and-set conflicts before giving up.
pub const MAX_CONTENTION: Duration = Duration::from_secs(10);
/// Longest a settlement waits to ride the next reservation's write of its scope before it is
/// written on its own. Until then the scope counts the reservation (≥ the charge) as held:
/// other replicas see the spend up to this much later, never less of it. In this process the
/// next reservation applies it first, so admission here is as if it were written at once.
pub const SETTLE_WITHIN: Duration = Duration::from_millis(10);

/// The budget store cannot be read or written (or an entry is unreadable: fail closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget store unavailable: {0}")]
pub struct Unavailable(pub String);

impl From<&KvError> for Unavailable {
    fn from(e: &KvError) -> Self {
        match e {
            KvError::Contention(_) => Self("contention".into()),
            e => Self(e.to_string()),
        }
    }
}

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

/// What a reservation must fit in.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit {
    /// A key's or tenant's calendar budget and token quotas.
    Budget(Budget),
    /// A tenant's prepaid balance, whose top-ups are in the entry itself
    /// ([`crate::spend::Prepaid`]).
    Balance,
}

enum OpKind {
    Reserve {
        limit: Limit,
        demand: Demand,
        until_ms: u64,
    },
    Settle {
        reserved: Demand,
        actual: Demand,
    },
}

/// This holder's view of one scope; only the batch leader touches it.
struct Scope {
    holder: String,
    /// This holder's open reservations in the scope (authoritative).
    held: Demand,
    /// The latest `until_ms` of them.
    until_ms: u64,
    /// `held` and `until_ms` as the batch being written would leave them.
    next: (Demand, u64),
}

impl Batch for Scope {
    type Value = Spend;
    type Op = OpKind;
    type Answer = Result<(), ReserveError>;

    fn max_contention(&self) -> Duration {
        MAX_CONTENTION
    }

    fn decode(&self, key: &str, stored: Stored<Spend>) -> Result<Spend, KvError> {
        decode(key, stored)
    }

    /// Nobody waits for an abandoned reservation: do not reserve for it. Settlements happen.
    fn needed_unawaited(&self, op: &OpKind) -> bool {
        matches!(op, OpKind::Settle { .. })
    }

    fn apply(&mut self, value: &mut Spend, ops: &[OpKind], _fresh: bool) -> Plan<Self::Answer> {
        let mut s = std::mem::take(value).at(now_ms());
        let others = s.held_by_others(&self.holder);
        let (mut mine, mut until) = (self.held, self.until_ms);
        let results = ops
            .iter()
            .map(|op| match op {
                OpKind::Settle { reserved, actual } => {
                    mine = mine.minus(*reserved);
                    s.add(*actual);
                    Ok(())
                }
                OpKind::Reserve {
                    limit,
                    demand,
                    until_ms,
                } => match match limit {
                    Limit::Budget(budget) => s.exceeded(budget, others.plus(mine), *demand),
                    Limit::Balance => s.exceeded_balance(others.plus(mine), *demand),
                } {
                    Some(e) => Err(ReserveError::Exceeded(e)),
                    None => {
                        mine = mine.plus(*demand);
                        until = until.max(*until_ms);
                        Ok(())
                    }
                },
            })
            .collect();
        s.set_held(&self.holder, mine, until);
        *value = s;
        self.next = (mine, until);
        Plan::Write(results)
    }

    fn committed(&mut self) {
        (self.held, self.until_ms) = self.next;
    }

    /// A reservation whose caller went away before its answer is released again.
    fn undo(&self, op: OpKind, answer: Self::Answer) -> Option<OpKind> {
        match (op, answer) {
            (OpKind::Reserve { demand, .. }, Ok(())) => Some(OpKind::Settle {
                reserved: demand,
                actual: Demand::default(),
            }),
            _ => None,
        }
    }

    fn failed(&self, e: &KvError) -> Self::Answer {
        Err(Unavailable::from(e).into())
    }
}

/// An absent entry is no spend; one that does not parse fails closed: admitting against an
/// unknown spend could overspend.
fn decode(key: &str, stored: Stored<Spend>) -> Result<Spend, KvError> {
    match stored {
        Stored::Value(s) => Ok(s),
        Stored::Absent => Ok(Spend::default()),
        Stored::Unreadable(reason) => {
            tracing::error!(key, error = %reason, "budget entry unreadable: refusing its callers until it is repaired or deleted");
            Err(KvError::Unreadable {
                key: key.to_owned(),
                reason,
            })
        }
    }
}

/// Handle to [`BUDGETS_BUCKET`] for one holder. Cheap to clone.
#[derive(Clone)]
pub struct BudgetStore {
    inner: Arc<Inner>,
}

struct Inner {
    scopes: Option<Combiners<Scope>>,
    holder: String,
}

impl std::fmt::Debug for BudgetStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetStore")
            .field("holder", &self.inner.holder)
            .field("shared", &self.inner.scopes.is_some())
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
                    .create_key_value(switchyard_schemas::replicas::kv(kv::Config {
                        bucket: BUDGETS_BUCKET.to_owned(),
                        description:
                            "Switchyard budgets: settled spend and open reservations per scope"
                                .to_owned(),
                        history: 1,
                        // Monthly windows must outlive a quiet month's last write.
                        max_age: Duration::from_secs(40 * 24 * 3600),
                        storage: jetstream::stream::StorageType::File,
                        ..Default::default()
                    }))
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
                scopes: kv.map(Combiners::new),
                holder: holder.to_owned(),
            }),
        }
    }

    /// This process's holder id.
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// Waits until every batch in progress has been written (shutdown).
    pub async fn close(&self) {
        if let Some(scopes) = &self.inner.scopes {
            scopes.close().await;
        }
    }

    fn scopes(&self) -> Result<&Combiners<Scope>, Unavailable> {
        self.inner
            .scopes
            .as_ref()
            .ok_or_else(|| Unavailable("no JetStream KV".into()))
    }

    /// Whether the bucket holds no entry at all (a lost bucket re-created empty, or a new
    /// installation): billing then rebuilds it from the ledger.
    pub async fn is_empty(&self) -> Result<bool, Unavailable> {
        // The bucket's stream info (no consumer: billing's NATS identity may not create one).
        let status = self
            .scopes()?
            .store()
            .status()
            .await
            .map_err(|e| Unavailable(e.to_string()))?;
        Ok(status.values() == 0)
    }

    /// Writes `spend` as the state of `key` (`key.<id>` / `tenant.<id>`), for a rebuild from the
    /// ledger: only when the entry is absent unless `overwrite` (which also drops the open
    /// reservations held in it). Returns whether it was written.
    pub async fn seed(
        &self,
        key: &str,
        spend: &Spend,
        overwrite: bool,
    ) -> Result<bool, Unavailable> {
        let store = self.scopes()?.store();
        let json = serde_json::to_vec(spend).map_err(|e| Unavailable(e.to_string()))?;
        if overwrite {
            store
                .put(key, json.into())
                .await
                .map_err(|e| Unavailable(e.to_string()))?;
            return Ok(true);
        }
        match store.create(key, json.into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Unavailable(e.to_string())),
        }
    }

    /// The current state of the entry `key` (`key.<id>` or `tenant.<id>`).
    pub async fn peek(&self, key: &str) -> Result<Spend, Unavailable> {
        let s = self.read(key).await?.1;
        Ok(s.at(now_ms()))
    }

    async fn read(&self, key: &str) -> Result<(u64, Spend), Unavailable> {
        let (revision, stored) = load(self.scopes()?.store(), key)
            .await
            .map_err(|e| Unavailable::from(&e))?;
        let s = decode(key, stored).map_err(|e| Unavailable::from(&e))?;
        Ok((revision, s))
    }

    /// Reserves `demand` in scope `key` under `budget` until `until_ms` (ms since the epoch).
    pub async fn reserve(
        &self,
        key: &str,
        budget: &Budget,
        demand: Demand,
        until_ms: u64,
    ) -> Result<(), ReserveError> {
        self.reserve_within(key, Limit::Budget(budget.clone()), demand, until_ms)
            .await
    }

    /// Reserves `demand` in scope `key` within `limit` until `until_ms` (ms since the epoch).
    pub async fn reserve_within(
        &self,
        key: &str,
        limit: Limit,
        demand: Demand,
        until_ms: u64,
    ) -> Result<(), ReserveError> {
        self.submit(
            key,
            OpKind::Reserve {
                limit,
                demand,
                until_ms,
            },
        )
        .await
    }

    /// Raises the prepaid balance in entry `key` (`balance.<tenant>`) to `topped_up_usd`, the
    /// ledger's sum of the tenant's top-ups, by compare-and-set; a lower value changes nothing
    /// (top-ups only add, so the highest sum read is the newest). An entry without a balance
    /// starts with `spent_if_new` spent (the ledger's charges since the first top-up). Returns
    /// the entry after it.
    pub async fn raise_balance(
        &self,
        key: &str,
        topped_up_usd: Decimal,
        spent_if_new: Decimal,
    ) -> Result<Spend, Unavailable> {
        let kv = self.scopes()?.store();
        let started = Instant::now();
        for attempt in 0u32.. {
            let (revision, stored) = self.read(key).await?;
            let mut s = stored.at(now_ms());
            if !s.raise_topped_up(topped_up_usd, spent_if_new) {
                return Ok(s);
            }
            match write(kv, key, &s, revision).await {
                Ok(_) => return Ok(s),
                Err(WriteError::Conflict) if started.elapsed() < MAX_CONTENTION => {
                    backoff(attempt).await;
                }
                Err(WriteError::Conflict) => break,
                Err(WriteError::Failed(e)) => return Err(Unavailable::from(&e)),
            }
        }
        Err(Unavailable("too much contention".into()))
    }

    /// Releases a reservation of `reserved` in scope `key` and adds `actual` to its spend.
    pub async fn settle(
        &self,
        key: &str,
        reserved: Demand,
        actual: Demand,
    ) -> Result<(), Unavailable> {
        let settle = OpKind::Settle { reserved, actual };
        let answer = self
            .scope(self.scopes()?, key)
            .submit_deferred(settle, SETTLE_WITHIN)
            .await
            .unwrap_or_else(|_| Err(Unavailable("budget batch aborted".into()).into()));
        match answer {
            Ok(()) => Ok(()),
            Err(ReserveError::Unavailable(e)) => Err(e),
            Err(ReserveError::Exceeded(_)) => Ok(()),
        }
    }

    /// Drops a reservation of `reserved` from this holder's sum without writing: its settlement
    /// is handed to [`Self::settle_late`] elsewhere, and the next write of this holder stores the
    /// lower sum.
    pub async fn forget(&self, key: &str, reserved: Demand) {
        if let Ok(scopes) = self.scopes() {
            self.scope(scopes, key)
                .with_state(|s| s.held = s.held.minus(reserved))
                .await;
        }
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
        let kv = self.scopes()?.store();
        let started = Instant::now();
        for attempt in 0u32.. {
            let (revision, stored) = self.read(key).await?;
            let mut s = stored.at(now_ms());
            if !s.note_late(request_id) {
                return Ok(());
            }
            s.add(actual);
            match write(kv, key, &s, revision).await {
                Ok(_) => return Ok(()),
                Err(WriteError::Conflict) if started.elapsed() < MAX_CONTENTION => {
                    backoff(attempt).await;
                }
                Err(WriteError::Conflict) => break,
                Err(WriteError::Failed(e)) => return Err(Unavailable::from(&e)),
            }
        }
        Err(Unavailable("too much contention".into()))
    }

    fn scope(&self, scopes: &Combiners<Scope>, key: &str) -> Arc<Combiner<Scope>> {
        scopes.get(key, || Scope {
            holder: self.inner.holder.clone(),
            held: Demand::default(),
            until_ms: 0,
            next: (Demand::default(), 0),
        })
    }

    /// Queues `kind` for scope `key` and returns its answer, leading the batch when no other
    /// caller of this process is writing the entry.
    async fn submit(&self, key: &str, kind: OpKind) -> Result<(), ReserveError> {
        self.scope(self.scopes()?, key)
            .submit(kind)
            .await
            .unwrap_or_else(|_| Err(Unavailable("budget batch aborted".into()).into()))
    }
}
