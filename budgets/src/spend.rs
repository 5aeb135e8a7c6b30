//! The stored state of one budget scope and the pure arithmetic on it: window roll-over, the
//! admission check and settlement. No I/O here; [`crate::store`] reads and writes it.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use switchyard_schemas::tenancy::Budget;

/// How many request ids settled through [`crate::store::BudgetStore::settle_late`] an entry
/// remembers, so a redelivered late settlement is not counted twice. Late settlements are rare
/// (the direct settlement failed) and are redelivered only within seconds.
pub const LATE_IDS_KEPT: usize = 64;

/// What one request consumes: charge in USD and tokens (input + output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demand {
    /// Sale-price charge, USD.
    pub usd: Decimal,
    /// Input + output tokens.
    pub tokens: u64,
}

impl Demand {
    /// `self + other`.
    pub fn plus(self, other: Demand) -> Demand {
        Demand {
            usd: self.usd + other.usd,
            tokens: self.tokens + other.tokens,
        }
    }

    /// `self - other`, never below zero.
    pub fn minus(self, other: Demand) -> Demand {
        Demand {
            usd: (self.usd - other.usd).max(Decimal::ZERO),
            tokens: self.tokens.saturating_sub(other.tokens),
        }
    }

    /// Nothing.
    pub fn is_zero(&self) -> bool {
        self.usd.is_zero() && self.tokens == 0
    }
}

/// The open reservations of one holder (an ingress process) in one scope, as one sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Reserved charge, USD.
    pub usd: Decimal,
    /// Reserved tokens.
    pub tokens: u64,
    /// When the holder's reservations lapse if it never settles them (it died), ms since the
    /// epoch: the latest of its requests' deadlines plus `budgets.hold_grace_ms` (plus
    /// [`crate::store::LEASE_EXTRA`] while it holds a lease).
    pub until_ms: u64,
    /// Of `usd`, the part no request used when the holder wrote it: its *lease*, which it admits
    /// requests from without a write ([`crate::store`]). Counted like a reservation.
    #[serde(default, skip_serializing_if = "Decimal::is_zero")]
    pub spare_usd: Decimal,
    /// Of `tokens`, the leased part (as `spare_usd`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spare_tokens: u64,
}

/// The smaller of two optional bounds (`None`: unbounded).
fn tightest<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Held {
    fn demand(&self) -> Demand {
        Demand {
            usd: self.usd,
            tokens: self.tokens,
        }
    }

    fn spare(&self) -> Demand {
        Demand {
            usd: self.spare_usd,
            tokens: self.spare_tokens,
        }
    }
}

/// The stored state of one scope (JSON value of its KV entry). Windows are UTC.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    /// The day `day_usd` / `day_tokens` count, `YYYY-MM-DD`.
    pub day: String,
    /// Settled charge today, USD.
    pub day_usd: Decimal,
    /// Settled tokens today.
    pub day_tokens: u64,
    /// The month `month_usd` counts, `YYYY-MM`.
    pub month: String,
    /// Settled charge this month, USD.
    pub month_usd: Decimal,
    /// The clock minute `minute_tokens` counts (minutes since the epoch).
    pub minute: u64,
    /// Settled tokens this minute.
    pub minute_tokens: u64,
    /// Open reservations by holder (ingress process id): one sum each, so the entry's size does
    /// not grow with the number of requests in flight.
    #[serde(default)]
    pub held: BTreeMap<String, Held>,
    /// Request ids of the last [`LATE_IDS_KEPT`] late settlements (oldest first).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub late_ids: VecDeque<String>,
    /// A prepaid balance's totals (entries `balance.<tenant>` only): they never reset with a
    /// window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepaid: Option<Prepaid>,
    /// Set by a holder whose request did not fit while other holders' leases had spare room:
    /// holders grant themselves no lease while it is set, so the next writes of the others
    /// return their spare and the refusal is decided without it ([`crate::store`]). Cleared once
    /// the scope has ample room again.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reclaim: bool,
    /// The ledger's spend from before this bucket existed is in: written by a rebuild
    /// (`switchyard budgets rebuild`, or billing at start-up). An entry an ingress created
    /// starts without it, and a rebuild adds it once ([`crate::rebuild`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub from_ledger: bool,
}

/// Room left in a scope for one holder, per dimension (`None`: that dimension has no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Room {
    /// USD below the tightest USD limit (budget windows or prepaid balance).
    pub usd: Option<Decimal>,
    /// Tokens below the tightest token quota.
    pub tokens: Option<u64>,
}

/// The totals of a prepaid balance: what is left is `topped_up_usd - spent_usd` minus the open
/// reservations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepaid {
    /// Sum of the top-ups recorded in the ledger, USD. Only ever raised (to the ledger's sum),
    /// so two writers racing with the sums they read cannot lower it.
    pub topped_up_usd: Decimal,
    /// Settled charges drawn from the balance, USD.
    pub spent_usd: Decimal,
}

impl Prepaid {
    /// Top-ups minus settled charges, USD (negative when a charge overran its reservation).
    pub fn balance(&self) -> Decimal {
        self.topped_up_usd - self.spent_usd
    }
}

/// `(YYYY-MM-DD, YYYY-MM, minute since epoch)` of `ms`.
pub fn windows(ms: u64) -> (String, String, u64) {
    let t = time::OffsetDateTime::from_unix_timestamp((ms / 1000) as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let (y, m, d) = (t.year(), u8::from(t.month()), t.day());
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{y:04}-{m:02}"),
        ms / 60_000,
    )
}

/// Which limit a request would exceed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exceeded {
    /// A USD budget.
    Usd {
        /// `daily` or `monthly`.
        period: &'static str,
        /// The limit, USD.
        limit: Decimal,
        /// Settled plus reserved, USD.
        used: Decimal,
        /// This request's reservation, USD.
        need: Decimal,
    },
    /// A prepaid balance.
    Balance {
        /// Top-ups minus settled charges, USD.
        balance: Decimal,
        /// Open reservations, USD.
        reserved: Decimal,
        /// This request's reservation, USD.
        need: Decimal,
    },
    /// A token quota.
    Tokens {
        /// `per-minute` or `daily`.
        period: &'static str,
        /// The quota, tokens.
        limit: u64,
        /// Settled plus reserved, tokens.
        used: u64,
        /// This request's reservation, tokens.
        need: u64,
    },
}

impl Spend {
    /// The state at `now_ms`: past windows reset, lapsed holds dropped.
    pub fn at(mut self, now_ms: u64) -> Self {
        let (day, month, minute) = windows(now_ms);
        if self.day != day {
            self.day = day;
            self.day_usd = Decimal::ZERO;
            self.day_tokens = 0;
        }
        if self.month != month {
            self.month = month;
            self.month_usd = Decimal::ZERO;
        }
        if self.minute != minute {
            self.minute = minute;
            self.minute_tokens = 0;
        }
        self.held.retain(|_, h| h.until_ms > now_ms);
        self
    }

    /// Every holder's open reservations together.
    pub fn held_total(&self) -> Demand {
        self.held
            .values()
            .fold(Demand::default(), |a, h| a.plus(h.demand()))
    }

    /// The open reservations of every holder but `holder`.
    pub fn held_by_others(&self, holder: &str) -> Demand {
        self.held
            .iter()
            .filter(|(k, _)| k.as_str() != holder)
            .fold(Demand::default(), |a, (_, h)| a.plus(h.demand()))
    }

    /// The leased spare room of every holder but `holder`.
    pub fn spare_of_others(&self, holder: &str) -> Demand {
        self.held
            .iter()
            .filter(|(k, _)| k.as_str() != holder)
            .fold(Demand::default(), |a, (_, h)| a.plus(h.spare()))
    }

    /// What requests in flight hold, every holder together, leases' spare room excluded (as of
    /// each holder's last write): for display and the downgrade threshold, not for admission.
    pub fn reserved_total(&self) -> Demand {
        self.held.values().fold(Demand::default(), |a, h| {
            a.plus(h.demand().minus(h.spare()))
        })
    }

    /// Sets `holder`'s open reservations (removed when nothing is held).
    pub fn set_held(&mut self, holder: &str, held: Demand, until_ms: u64) {
        self.set_lease(holder, held, Demand::default(), until_ms);
    }

    /// Sets `holder`'s hold: `held` in all, of which `spare` is leased room no request uses
    /// (removed when nothing is held).
    pub fn set_lease(&mut self, holder: &str, held: Demand, spare: Demand, until_ms: u64) {
        if held.is_zero() {
            self.held.remove(holder);
        } else {
            self.held.insert(
                holder.to_owned(),
                Held {
                    usd: held.usd,
                    tokens: held.tokens,
                    until_ms,
                    spare_usd: spare.usd.min(held.usd),
                    spare_tokens: spare.tokens.min(held.tokens),
                },
            );
        }
    }

    /// Room left under `budget` with `held` reserved: the tightest window per dimension
    /// (never negative).
    pub fn room(&self, budget: &Budget, held: Demand) -> Room {
        let usd = |limit: Option<Decimal>, used: Decimal| {
            limit.map(|l| (l - used - held.usd).max(Decimal::ZERO))
        };
        let tokens =
            |limit: Option<u64>, used: u64| limit.map(|l| l.saturating_sub(used + held.tokens));
        Room {
            usd: tightest(
                usd(budget.daily_usd, self.day_usd),
                usd(budget.monthly_usd, self.month_usd),
            ),
            tokens: tightest(
                tokens(budget.tokens_per_minute, self.minute_tokens),
                tokens(budget.tokens_per_day, self.day_tokens),
            ),
        }
    }

    /// Room left in the prepaid balance with `held` reserved (USD only; never negative).
    pub fn room_balance(&self, held: Demand) -> Room {
        let p = self.prepaid.unwrap_or_default();
        Room {
            usd: Some((p.topped_up_usd - p.spent_usd - held.usd).max(Decimal::ZERO)),
            tokens: None,
        }
    }

    /// Adds consumption to the current windows (and to a prepaid balance's spend).
    pub fn add(&mut self, actual: Demand) {
        if let Some(p) = &mut self.prepaid {
            p.spent_usd += actual.usd;
        }
        self.day_usd += actual.usd;
        self.month_usd += actual.usd;
        self.day_tokens += actual.tokens;
        self.minute_tokens += actual.tokens;
    }

    /// Adds `earlier`'s settled spend (same windows: both at the same instant) and, if this
    /// entry has none, its prepaid balance: the ledger's spend from before the entry existed.
    pub fn absorb(&mut self, earlier: &Spend) {
        self.day_usd += earlier.day_usd;
        self.month_usd += earlier.month_usd;
        self.day_tokens = self.day_tokens.saturating_add(earlier.day_tokens);
        self.minute_tokens = self.minute_tokens.saturating_add(earlier.minute_tokens);
        if self.prepaid.is_none() {
            self.prepaid = earlier.prepaid;
        }
    }

    /// Share of `budget.daily_usd` spent or reserved (None without a daily budget).
    pub fn daily_share(&self, budget: &Budget) -> Option<Decimal> {
        let limit = budget.daily_usd?;
        if limit.is_zero() {
            return Some(Decimal::ONE);
        }
        Some((self.day_usd + self.reserved_total().usd) / limit)
    }

    /// The first limit of `budget` that `demand` would exceed with `held` reserved.
    pub fn exceeded(&self, budget: &Budget, held: Demand, demand: Demand) -> Option<Exceeded> {
        let usd = |limit, used, period| {
            over(limit, used, held.usd, demand.usd).map(|(limit, used)| Exceeded::Usd {
                period,
                limit,
                used,
                need: demand.usd,
            })
        };
        let tokens = |limit, used, period| {
            over(limit, used, held.tokens, demand.tokens).map(|(limit, used)| Exceeded::Tokens {
                period,
                limit,
                used,
                need: demand.tokens,
            })
        };
        usd(budget.daily_usd, self.day_usd, "daily")
            .or_else(|| usd(budget.monthly_usd, self.month_usd, "monthly"))
            .or_else(|| tokens(budget.tokens_per_minute, self.minute_tokens, "per-minute"))
            .or_else(|| tokens(budget.tokens_per_day, self.day_tokens, "daily"))
    }

    /// Whether `demand` does not fit in the prepaid balance with `held` reserved: the check is
    /// `spent + held + demand ≤ topped_up` (no balance recorded yet: nothing fits).
    pub fn exceeded_balance(&self, held: Demand, demand: Demand) -> Option<Exceeded> {
        let p = self.prepaid.unwrap_or_default();
        (p.spent_usd + held.usd + demand.usd > p.topped_up_usd).then_some(Exceeded::Balance {
            balance: p.balance(),
            reserved: held.usd,
            need: demand.usd,
        })
    }

    /// Raises the recorded top-ups to `topped_up_usd` (the ledger's sum); never lowers them. An
    /// entry without a balance yet (new, or lost) starts from `spent_if_new`, the ledger's
    /// charges since the first top-up, so a lost entry is not credited its past spend.
    /// Returns whether the entry changed.
    pub fn raise_topped_up(&mut self, topped_up_usd: Decimal, spent_if_new: Decimal) -> bool {
        if self.prepaid.is_none() && topped_up_usd > Decimal::ZERO {
            self.prepaid = Some(Prepaid {
                topped_up_usd,
                spent_usd: spent_if_new,
            });
            return true;
        }
        let p = self.prepaid.get_or_insert_default();
        if topped_up_usd > p.topped_up_usd {
            p.topped_up_usd = topped_up_usd;
            return true;
        }
        false
    }

    /// Remembers a late settlement; false if `request_id` was already applied.
    pub fn note_late(&mut self, request_id: &str) -> bool {
        if self.late_ids.iter().any(|id| id == request_id) {
            return false;
        }
        if self.late_ids.len() >= LATE_IDS_KEPT {
            self.late_ids.pop_front();
        }
        self.late_ids.push_back(request_id.to_owned());
        true
    }
}

/// `(limit, used + held)` when `used + held + need` is over `limit` (no limit: never over).
fn over<T>(limit: Option<T>, used: T, held: T, need: T) -> Option<(T, T)>
where
    T: Copy + PartialOrd + std::ops::Add<Output = T>,
{
    let used = used + held;
    limit.filter(|l| used + need > *l).map(|l| (l, used))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    #[test]
    fn windows_are_utc_calendar() {
        // 2026-11-29T23:59:59Z and one second later.
        assert_eq!(
            windows(1_795_996_799_000),
            ("2026-11-29".into(), "2026-11".into(), 29_933_279)
        );
        assert_eq!(windows(1_795_996_800_000).0, "2026-11-30");
    }

    #[test]
    fn holds_count_until_they_lapse() {
        let budget = Budget {
            daily_usd: Some(d("0.010")),
            ..Budget::default()
        };
        let now = 1_796_083_000_000;
        let mut s = Spend::default().at(now);
        let need = Demand {
            usd: d("0.0044"),
            tokens: 200,
        };
        assert_eq!(s.exceeded(&budget, Demand::default(), need), None);
        s.set_held("ingress-a", need, now + 1000);
        assert_eq!(s.exceeded(&budget, s.held_total(), need), None);
        s.set_held("ingress-b", need, now + 1000);
        assert_eq!(
            s.exceeded(&budget, s.held_total(), need),
            Some(Exceeded::Usd {
                period: "daily",
                limit: d("0.010"),
                used: d("0.0088"),
                need: d("0.0044"),
            })
        );
        assert_eq!(s.held_by_others("ingress-a"), need);
        assert_eq!(s.daily_share(&budget), Some(d("0.88")));
        let later = s.at(now + 1000);
        assert!(later.held.is_empty());
        assert_eq!(later.exceeded(&budget, later.held_total(), need), None);
    }

    #[test]
    fn a_new_day_resets_the_day_but_not_the_month() {
        let mut s = Spend::default().at(1_795_996_799_000);
        s.day_usd = d("1.5");
        s.month_usd = d("2.5");
        s.day_tokens = 7;
        let next = s.at(1_795_996_800_000);
        assert_eq!(next.day_usd, Decimal::ZERO);
        assert_eq!(next.day_tokens, 0);
        assert_eq!(next.month_usd, d("2.5"));
    }

    #[test]
    fn a_balance_admits_what_it_covers_and_only_rises() {
        let mut s = Spend::default();
        let need = Demand {
            usd: d("0.004"),
            tokens: 10,
        };
        assert!(matches!(
            s.exceeded_balance(Demand::default(), need),
            Some(Exceeded::Balance { .. })
        ));
        assert!(s.raise_topped_up(d("0.01"), Decimal::ZERO));
        assert!(
            !s.raise_topped_up(d("0.005"), Decimal::ZERO),
            "a stale sum never lowers it"
        );
        assert_eq!(s.exceeded_balance(need, need), None);
        assert_eq!(
            s.exceeded_balance(need.plus(need), need),
            Some(Exceeded::Balance {
                balance: d("0.01"),
                reserved: d("0.008"),
                need: d("0.004"),
            })
        );
        s.add(need);
        assert_eq!(s.prepaid.unwrap().balance(), d("0.006"));
        let json = serde_json::to_string(&s.clone().at(0)).unwrap();
        let back: Spend = serde_json::from_str(&json).unwrap();
        assert_eq!(
            back.prepaid, s.prepaid,
            "a window roll-over keeps the balance"
        );
    }

    #[test]
    fn late_settlements_are_applied_once() {
        let mut s = Spend::default();
        assert!(s.note_late("r1"));
        assert!(!s.note_late("r1"));
        for i in 0..LATE_IDS_KEPT {
            assert!(s.note_late(&format!("x{i}")));
        }
        assert_eq!(s.late_ids.len(), LATE_IDS_KEPT);
        assert!(
            s.note_late("r1"),
            "forgotten after LATE_IDS_KEPT newer ones"
        );
    }
}
