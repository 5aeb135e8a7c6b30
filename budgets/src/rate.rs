//! Request-rate limits of keys and tenants (RPM, TPM, concurrent requests) shared by every
//! ingress replica: one JetStream KV entry per scope (`key.<id>`, `tenant.<id>`) in
//! [`RATES_BUCKET`], written by group commit ([`switchyard_kv::combine`]) like the budgets of
//! [`crate::store`].
//!
//! An entry is a [`RateState`]: the UTC clock minute it counts, the requests and tokens charged
//! in it, and every ingress process's (holder's) requests in flight with the latest time they
//! may still run. One admission checks all three limits against the entry *at the revision its
//! write replaces* and changes it only if all three admit: a request refused by one limit (the
//! concurrency one included) consumes nothing of the others.
//!
//! Exactness across replicas: every admission is part of a compare-and-set write computed from
//! the revision it replaces (a write from a stale revision is rejected by the server and
//! recomputed from a fresh read); a refusal computed from this process's cached copy is
//! confirmed by a fresh read before it is answered. So for any interleaving the admitted
//! requests of a minute number at most `rpm`, their charged tokens at most `tpm`, and the
//! in-flight sum never passes `max_concurrent`. Holders write their own in-flight count
//! absolutely (it is authoritative in the holder's memory), so a lost answer cannot release
//! twice; the count of a holder that died lapses at its `until_ms` (deadline + grace).

use async_nats::jetstream::{self, kv};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use switchyard_kv::combine::{Batch, Combiner, Combiners, Plan};
use switchyard_kv::{KvError, Stored, load};
use switchyard_schemas::now_ms;
use switchyard_schemas::tenancy::RateLimits;

/// The KV bucket holding one [`RateState`] per key and tenant with `limits` (memory storage: the
/// state of one minute needs no durability).
pub const RATES_BUCKET: &str = "SY_RATES";

/// How long a batch retries compare-and-set conflicts before giving up (then fail-open).
pub const MAX_CONTENTION: Duration = Duration::from_secs(5);

/// Length of a rate window, ms (one UTC clock minute).
pub const WINDOW_MS: u64 = 60_000;

/// Wait suggested after a concurrency refusal, ms (a slot frees when any request ends).
pub const CONCURRENCY_RETRY_MS: u64 = 1_000;

/// One holder's requests in flight in a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// Requests in flight.
    pub n: u32,
    /// Latest deadline (+ grace) of them, ms since the epoch; the count lapses after it.
    pub until_ms: u64,
}

/// The JSON value of one scope's entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateState {
    /// The clock minute counted: ms since the epoch / [`WINDOW_MS`].
    pub minute: u64,
    /// Requests admitted in `minute`.
    pub requests: u64,
    /// Tokens charged in `minute` (estimates, corrected to actuals when requests end in it).
    pub tokens: u64,
    /// Requests in flight per holder (ingress process id).
    #[serde(default)]
    pub held: BTreeMap<String, InFlight>,
}

impl RateState {
    /// The state at `now_ms`: a new minute starts at zero requests and tokens, lapsed holders
    /// are dropped.
    pub fn at(mut self, now_ms: u64) -> Self {
        let minute = now_ms / WINDOW_MS;
        if minute != self.minute {
            self.minute = minute;
            self.requests = 0;
            self.tokens = 0;
        }
        self.held.retain(|_, h| h.until_ms > now_ms);
        self
    }

    /// Requests in flight of every holder but `holder`.
    pub fn in_flight_of_others(&self, holder: &str) -> u64 {
        self.held
            .iter()
            .filter(|(h, _)| h.as_str() != holder)
            .map(|(_, f)| u64::from(f.n))
            .sum()
    }

    /// Requests in flight of every holder.
    pub fn in_flight(&self) -> u64 {
        self.held.values().map(|f| u64::from(f.n)).sum()
    }
}

/// A scope's counts right after an operation: what the `x-ratelimit-*` headers show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The clock minute (ms since the epoch / [`WINDOW_MS`]).
    pub minute: u64,
    /// Requests admitted in it.
    pub requests: u64,
    /// Tokens charged in it.
    pub tokens: u64,
    /// Requests in flight across every holder.
    pub in_flight: u64,
}

impl Window {
    /// When the window ends (and its counts reset), ms since the epoch.
    pub fn resets_at_ms(&self) -> u64 {
        (self.minute + 1) * WINDOW_MS
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_concurrent` requests are in flight.
    Concurrent {
        /// The limit.
        limit: u32,
    },
    /// `rpm` requests were admitted this minute.
    Requests {
        /// The limit.
        limit: u64,
    },
    /// The request's token estimate does not fit what is left of `tpm` this minute.
    Tokens {
        /// The limit.
        limit: u64,
        /// The request's estimate, tokens.
        need: u64,
    },
}

/// Why an admission did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    /// A limit refused; nothing was charged.
    #[error("rate limit: {refusal:?}")]
    Refused {
        /// The limit.
        refusal: Refusal,
        /// The scope's counts as the refusal saw them.
        window: Window,
        /// When a retry may be admitted, ms from now (≥ 1).
        retry_after_ms: u64,
    },
    /// The store could not be read or written (the caller fails open).
    #[error("rate store unavailable: {0}")]
    Unavailable(String),
}

enum Op {
    Admit {
        limits: RateLimits,
        tokens: u64,
        until_ms: u64,
    },
    /// The end of an admitted request: its in-flight slot is released; in the minute it was
    /// admitted in, its request is given back (`refund`) and its token charge replaced by
    /// `actual` (`refund`: 0).
    Settle {
        minute: u64,
        refund: bool,
        charged: u64,
        actual: u64,
    },
}

/// This holder's view of one scope; only the batch leader touches it.
struct Scope {
    holder: String,
    /// This holder's requests in flight in the scope (authoritative).
    mine: u32,
    /// The latest `until_ms` of them.
    until_ms: u64,
    /// `mine` and `until_ms` as the batch being written would leave them.
    next: (u32, u64),
}

impl Batch for Scope {
    type Value = RateState;
    type Op = Op;
    type Answer = Result<Window, RateError>;

    fn max_contention(&self) -> Duration {
        MAX_CONTENTION
    }

    /// Two replicas in lockstep conflict on every write; the loser's first retry wins.
    fn immediate_retries(&self) -> u32 {
        1
    }

    /// An absent entry is an unused scope; one that does not parse is overwritten (fail-open,
    /// like the workers' target limits: a limit outage must not become a gateway outage).
    fn decode(&self, key: &str, stored: Stored<RateState>) -> Result<RateState, KvError> {
        Ok(match stored {
            Stored::Value(v) => v,
            Stored::Absent => RateState::default(),
            Stored::Unreadable(e) => {
                tracing::warn!(key, error = %e, "rate entry unreadable: starting it empty");
                RateState::default()
            }
        })
    }

    /// An admission nobody waits for is skipped; settlements always happen.
    fn needed_unawaited(&self, op: &Op) -> bool {
        matches!(op, Op::Settle { .. })
    }

    fn apply(&mut self, value: &mut RateState, ops: &[Op], fresh: bool) -> Plan<Self::Answer> {
        let now = now_ms();
        let mut s = value.clone().at(now);
        let others = s.in_flight_of_others(&self.holder);
        let (mut mine, mut until) = (self.mine, self.until_ms);
        let mut refused = false;
        let answers: Vec<_> = ops
            .iter()
            .map(|op| match *op {
                Op::Settle {
                    minute,
                    refund,
                    charged,
                    actual,
                } => {
                    mine = mine.saturating_sub(1);
                    if minute == s.minute {
                        if refund {
                            s.requests = s.requests.saturating_sub(1);
                        }
                        s.tokens = s.tokens.saturating_sub(charged).saturating_add(actual);
                    }
                    Ok(window(&s, others + u64::from(mine)))
                }
                Op::Admit {
                    limits,
                    tokens,
                    until_ms,
                } => {
                    let in_flight = others + u64::from(mine);
                    let to_minute_end = ((s.minute + 1) * WINDOW_MS).saturating_sub(now).max(1);
                    let refusal = if let Some(limit) = limits.max_concurrent
                        && in_flight >= u64::from(limit)
                    {
                        Some((Refusal::Concurrent { limit }, CONCURRENCY_RETRY_MS))
                    } else if let Some(limit) = limits.rpm
                        && s.requests >= limit
                    {
                        Some((Refusal::Requests { limit }, to_minute_end))
                    } else if let Some(limit) = limits.tpm
                        && s.tokens.saturating_add(tokens) > limit
                    {
                        Some((
                            Refusal::Tokens {
                                limit,
                                need: tokens,
                            },
                            to_minute_end,
                        ))
                    } else {
                        None
                    };
                    match refusal {
                        Some((refusal, retry_after_ms)) => {
                            refused = true;
                            Err(RateError::Refused {
                                refusal,
                                window: window(&s, in_flight),
                                retry_after_ms,
                            })
                        }
                        None => {
                            s.requests += 1;
                            s.tokens = s.tokens.saturating_add(tokens);
                            mine = mine.saturating_add(1);
                            until = until.max(until_ms);
                            Ok(window(&s, in_flight + 1))
                        }
                    }
                }
            })
            .collect();
        if refused && !fresh {
            // Another replica may have released or a new minute begun since this copy.
            return Plan::Refresh;
        }
        if mine == 0 {
            s.held.remove(&self.holder);
        } else {
            s.held.insert(
                self.holder.clone(),
                InFlight {
                    n: mine,
                    until_ms: until,
                },
            );
        }
        self.next = (mine, if mine == 0 { 0 } else { until });
        let unchanged = answers.iter().all(Result::is_err);
        *value = s;
        if unchanged {
            Plan::Answer(answers)
        } else {
            Plan::Write(answers)
        }
    }

    fn committed(&mut self) {
        (self.mine, self.until_ms) = self.next;
    }

    /// An admission whose caller went away before its answer is given back.
    fn undo(&self, op: Op, answer: Self::Answer) -> Option<Op> {
        match (op, answer) {
            (Op::Admit { tokens, .. }, Ok(w)) => Some(Op::Settle {
                minute: w.minute,
                refund: true,
                charged: tokens,
                actual: 0,
            }),
            _ => None,
        }
    }

    fn failed(&self, e: &KvError) -> Self::Answer {
        Err(RateError::Unavailable(e.to_string()))
    }
}

fn window(s: &RateState, in_flight: u64) -> Window {
    Window {
        minute: s.minute,
        requests: s.requests,
        tokens: s.tokens,
        in_flight,
    }
}

/// Handle to [`RATES_BUCKET`] for one holder (ingress process).
pub struct RateStore {
    scopes: Option<Combiners<Scope>>,
    holder: String,
}

impl std::fmt::Debug for RateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateStore")
            .field("holder", &self.holder)
            .field("shared", &self.scopes.is_some())
            .finish()
    }
}

impl RateStore {
    /// Opens (or creates, in memory storage) [`RATES_BUCKET`] for `holder` (unique per process).
    /// Without JetStream every operation is [`RateError::Unavailable`] (callers fail open).
    pub async fn connect(js: &jetstream::Context, holder: &str) -> Self {
        let config = switchyard_schemas::replicas::kv(kv::Config {
            bucket: RATES_BUCKET.to_owned(),
            description: "Switchyard key and tenant rate limits: requests and tokens of the \
                          current minute, requests in flight"
                .to_owned(),
            history: 1,
            storage: jetstream::stream::StorageType::Memory,
            ..Default::default()
        });
        let kv = switchyard_kv::get_or_create(js, config)
            .await
            .inspect_err(|e| {
                tracing::warn!(error = %e, "no JetStream KV for key rate limits: they are not enforced");
            })
            .ok();
        Self {
            scopes: kv.map(Combiners::new),
            holder: holder.to_owned(),
        }
    }

    /// Waits until every batch in progress (settlements included) has been written (shutdown).
    pub async fn close(&self) {
        if let Some(scopes) = &self.scopes {
            scopes.close().await;
        }
    }

    fn scope(&self, key: &str) -> Result<std::sync::Arc<Combiner<Scope>>, RateError> {
        let scopes = self
            .scopes
            .as_ref()
            .ok_or_else(|| RateError::Unavailable("no JetStream KV".into()))?;
        Ok(scopes.get(key, || Scope {
            holder: self.holder.clone(),
            mine: 0,
            until_ms: 0,
            next: (0, 0),
        }))
    }

    /// Admits one request of `tokens` estimated tokens in scope `key` under `limits`, in flight
    /// until at most `until_ms`: the scope's counts after it, or which limit refused.
    pub async fn admit(
        &self,
        key: &str,
        limits: RateLimits,
        tokens: u64,
        until_ms: u64,
    ) -> Result<Window, RateError> {
        self.scope(key)?
            .submit(Op::Admit {
                limits,
                tokens,
                until_ms,
            })
            .await
            .unwrap_or_else(|e| Err(RateError::Unavailable(e.to_string())))
    }

    /// Ends a request admitted in `minute` with `charged` tokens: releases its in-flight slot and,
    /// if `minute` is still current, gives its request back (`refund`) and replaces its token
    /// charge with `actual`.
    pub async fn settle(
        &self,
        key: &str,
        minute: u64,
        refund: bool,
        charged: u64,
        actual: u64,
    ) -> Result<Window, RateError> {
        let settle = Op::Settle {
            minute,
            refund,
            charged,
            actual: if refund { 0 } else { actual },
        };
        self.scope(key)?
            .submit_deferred(settle, crate::store::SETTLE_WITHIN)
            .await
            .unwrap_or_else(|e| Err(RateError::Unavailable(e.to_string())))
    }

    /// The entry of `key` as of now (diagnostics and tests).
    pub async fn peek(&self, key: &str) -> Result<RateState, RateError> {
        let scopes = self
            .scopes
            .as_ref()
            .ok_or_else(|| RateError::Unavailable("no JetStream KV".into()))?;
        match load::<RateState>(scopes.store(), key).await {
            Ok((_, Stored::Value(v))) => Ok(v.at(now_ms())),
            Ok(_) => Ok(RateState::default().at(now_ms())),
            Err(e) => Err(RateError::Unavailable(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn scope() -> Scope {
        Scope {
            holder: "a".into(),
            mine: 0,
            until_ms: 0,
            next: (0, 0),
        }
    }

    fn admit(limits: RateLimits) -> Op {
        Op::Admit {
            limits,
            tokens: 10,
            until_ms: now_ms() + 60_000,
        }
    }

    #[test]
    fn a_concurrency_refusal_charges_nothing() {
        let limits = RateLimits {
            rpm: Some(5),
            tpm: Some(100),
            max_concurrent: Some(1),
        };
        let mut s = scope();
        let mut v = RateState::default();
        let Plan::Write(a) = s.apply(&mut v, &[admit(limits), admit(limits)], true) else {
            unreachable!()
        };
        s.committed();
        assert_eq!(a[0].as_ref().unwrap().requests, 1);
        assert!(matches!(
            a[1],
            Err(RateError::Refused {
                refusal: Refusal::Concurrent { limit: 1 },
                retry_after_ms: CONCURRENCY_RETRY_MS,
                ..
            })
        ));
        assert_eq!((v.requests, v.tokens, v.in_flight()), (1, 10, 1));
        // From the cached copy a refusal is confirmed by a fresh read first.
        assert!(matches!(
            s.apply(&mut v, &[admit(limits)], false),
            Plan::Refresh
        ));
        let minute = v.minute;
        let settle = Op::Settle {
            minute,
            refund: false,
            charged: 10,
            actual: 4,
        };
        let Plan::Write(_) = s.apply(&mut v, &[settle, admit(limits)], true) else {
            unreachable!()
        };
        s.committed();
        assert_eq!((v.requests, v.tokens, v.in_flight()), (2, 14, 1));
    }

    #[test]
    fn rpm_and_tpm_refuse_until_the_minute_ends_and_a_new_minute_starts_empty() {
        let limits = RateLimits {
            rpm: Some(1),
            ..RateLimits::default()
        };
        let mut s = scope();
        let mut v = RateState::default();
        let Plan::Write(_) = s.apply(&mut v, &[admit(limits)], true) else {
            unreachable!()
        };
        s.committed();
        let Plan::Answer(a) = s.apply(&mut v, &[admit(limits)], true) else {
            unreachable!()
        };
        let Err(RateError::Refused { retry_after_ms, .. }) = a[0] else {
            unreachable!()
        };
        assert!((1..=WINDOW_MS).contains(&retry_after_ms));
        let tpm = RateLimits {
            tpm: Some(5),
            ..RateLimits::default()
        };
        assert!(matches!(
            s.apply(&mut RateState::default(), &[admit(tpm)], true),
            Plan::Answer(a) if matches!(a[0], Err(RateError::Refused { refusal: Refusal::Tokens { limit: 5, need: 10 }, .. }))
        ));
        let old = RateState {
            minute: 1,
            requests: 9,
            tokens: 9,
            held: BTreeMap::from([("gone".into(), InFlight { n: 3, until_ms: 5 })]),
        };
        let now = old.at(now_ms());
        assert_eq!((now.requests, now.tokens, now.in_flight()), (0, 0, 0));
    }
}
