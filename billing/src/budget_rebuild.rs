//! Budget state rebuilt from the ledger (`switchyard budgets rebuild`, and by billing at start-up
//! when the `SY_BUDGETS` bucket is new — lost and re-created, or a new installation): the settled spend of every key and tenant for the
//! current windows — the UTC day and month (USD and tokens) and the clock minute (tokens) —
//! summed from the ledger's `charge` rows, exactly as settlement adds them (a cache hit settles
//! $0 and no tokens). Open reservations are not in the ledger; they start empty. A tenant with
//! top-ups gets its prepaid balance entry `balance.<tenant>`: the sum of its top-ups and of its
//! charges since the first top-up ([`crate::balance`]).

use crate::{BillingError, Ledger};
use futures::TryStreamExt;
use rust_decimal::Decimal;
use sqlx::Row;
use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;
use switchyard_budgets::spend::{Prepaid, Spend, windows};
use switchyard_budgets::{BudgetStore, Seeded};

/// What a rebuild did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Scopes written (`key.<id>`, `tenant.<id>`).
    pub written: Vec<String>,
    /// Scopes an ingress had created since the bucket's creation: the ledger's spend from
    /// before it added.
    pub merged: Vec<String>,
    /// Scopes left as they were (seeded already, and `overwrite` was off).
    pub kept: Vec<String>,
}

/// The spend of every scope with charge rows in the month of `now_ms`, by KV key: of every
/// charge (`.0`) and of the charges dated before `before_ms` (`.1`, the bucket's creation).
pub async fn spend_from_ledger(
    ledger: &Ledger,
    now_ms: u64,
    before_ms: u64,
) -> Result<(BTreeMap<String, Spend>, BTreeMap<String, Spend>), BillingError> {
    let (day, month, minute) = windows(now_ms);
    let month_start = crate::report::utc_day_bounds(&format!("{month}-01"))
        .map_err(|e| BillingError::Budgets(e.to_string()))?
        .0;
    // Streamed, not fetched whole: a month of charges can be far more rows than fit in memory.
    let mut rows = sqlx::query(
        "SELECT key_id, tenant, ts_ms, prompt_tokens, completion_tokens, cost_usd, \
         CASE WHEN cache_hit THEN 1 ELSE 0 END AS cache_hit \
         FROM usage_events WHERE kind = 'charge' AND ts_ms >= $1",
    )
    .bind(crate::reconcile::ms_param(month_start))
    .fetch(ledger.pool());
    let empty = || Spend {
        day: day.clone(),
        month: month.clone(),
        minute,
        ..Spend::default()
    };
    let (mut all, mut earlier) = (BTreeMap::new(), BTreeMap::new());
    while let Some(row) = rows.try_next().await? {
        let ts: i64 = row.try_get("ts_ms")?;
        let ts = u64::try_from(ts).unwrap_or(0);
        let hit = row.try_get::<i64, _>("cache_hit")? != 0;
        let usd = match row.try_get::<Option<String>, _>("cost_usd")? {
            Some(c) if !hit => Decimal::from_str(&c)
                .map_err(|e| BillingError::CorruptRow(format!("cost_usd `{c}`: {e}")))?,
            _ => Decimal::ZERO,
        };
        let tokens = if hit {
            0
        } else {
            let p: i64 = row.try_get("prompt_tokens")?;
            let c: i64 = row.try_get("completion_tokens")?;
            u64::try_from(p.saturating_add(c)).unwrap_or(0)
        };
        let (row_day, _, row_minute) = windows(ts);
        let scopes = [
            row.try_get::<Option<String>, _>("key_id")?
                .map(|k| format!("key.{k}")),
            row.try_get::<Option<String>, _>("tenant")?
                .map(|t| format!("tenant.{t}")),
        ];
        for scope in scopes.into_iter().flatten() {
            let maps = if ts < before_ms {
                [Some(&mut all), Some(&mut earlier)]
            } else {
                [Some(&mut all), None]
            };
            for map in maps.into_iter().flatten() {
                let s = map.entry(scope.clone()).or_insert_with(empty);
                s.month_usd += usd;
                if row_day == day {
                    s.day_usd += usd;
                    s.day_tokens = s.day_tokens.saturating_add(tokens);
                }
                if row_minute == minute {
                    s.minute_tokens = s.minute_tokens.saturating_add(tokens);
                }
            }
        }
    }
    // Prepaid balances: every tenant with top-ups, its top-ups minus its charges since the first
    // (an entry an ingress created has no balance yet, so it takes this one whole).
    for tenant in crate::balance::tenants(ledger).await? {
        let b = crate::balance::ledger_balance(ledger, &tenant, 1).await?;
        let balance = Spend {
            prepaid: Some(Prepaid {
                topped_up_usd: b.topped_up_usd,
                spent_usd: b.charged_usd,
            }),
            ..empty()
        };
        all.insert(format!("balance.{tenant}"), balance.clone());
        earlier.insert(format!("balance.{tenant}"), balance);
    }
    Ok((all, earlier))
}

/// Seeds the budget store from the ledger ([`switchyard_budgets::rebuild`]): absent entries
/// get every charge of the current windows, entries an ingress created get the charges from
/// before the bucket's creation added once, seeded ones are kept; `overwrite` replaces every
/// entry (and drops open reservations: run it with ingress stopped). Then marks the bucket
/// rebuilt.
pub async fn rebuild(
    ledger: &Ledger,
    store: &BudgetStore,
    now_ms: u64,
    overwrite: bool,
) -> Result<Rebuilt, BillingError> {
    let budgets = |e: switchyard_budgets::Unavailable| BillingError::Budgets(e.0);
    let created = store.created_ms().await.map_err(budgets)?;
    // Once this bucket's rebuild completed, entries are never merged again: an older binary may
    // have rewritten one without its `from_ledger` flag during a rolling upgrade.
    let merge = store.rebuilt_for().await.map_err(budgets)? != Some(created);
    let (all, earlier) = spend_from_ledger(ledger, now_ms, created).await?;
    let mut done = Rebuilt::default();
    let mut failed = Vec::new();
    for (key, spend) in &all {
        let before = earlier.get(key).cloned().unwrap_or_else(|| Spend {
            day: spend.day.clone(),
            month: spend.month.clone(),
            minute: spend.minute,
            ..Spend::default()
        });
        // One unwritable entry (unreadable, say) does not stop the others.
        match store.seed(key, spend, &before, overwrite, merge).await {
            Ok(Seeded::Written) => done.written.push(key.clone()),
            Ok(Seeded::Merged) => done.merged.push(key.clone()),
            Ok(Seeded::Kept) => done.kept.push(key.clone()),
            Err(e) => failed.push(format!("{key}: {}", e.0)),
        }
    }
    if !failed.is_empty() {
        // No marker: the next check tries again.
        return Err(BillingError::Budgets(format!(
            "budget rebuild left {} scope(s) out: {}",
            failed.len(),
            failed.join("; ")
        )));
    }
    store.mark_rebuilt(created).await.map_err(budgets)?;
    Ok(done)
}

/// Rebuilds unless this bucket (by its creation time) was rebuilt already — a lost bucket comes
/// back with a new creation time, even if an ingress has written entries in it meanwhile.
/// `None`: nothing to do.
pub async fn rebuild_if_new_bucket(
    ledger: &Ledger,
    store: &BudgetStore,
) -> Result<Option<Rebuilt>, BillingError> {
    let budgets = |e: switchyard_budgets::Unavailable| BillingError::Budgets(e.0);
    let created = store.created_ms().await.map_err(budgets)?;
    if store.rebuilt_for().await.map_err(budgets)? == Some(created) {
        return Ok(None);
    }
    rebuild(ledger, store, switchyard_schemas::now_ms(), false)
        .await
        .map(Some)
}

/// How often the billing consumer checks whether `SY_BUDGETS` is a new bucket (one stream info
/// and one KV read): a bucket lost while billing runs is rebuilt within this.
pub const BUCKET_CHECK_EVERY: Duration = Duration::from_secs(30);

/// Checks a consumer with a backlog waits for before rebuilding anyway.
const MAX_DEFERRED: u32 = 3;

/// The billing consumer's periodic bucket check ([`BUCKET_CHECK_EVERY`]). A rebuild waits
/// until the consumer has no backlog (up to [`MAX_DEFERRED`] checks): charge events still
/// queued, dated before the bucket's creation, must be in the ledger when it sums "earlier".
#[derive(Debug, Default)]
pub struct BucketCheck {
    deferred: u32,
}

impl BucketCheck {
    /// One check; `backlog` is the consumer's pending plus unacknowledged messages.
    pub async fn run(&mut self, ledger: &Ledger, store: &BudgetStore, backlog: u64) {
        if backlog > 0 && self.deferred < MAX_DEFERRED {
            self.deferred += 1;
            return;
        }
        self.deferred = 0;
        match rebuild_if_new_bucket(ledger, store).await {
            Ok(Some(r)) if !(r.written.is_empty() && r.merged.is_empty()) => tracing::warn!(
                written = ?r.written,
                merged = ?r.merged,
                "budget store is new: spend rebuilt from the ledger"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "budget rebuild from the ledger failed (retried at the next check)")
            }
        }
    }
}
