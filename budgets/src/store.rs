//! The shared budget store: one JetStream KV entry per scope, written by group commit, drawn
//! from through per-holder leases.
//!
//! Every ingress process is a *holder*. Its open reservations in a scope are stored as one sum
//! (`Spend::held[holder]`), and every change to the entry is a compare-and-set on the entry's
//! revision. Concurrent requests of one process for one scope are combined
//! ([`switchyard_kv::combine`]): the first caller becomes the leader, takes every queued
//! operation, applies them in arrival order to the entry it last read, and writes once; the
//! others receive their answers. So the number of writers contending for an entry is the number
//! of ingress processes, not the number of requests, and a conflict (another process wrote) is
//! retried with a short jittered backoff for up to [`MAX_CONTENTION`] — contention never turns
//! into a refusal.
//!
//! **Leases.** A write that admits a reservation also reserves some spare room for the holder
//! (at most [`LEASE_REQUESTS`] requests' worth and [`LEASE_SHARE`] of what is left), stored in
//! its sum like a reservation. Later reservations that fit the spare are admitted in memory,
//! without a write; the next write (a settlement, a renewal, or a reservation the spare cannot
//! hold) stores the holder's actual sum plus a new spare. An idle holder returns its spare
//! within [`RENEW_EVERY`].
//!
//! Exactness: each write is computed from the entry at the revision it replaces, and admits a
//! reservation only if `settled + every holder's held + demand ≤ limit` at that revision; a
//! write based on a stale revision is rejected by the server and recomputed. The spare counts
//! in `held`, so a reservation admitted from it was counted in every decision of every holder
//! since the write that leased it. A holder writes its own sum absolutely (authoritative in its
//! memory), so a lost answer cannot double-release. A refusal is final only when no other holder
//! has spare room: otherwise the refused holder flags the entry `reclaim` (no holder leases
//! while it is set, so each returns its spare at its next write, at the latest within
//! [`RENEW_EVERY`]) and retries for up to [`RECLAIM_WAIT`]. A holder that dies leaves its sum
//! until its `until_ms` (deadline + grace, + [`LEASE_EXTRA`] for a lease).

use crate::spend::{Demand, Exceeded, Room, Spend};
use async_nats::jetstream::{self, kv};
use parking_lot::Mutex;
use rust_decimal::Decimal;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use switchyard_kv::combine::{Batch, Combiner, Combiners, Plan};
use switchyard_kv::{KvError, Stored, WriteError, backoff, load, write};
use switchyard_schemas::now_ms;
use switchyard_schemas::tenancy::Budget;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The KV bucket holding one [`Spend`] per key and tenant.
pub const BUDGETS_BUCKET: &str = "SY_BUDGETS";

/// How long a batch keeps retrying compare-and-set conflicts before giving up.
pub const MAX_CONTENTION: Duration = Duration::from_secs(10);
/// Longest a settlement waits to ride the next write of its scope before it is written on its
/// own. Until then the scope counts the reservation (≥ the charge) as held: other replicas see
/// the spend up to this much later, never less of it.
pub const SETTLE_WITHIN: Duration = Duration::from_millis(20);
/// A lease is at most this many requests' worth (of the latest request's demand).
pub const LEASE_REQUESTS: u32 = 64;
/// A lease is at most this share of the room left in the scope, so holders leave each other
/// room and leases shrink as the limit nears.
pub const LEASE_SHARE: Decimal = Decimal::from_parts(125, 0, 0, false, 3);
/// A holder with spare room writes (returning it if idle, renewing it if not) at least this
/// often; a `reclaim` flag reaches it within this.
pub const RENEW_EVERY: Duration = Duration::from_millis(50);
/// How long a request that does not fit while other holders have spare room waits for them to
/// return it before it is refused anyway (a holder that died keeps its spare until it lapses).
pub const RECLAIM_WAIT: Duration = Duration::from_millis(400);
/// A lease lapses this long after the latest deadline (+ grace) of the requests it was written
/// for, so requests admitted from it later are still covered if the holder dies.
pub const LEASE_EXTRA: Duration = Duration::from_secs(30);

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

impl Limit {
    fn exceeded(&self, s: &Spend, held: Demand, demand: Demand) -> Option<Exceeded> {
        match self {
            Limit::Budget(budget) => s.exceeded(budget, held, demand),
            Limit::Balance => s.exceeded_balance(held, demand),
        }
    }

    fn room(&self, s: &Spend, held: Demand) -> Room {
        match self {
            Limit::Budget(budget) => s.room(budget, held),
            Limit::Balance => s.room_balance(held),
        }
    }
}

enum OpKind {
    Reserve {
        limit: Limit,
        demand: Demand,
        until_ms: u64,
        /// Whether a refusal while others hold spare room may ask them to return it.
        may_reclaim: bool,
    },
    Settle {
        reserved: Demand,
        actual: Demand,
    },
    /// Rewrite this holder's sum and lease (return an idle holder's spare).
    Renew,
}

/// The answer to one operation inside the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Done,
    Refused(ReserveError),
    /// Did not fit, but other holders have spare room: flagged `reclaim`; try again shortly.
    Reclaim,
}

/// This holder's lease in one scope, shared by the fast path and the batch leader.
#[derive(Debug, Default)]
struct Lease {
    /// Open reservations of this holder in the scope (authoritative).
    used: Demand,
    /// What may still be admitted without a write (the stored sum covers `used + spare`).
    spare: Demand,
    /// The limit the stored lease was computed under: the fast path serves only it.
    limit: Option<Limit>,
    /// The stored sum's `until_ms`: the fast path admits only requests lapsing before it.
    until_ms: u64,
    /// The spare room as stored (what other holders see).
    stored_spare: Demand,
    /// Reservations admitted since the last write (an active holder renews its lease).
    admitted: u32,
    /// The latest reservation: the unit a lease is sized in, and how far ahead it lapsed.
    unit: Demand,
    ahead_ms: u64,
    /// When the sum was last written.
    written_at: Option<Instant>,
}

impl Lease {
    fn fits(&self, limit: &Limit, demand: Demand, until_ms: u64) -> bool {
        self.limit.as_ref() == Some(limit)
            && until_ms <= self.until_ms
            && demand.usd <= self.spare.usd
            && demand.tokens <= self.spare.tokens
    }
}

/// What the batch being written will leave: applied by [`Batch::committed`].
#[derive(Debug)]
struct Staged {
    plus: Demand,
    minus: Demand,
    stored: Demand,
    spare: Demand,
    limit: Option<Limit>,
    until_ms: u64,
}

/// This holder's view of one scope; only the batch leader touches it (and `lease` under its lock).
struct Scope {
    holder: String,
    lease: Arc<Mutex<Lease>>,
    /// No more leases (shutdown).
    closing: Arc<AtomicBool>,
    staged: Option<Staged>,
}

/// `want` capped by `room` per dimension; zero where the room cannot hold one more `unit`.
fn grant(room: Room, unit: Demand) -> Demand {
    let most = Demand {
        usd: unit.usd * Decimal::from(LEASE_REQUESTS),
        tokens: unit.tokens * u64::from(LEASE_REQUESTS),
    };
    let usd = room
        .usd
        .map_or(most.usd, |r| (r * LEASE_SHARE).min(most.usd));
    let tokens = room.tokens.map_or(most.tokens, |r| {
        ((r as f64 * 0.125) as u64).min(most.tokens)
    });
    if usd < unit.usd || tokens < unit.tokens {
        return Demand::default();
    }
    Demand { usd, tokens }
}

/// Whether the scope has room for full leases again (the `reclaim` flag can be cleared).
fn ample(room: Room, unit: Demand) -> bool {
    let full = Decimal::from(LEASE_REQUESTS) / LEASE_SHARE;
    room.usd.is_none_or(|r| r >= unit.usd * full)
        && room
            .tokens
            .is_none_or(|r| r as f64 >= unit.tokens as f64 * 8.0 * f64::from(LEASE_REQUESTS))
}

impl Batch for Scope {
    type Value = Spend;
    type Op = OpKind;
    type Answer = Answer;

    fn max_contention(&self) -> Duration {
        MAX_CONTENTION
    }

    fn decode(&self, key: &str, stored: Stored<Spend>) -> Result<Spend, KvError> {
        decode(key, stored)
    }

    /// Nobody waits for an abandoned reservation: do not reserve for it. Settlements and
    /// renewals happen.
    fn needed_unawaited(&self, op: &OpKind) -> bool {
        !matches!(op, OpKind::Reserve { .. })
    }

    fn apply(&mut self, value: &mut Spend, ops: &[OpKind], fresh: bool) -> Plan<Answer> {
        let now = now_ms();
        let mut s = std::mem::take(value).at(now);
        let before = (s.held.get(&self.holder).copied(), s.reclaim);
        let others = s.held_by_others(&self.holder);
        let others_spare = s.spare_of_others(&self.holder);
        let mut lease = self.lease.lock();
        let (mut mine, mut until) = (lease.used, lease.until_ms);
        let (mut plus, mut minus) = (Demand::default(), Demand::default());
        let mut limit = lease.limit.clone();
        let mut active = lease.admitted > 0;
        let mut settled = false;
        let results: Vec<Answer> = ops
            .iter()
            .map(|op| match op {
                OpKind::Settle { reserved, actual } => {
                    mine = mine.minus(*reserved);
                    minus = minus.plus(*reserved);
                    s.add(*actual);
                    settled = true;
                    Answer::Done
                }
                OpKind::Renew => Answer::Done,
                OpKind::Reserve {
                    limit: l,
                    demand,
                    until_ms,
                    may_reclaim,
                } => match l.exceeded(&s, others.plus(mine), *demand) {
                    None => {
                        mine = mine.plus(*demand);
                        plus = plus.plus(*demand);
                        until = until.max(*until_ms);
                        lease.unit = *demand;
                        lease.ahead_ms = until_ms.saturating_sub(now);
                        limit = Some(l.clone());
                        active = true;
                        Answer::Done
                    }
                    Some(e) => {
                        let without_spare = others.minus(others_spare).plus(mine);
                        if *may_reclaim
                            && !others_spare.is_zero()
                            && l.exceeded(&s, without_spare, *demand).is_none()
                        {
                            s.reclaim = true;
                            Answer::Reclaim
                        } else {
                            Answer::Refused(ReserveError::Exceeded(e))
                        }
                    }
                },
            })
            .collect();
        // The new lease: none while reclaiming, idle or closing; else sized to the room left.
        let mut spare = Demand::default();
        if let Some(l) = &limit {
            let room = l.room(&s, others.plus(mine));
            if s.reclaim && ample(room, lease.unit) {
                s.reclaim = false;
            }
            if active && !s.reclaim && !self.closing.load(Ordering::Relaxed) {
                spare = grant(room, lease.unit);
            }
        }
        let stored = mine.plus(spare);
        let until_ms = if spare.is_zero() {
            until
        } else {
            until.max(now + lease.ahead_ms + LEASE_EXTRA.as_millis() as u64)
        };
        s.set_lease(&self.holder, stored, spare, until_ms);
        // While this write is in flight the fast path may use only what both leases allow.
        lease.spare = Demand {
            usd: lease.spare.usd.min(spare.usd),
            tokens: lease.spare.tokens.min(spare.tokens),
        };
        drop(lease);
        let unchanged =
            !settled && plus.is_zero() && (s.held.get(&self.holder).copied(), s.reclaim) == before;
        *value = s;
        self.staged = Some(Staged {
            plus,
            minus,
            stored,
            spare,
            limit,
            until_ms,
        });
        let refused = results.iter().any(|a| !matches!(a, Answer::Done));
        if refused && !fresh {
            // A refusal computed from a cached entry must be confirmed by a fresh read.
            self.staged = None;
            return Plan::Refresh;
        }
        if unchanged {
            self.committed();
            return Plan::Answer(results);
        }
        Plan::Write(results)
    }

    fn committed(&mut self) {
        let Some(st) = self.staged.take() else { return };
        let mut lease = self.lease.lock();
        lease.used = lease.used.plus(st.plus).minus(st.minus);
        lease.spare = st.stored.minus(lease.used);
        lease.stored_spare = st.spare;
        lease.limit = st.limit;
        lease.until_ms = st.until_ms;
        lease.admitted = 0;
        lease.written_at = Some(Instant::now());
    }

    /// A reservation whose caller went away before its answer is released again.
    fn undo(&self, op: OpKind, answer: Answer) -> Option<OpKind> {
        match (op, answer) {
            (OpKind::Reserve { demand, .. }, Answer::Done) => Some(OpKind::Settle {
                reserved: demand,
                actual: Demand::default(),
            }),
            _ => None,
        }
    }

    fn failed(&self, e: &KvError) -> Answer {
        Answer::Refused(Unavailable::from(e).into())
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
    /// This holder's lease per scope key.
    leases: Mutex<HashMap<String, Arc<Mutex<Lease>>>>,
    closing: Arc<AtomicBool>,
    /// The renewal ticker ([`BudgetStore::renew_due`]); stopped by [`BudgetStore::close`].
    ticker: TaskTracker,
    stop: CancellationToken,
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
        let config = switchyard_schemas::replicas::kv(kv::Config {
            bucket: BUDGETS_BUCKET.to_owned(),
            description: "Switchyard budgets: settled spend and open reservations per scope"
                .to_owned(),
            history: 1,
            // Monthly windows must outlive a quiet month's last write.
            max_age: Duration::from_secs(40 * 24 * 3600),
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        });
        let kv = switchyard_kv::get_or_create(js, config)
            .await
            .inspect_err(|e| {
                tracing::warn!(error = %e, "no JetStream KV for budgets: callers with budgets are refused");
            })
            .ok();
        let store = Self {
            inner: Arc::new(Inner {
                scopes: kv.map(Combiners::new),
                holder: holder.to_owned(),
                leases: Mutex::new(HashMap::new()),
                closing: Arc::new(AtomicBool::new(false)),
                ticker: TaskTracker::new(),
                stop: CancellationToken::new(),
            }),
        };
        if store.inner.scopes.is_some() {
            let me = store.clone();
            switchyard_kv::combine::every(
                &store.inner.ticker,
                RENEW_EVERY,
                store.inner.stop.clone(),
                move || {
                    let me = me.clone();
                    async move { me.renew_due(RENEW_EVERY).await }
                },
            );
        }
        store
    }

    /// Writes the sum of every scope whose stored lease has spare room and was written `age`
    /// ago or earlier: an idle holder returns its spare, a busy one renews it, and a `reclaim`
    /// flag is seen.
    async fn renew_due(&self, age: Duration) {
        let Ok(scopes) = self.scopes() else { return };
        let due: Vec<String> = self
            .inner
            .leases
            .lock()
            .iter()
            .filter(|(_, l)| {
                let l = l.lock();
                !l.stored_spare.is_zero() && l.written_at.is_none_or(|t| t.elapsed() >= age)
            })
            .map(|(k, _)| k.clone())
            .collect();
        let renewals = due.iter().map(|key| async move {
            let _ = self.scope(scopes, key).submit(OpKind::Renew).await;
        });
        futures::future::join_all(renewals).await;
    }

    /// This process's holder id.
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// Returns every lease's spare room and waits until every batch in progress has been
    /// written (shutdown).
    pub async fn close(&self) {
        self.inner.closing.store(true, Ordering::Relaxed);
        self.inner.stop.cancel();
        self.inner.ticker.close();
        self.inner.ticker.wait().await;
        self.renew_due(Duration::ZERO).await;
        if let Some(scopes) = &self.inner.scopes {
            scopes.close().await;
        }
    }

    /// The bucket itself (for the rebuild from the ledger).
    pub(crate) fn kv(&self) -> Result<&kv::Store, Unavailable> {
        Ok(self.scopes()?.store())
    }

    fn scopes(&self) -> Result<&Combiners<Scope>, Unavailable> {
        self.inner
            .scopes
            .as_ref()
            .ok_or_else(|| Unavailable("no JetStream KV".into()))
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
        let scopes = self.scopes()?;
        let lease = self.lease(key);
        {
            let mut l = lease.lock();
            if !self.inner.closing.load(Ordering::Relaxed) && l.fits(&limit, demand, until_ms) {
                l.spare = l.spare.minus(demand);
                l.used = l.used.plus(demand);
                l.admitted += 1;
                l.unit = demand;
                return Ok(());
            }
        }
        let started = Instant::now();
        loop {
            let op = OpKind::Reserve {
                limit: limit.clone(),
                demand,
                until_ms,
                may_reclaim: started.elapsed() < RECLAIM_WAIT,
            };
            match self.scope(scopes, key).submit(op).await {
                Ok(Answer::Done) => return Ok(()),
                Ok(Answer::Refused(e)) => return Err(e),
                // Other holders return their spare at their next write (≤ RENEW_EVERY).
                Ok(Answer::Reclaim) => tokio::time::sleep(RENEW_EVERY / 4).await,
                Err(_) => return Err(Unavailable("budget batch aborted".into()).into()),
            }
        }
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
        self.update(key, |stored| {
            let mut s = stored.unwrap_or_default().at(now_ms());
            Ok(s.raise_topped_up(topped_up_usd, spent_if_new).then_some(s))
        })
        .await
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
            .await;
        match answer {
            Ok(Answer::Refused(ReserveError::Unavailable(e))) => Err(e),
            Ok(_) => Ok(()),
            Err(_) => Err(Unavailable("budget batch aborted".into())),
        }
    }

    /// Drops a reservation of `reserved` from this holder's sum without writing: its settlement
    /// is handed to [`Self::settle_late`] elsewhere, and the next write of this holder stores the
    /// lower sum.
    pub async fn forget(&self, key: &str, reserved: Demand) {
        let lease = self.lease(key);
        let mut l = lease.lock();
        l.used = l.used.minus(reserved);
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
        self.update(key, |stored| {
            let mut s = stored.unwrap_or_default().at(now_ms());
            if !s.note_late(request_id) {
                return Ok(None);
            }
            s.add(actual);
            Ok(Some(s))
        })
        .await
        .map(|_| ())
    }

    /// Rewrites entry `key` by compare-and-set: `change` gets the stored state (`None`: absent)
    /// and returns the new one (`None`: nothing to write); a conflict re-reads and calls it
    /// again, for up to [`MAX_CONTENTION`]. Returns the entry after it. An unreadable entry is
    /// an error (it is not reset).
    pub(crate) async fn update(
        &self,
        key: &str,
        mut change: impl FnMut(Option<Spend>) -> Result<Option<Spend>, Unavailable>,
    ) -> Result<Spend, Unavailable> {
        let kv = self.scopes()?.store();
        let started = Instant::now();
        for attempt in 0u32.. {
            let (revision, stored) = load(kv, key).await.map_err(|e| Unavailable::from(&e))?;
            let stored = match stored {
                Stored::Value(s) => Some(s),
                Stored::Absent => None,
                Stored::Unreadable(reason) => {
                    return Err(Unavailable(format!("entry `{key}` unreadable: {reason}")));
                }
            };
            let Some(new) = change(stored.clone())? else {
                return Ok(stored.unwrap_or_default());
            };
            match write(kv, key, &new, revision).await {
                Ok(_) => return Ok(new),
                Err(WriteError::Conflict) if started.elapsed() < MAX_CONTENTION => {
                    backoff(attempt).await;
                }
                Err(WriteError::Conflict) => break,
                Err(WriteError::Failed(e)) => return Err(Unavailable::from(&e)),
            }
        }
        Err(Unavailable("too much contention".into()))
    }

    /// This holder's lease in scope `key` (created empty on first use).
    fn lease(&self, key: &str) -> Arc<Mutex<Lease>> {
        let mut leases = self.inner.leases.lock();
        // No key allocation on the hot path: the scope exists after its first request.
        if let Some(l) = leases.get(key) {
            return l.clone();
        }
        leases.entry(key.to_owned()).or_default().clone()
    }

    fn scope(&self, scopes: &Combiners<Scope>, key: &str) -> Arc<Combiner<Scope>> {
        scopes.get(key, || Scope {
            holder: self.inner.holder.clone(),
            lease: self.lease(key),
            closing: self.inner.closing.clone(),
            staged: None,
        })
    }
}
