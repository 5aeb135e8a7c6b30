//! Prepaid tenant balances in the ledger (docs/budgets.md, "Prepaid balances"): top-ups are rows
//! of `balance_topups` (migration 0006, idempotent by top-up id), deductions are the tenant's
//! `charge` rows from its first top-up on. Served to ingress's admin API over
//! `<prefix>.billing.balance` ([`crate::serve_queries`] with
//! [`Query::Balance`](crate::Query::Balance)) and read by the budget rebuild.

use crate::{BillingError, Ledger};
use futures::TryStreamExt;
use rust_decimal::Decimal;
use sqlx::Row;
use std::str::FromStr;
use switchyard_schemas::balance::{
    BalanceAnswer, BalanceRequest, LedgerBalance, MAX_MOVEMENTS, Movement, TopUp,
};

fn decimal(what: &str, s: &str) -> Result<Decimal, BillingError> {
    Decimal::from_str(s).map_err(|e| BillingError::CorruptRow(format!("{what} `{s}`: {e}")))
}

fn ms(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Stores a top-up unless its id exists. Returns the stored row and whether it was new; the same
/// id with another tenant or amount is `Err(Ok(reason))` for the caller to answer 409.
pub async fn top_up(
    ledger: &Ledger,
    t: &TopUp,
) -> Result<Result<(TopUp, bool), String>, BillingError> {
    let done = sqlx::query(
        "INSERT INTO balance_topups (id, tenant, amount_usd, note, ts_ms) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&t.id)
    .bind(&t.tenant)
    .bind(t.amount_usd.normalize().to_string())
    .bind(t.note.clone())
    .bind(crate::reconcile::ms_param(t.ts_ms))
    .execute(ledger.pool())
    .await?;
    let row =
        sqlx::query("SELECT id, tenant, amount_usd, note, ts_ms FROM balance_topups WHERE id = $1")
            .bind(&t.id)
            .fetch_one(ledger.pool())
            .await?;
    let stored = TopUp {
        id: row.try_get("id")?,
        tenant: row.try_get("tenant")?,
        amount_usd: decimal("amount_usd", &row.try_get::<String, _>("amount_usd")?)?,
        note: row.try_get("note")?,
        ts_ms: ms(row.try_get("ts_ms")?),
    };
    if stored.tenant != t.tenant || stored.amount_usd != t.amount_usd {
        return Ok(Err(format!(
            "The top-up id `{}` was already used for ${} to tenant `{}`; use a new id for a new \
             top-up.",
            stored.id,
            stored.amount_usd.normalize(),
            stored.tenant
        )));
    }
    Ok(Ok((stored, done.rows_affected() == 1)))
}

/// The tenant's top-ups: their sum and the first one's time.
async fn topped_up(ledger: &Ledger, tenant: &str) -> Result<(Decimal, Option<u64>), BillingError> {
    let rows = sqlx::query("SELECT amount_usd, ts_ms FROM balance_topups WHERE tenant = $1")
        .bind(tenant)
        .fetch_all(ledger.pool())
        .await?;
    let mut sum = Decimal::ZERO;
    let mut first: Option<u64> = None;
    for r in rows {
        sum += decimal("amount_usd", &r.try_get::<String, _>("amount_usd")?)?;
        let ts = ms(r.try_get("ts_ms")?);
        first = Some(first.map_or(ts, |f| f.min(ts)));
    }
    Ok((sum, first))
}

/// Every tenant with top-ups, by the KV key of its balance entry.
pub async fn tenants(ledger: &Ledger) -> Result<Vec<String>, BillingError> {
    let rows = sqlx::query("SELECT DISTINCT tenant FROM balance_topups ORDER BY tenant")
        .fetch_all(ledger.pool())
        .await?;
    rows.iter()
        .map(|r| r.try_get::<String, _>("tenant").map_err(Into::into))
        .collect()
}

/// The tenant's ledger balance: top-ups, the charges since its first top-up (a cache hit and an
/// unpriced row are $0, as settlement counts them), and the `limit` newest movements.
pub async fn ledger_balance(
    ledger: &Ledger,
    tenant: &str,
    limit: u32,
) -> Result<LedgerBalance, BillingError> {
    let (topped_up_usd, since_ms) = topped_up(ledger, tenant).await?;
    let mut movements = Vec::new();
    let rows = sqlx::query(
        "SELECT id, amount_usd, note, ts_ms FROM balance_topups WHERE tenant = $1 \
         ORDER BY ts_ms DESC, id DESC LIMIT $2",
    )
    .bind(tenant)
    .bind(i64::from(limit))
    .fetch_all(ledger.pool())
    .await?;
    for r in rows {
        movements.push(Movement {
            kind: "topup".into(),
            id: r.try_get("id")?,
            amount_usd: decimal("amount_usd", &r.try_get::<String, _>("amount_usd")?)?,
            ts_ms: ms(r.try_get("ts_ms")?),
            model: None,
            note: r.try_get("note")?,
        });
    }
    let mut charged_usd = Decimal::ZERO;
    let mut charges = Vec::new();
    if let Some(since) = since_ms {
        let mut rows = sqlx::query(
            "SELECT request_id, model, ts_ms, cost_usd, \
             CASE WHEN cache_hit THEN 1 ELSE 0 END AS cache_hit \
             FROM usage_events WHERE kind = 'charge' AND tenant = $1 AND ts_ms >= $2 \
             ORDER BY ts_ms DESC, request_id DESC",
        )
        .bind(tenant)
        .bind(crate::reconcile::ms_param(since))
        // Streamed: a tenant's charges since its first top-up can be more rows than fit in memory.
        .fetch(ledger.pool());
        while let Some(r) = rows.try_next().await? {
            let hit = r.try_get::<i64, _>("cache_hit")? != 0;
            let usd = match r.try_get::<Option<String>, _>("cost_usd")? {
                Some(c) if !hit => decimal("cost_usd", &c)?,
                _ => Decimal::ZERO,
            };
            charged_usd += usd;
            if charges.len() < limit as usize {
                charges.push(Movement {
                    kind: "charge".into(),
                    id: r.try_get("request_id")?,
                    amount_usd: -usd,
                    ts_ms: ms(r.try_get("ts_ms")?),
                    model: r.try_get("model")?,
                    note: None,
                });
            }
        }
    }
    movements.extend(charges);
    movements.sort_by(|a, b| b.ts_ms.cmp(&a.ts_ms).then_with(|| b.id.cmp(&a.id)));
    movements.truncate(limit as usize);
    Ok(LedgerBalance {
        topped_up_usd,
        charged_usd,
        since_ms,
        movements,
    })
}

async fn answer(ledger: &Ledger, req: BalanceRequest) -> Result<BalanceAnswer, BillingError> {
    Ok(match req {
        BalanceRequest::TopUp {
            id,
            tenant,
            amount_usd,
            note,
            ts_ms,
        } => {
            if amount_usd <= Decimal::ZERO || id.is_empty() || id.len() > 128 {
                return Ok(BalanceAnswer::Err {
                    error: "invalid top-up: amount_usd must be > 0 and id 1..=128 chars".into(),
                });
            }
            let t = TopUp {
                id,
                tenant,
                amount_usd,
                note,
                ts_ms,
            };
            match top_up(ledger, &t).await? {
                Ok((topup, created)) => {
                    let totals = ledger_balance(ledger, &topup.tenant, 1).await?;
                    BalanceAnswer::TopUp {
                        topup,
                        created,
                        topped_up_usd: totals.topped_up_usd,
                        charged_usd: totals.charged_usd,
                    }
                }
                Err(error) => BalanceAnswer::Conflict { error },
            }
        }
        BalanceRequest::Show { tenant, limit } => BalanceAnswer::Show(
            ledger_balance(ledger, &tenant, limit.clamp(1, MAX_MOVEMENTS)).await?,
        ),
    })
}

/// The JSON answer to one request payload, as [`crate::serve_queries`] sends it on
/// `<prefix>.billing.balance`: what a JSON [`BalanceRequest`] asks for, or an error.
pub(crate) async fn reply(ledger: &Ledger, payload: &[u8]) -> Vec<u8> {
    let answer = match serde_json::from_slice::<BalanceRequest>(payload) {
        Ok(req) => answer(ledger, req)
            .await
            .unwrap_or_else(|e| BalanceAnswer::Err {
                error: e.to_string(),
            }),
        Err(e) => BalanceAnswer::Err {
            error: format!("bad balance request: {e}"),
        },
    };
    serde_json::to_vec(&answer).unwrap_or_else(|e| {
        tracing::error!(error = %e, "encoding a balance answer failed");
        b"{\"result\":\"err\",\"error\":\"encoding the balance answer failed\"}".to_vec()
    })
}
