//! Budget state rebuilt from the ledger (`switchyard budgets rebuild`, and by billing at start-up
//! when the `SY_BUDGETS` bucket is empty): the settled spend of every key and tenant for the
//! current windows — the UTC day and month (USD and tokens) and the clock minute (tokens) —
//! summed from the ledger's `charge` rows, exactly as settlement adds them (a cache hit settles
//! $0 and no tokens). Open reservations are not in the ledger; they start empty. A tenant with
//! top-ups gets its prepaid balance entry `balance.<tenant>`: the sum of its top-ups and of its
//! charges since the first top-up ([`crate::balance`]).

use crate::{BillingError, Ledger};
use rust_decimal::Decimal;
use sqlx::Row;
use std::collections::BTreeMap;
use std::str::FromStr;
use switchyard_budgets::BudgetStore;
use switchyard_budgets::spend::{Prepaid, Spend, windows};

/// What a rebuild did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Scopes written (`key.<id>`, `tenant.<id>`).
    pub written: Vec<String>,
    /// Scopes left as they were (an entry existed and `overwrite` was off).
    pub kept: Vec<String>,
}

/// The spend of every scope with charge rows in the month of `now_ms`, by KV key.
pub async fn spend_from_ledger(
    ledger: &Ledger,
    now_ms: u64,
) -> Result<BTreeMap<String, Spend>, BillingError> {
    let (day, month, minute) = windows(now_ms);
    let month_start = crate::report::utc_day_bounds(&format!("{month}-01"))
        .map_err(|e| BillingError::Budgets(e.to_string()))?
        .0;
    let rows = sqlx::query(
        "SELECT key_id, tenant, ts_ms, prompt_tokens, completion_tokens, cost_usd, \
         CASE WHEN cache_hit THEN 1 ELSE 0 END AS cache_hit \
         FROM usage_events WHERE kind = 'charge' AND ts_ms >= $1",
    )
    .bind(crate::reconcile::ms_param(month_start))
    .fetch_all(ledger.pool())
    .await?;
    let mut out: BTreeMap<String, Spend> = BTreeMap::new();
    for row in rows {
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
            let s = out.entry(scope).or_insert_with(|| Spend {
                day: day.clone(),
                month: month.clone(),
                minute,
                ..Spend::default()
            });
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
    // Prepaid balances: every tenant with top-ups, its top-ups minus its charges since the first.
    for tenant in crate::balance::tenants(ledger).await? {
        let b = crate::balance::ledger_balance(ledger, &tenant, 1).await?;
        out.insert(
            format!("balance.{tenant}"),
            Spend {
                day: day.clone(),
                month: month.clone(),
                minute,
                prepaid: Some(Prepaid {
                    topped_up_usd: b.topped_up_usd,
                    spent_usd: b.charged_usd,
                }),
                ..Spend::default()
            },
        );
    }
    Ok(out)
}

/// Writes the ledger's spend to the budget store: scopes without an entry only, unless
/// `overwrite` (which also drops open reservations; run it with ingress stopped).
pub async fn rebuild(
    ledger: &Ledger,
    store: &BudgetStore,
    now_ms: u64,
    overwrite: bool,
) -> Result<Rebuilt, BillingError> {
    let mut done = Rebuilt::default();
    for (key, spend) in spend_from_ledger(ledger, now_ms).await? {
        let written = store
            .seed(&key, &spend, overwrite)
            .await
            .map_err(|e| BillingError::Budgets(e.0))?;
        if written {
            done.written.push(key);
        } else {
            done.kept.push(key);
        }
    }
    Ok(done)
}
