//! The audit log (docs/audit.md): the `audit_log` table, written from `charge` events in the
//! ledger's insert transaction (`crate::ledger_write`), read by page queries ([`page`], served over NATS by
//! [`crate::serve_queries`] with [`Query::Audit`](crate::Query::Audit)), and kept to `audit.retention_days` by [`purge_expired`] (batched
//! deletes of [`PURGE_BATCH`] rows on this table only, run by [`run_retention`]).

use crate::row::{from_columns, parse_decimal};
use crate::{BillingError, Ledger};
use rust_decimal::Decimal;
use sqlx::Row;
use sqlx::any::AnyRow;
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;
use switchyard_schemas::audit::{
    AuditAnswer, AuditAttempt, AuditPage, AuditQuery, AuditRecord, MAX_PAGE, cursor_of,
    parse_cursor,
};

/// Rows one retention `DELETE` removes at most.
pub const PURGE_BATCH: i64 = 1000;
/// How often [`run_retention`] looks for expired rows.
pub const PURGE_EVERY: Duration = Duration::from_secs(60);
/// One day, ms.
const DAY_MS: u64 = 86_400_000;

/// Why an audit query was not answered.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The query is wrong (bad cursor, limit out of range); the message says how.
    #[error("invalid audit query: {0}")]
    Invalid(String),
    /// Reading the ledger failed.
    #[error(transparent)]
    Billing(#[from] BillingError),
}

const SELECT: &str = "SELECT request_id, ts_ms, front_door, key_id, tenant, model, target, \
     upstream_model, status, http_status, error_class, finish_reason, fallbacks, attempts, \
     prompt_tokens, completion_tokens, cached_tokens, charge_usd, ttft_ms, latency_ms, \
     overhead_ms, CASE WHEN cache_hit THEN 1 ELSE 0 END AS cache_hit, client_ip, user_agent, \
     client_request_id, request_body, response_body, error_code, cache_outcome FROM audit_log";

/// One page of the audit log, newest first by (`ts_ms`, `request_id`); `cost_usd` of each
/// record is the sum of its stored `upstream` rows' costs.
pub async fn page(ledger: &Ledger, q: &AuditQuery) -> Result<AuditPage, AuditError> {
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return Err(AuditError::Invalid(format!(
            "limit {limit} is not in 1..={MAX_PAGE}"
        )));
    }
    let mut clauses: Vec<String> = Vec::new();
    let mut ints: Vec<(usize, i64)> = Vec::new();
    let mut strs: Vec<(usize, String)> = Vec::new();
    let mut n = 0;
    let mut next = || {
        n += 1;
        n
    };
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    if let Some(from) = q.from_ms {
        let i = next();
        clauses.push(format!("ts_ms >= ${i}"));
        ints.push((i, int(from)));
    }
    if let Some(to) = q.to_ms {
        let i = next();
        clauses.push(format!("ts_ms < ${i}"));
        ints.push((i, int(to)));
    }
    for (column, value) in [
        ("key_id", &q.key_id),
        ("tenant", &q.tenant),
        ("model", &q.model),
    ] {
        if let Some(v) = value {
            let i = next();
            clauses.push(format!("{column} = ${i}"));
            strs.push((i, v.clone()));
        }
    }
    if let Some(status) = &q.status {
        let i = next();
        match status.parse::<u16>() {
            Ok(code) => {
                clauses.push(format!("http_status = ${i}"));
                ints.push((i, i64::from(code)));
            }
            Err(_) => {
                clauses.push(format!("status = ${i}"));
                strs.push((i, status.clone()));
            }
        }
    }
    if let Some(cursor) = &q.cursor {
        let (ts, id) = parse_cursor(cursor)
            .ok_or_else(|| AuditError::Invalid(format!("malformed cursor `{cursor}`")))?;
        let (a, b, c) = (next(), next(), next());
        clauses.push(format!(
            "(ts_ms < ${a} OR (ts_ms = ${b} AND request_id < ${c}))"
        ));
        ints.push((a, int(ts)));
        ints.push((b, int(ts)));
        strs.push((c, id));
    }
    let limit_at = next();
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    let sql = format!("{SELECT}{filter} ORDER BY ts_ms DESC, request_id DESC LIMIT ${limit_at}");
    // Binds in placeholder order (SQLite binds `$n` by number too, but keep them ordered).
    let mut binds: Vec<(usize, Result<i64, String>)> = ints
        .into_iter()
        .map(|(i, v)| (i, Ok(v)))
        .chain(strs.into_iter().map(|(i, v)| (i, Err(v))))
        .collect();
    binds.sort_by_key(|(i, _)| *i);
    let mut query = sqlx::query(&sql);
    for (_, v) in &binds {
        query = match v {
            Ok(i) => query.bind(*i),
            Err(s) => query.bind(s.as_str()),
        };
    }
    // One more than asked tells whether a next page exists.
    let rows = query
        .bind(i64::from(limit) + 1)
        .fetch_all(ledger.pool())
        .await
        .map_err(BillingError::from)?;
    let mut data = rows.iter().map(record_of).collect::<Result<Vec<_>, _>>()?;
    let more = data.len() > limit as usize;
    data.truncate(limit as usize);
    add_costs(ledger, &mut data).await?;
    let next_cursor = more
        .then(|| data.last().map(|r| cursor_of(r.ts_ms, &r.request_id)))
        .flatten();
    Ok(AuditPage { data, next_cursor })
}

/// Fills each record's `cost_usd` with the sum of its `upstream` rows' costs (`None` when none
/// is priced).
async fn add_costs(ledger: &Ledger, data: &mut [AuditRecord]) -> Result<(), BillingError> {
    if data.is_empty() {
        return Ok(());
    }
    let marks: Vec<String> = (1..=data.len()).map(|i| format!("${i}")).collect();
    let sql = format!(
        "SELECT request_id, cost_usd FROM usage_events WHERE kind = 'upstream' AND \
         request_id IN ({})",
        marks.join(", ")
    );
    let mut query = sqlx::query(&sql);
    for r in data.iter() {
        query = query.bind(r.request_id.as_str());
    }
    let mut sums: HashMap<String, Decimal> = HashMap::new();
    for row in query.fetch_all(ledger.pool()).await? {
        let id: String = row.try_get(0)?;
        let cost: Option<String> = row.try_get(1)?;
        if let Some(c) = cost {
            // A cost that does not parse fails the page rather than shrink the sum.
            let c = parse_decimal(&id, &c)?;
            *sums.entry(id).or_default() += c;
        }
    }
    for r in data {
        r.cost_usd = sums.get(&r.request_id).map(|d| d.normalize().to_string());
    }
    Ok(())
}

fn record_of(row: &AnyRow) -> Result<AuditRecord, BillingError> {
    let u = |c: &str| -> Result<u64, BillingError> {
        let v: i64 = row.try_get(c)?;
        u64::try_from(v).map_err(|_| BillingError::CorruptRow(format!("{c} = {v}")))
    };
    let ou = |c: &str| -> Result<Option<u64>, BillingError> {
        Ok(row
            .try_get::<Option<i64>, _>(c)?
            .and_then(|v| u64::try_from(v).ok()))
    };
    let attempts: String = row.try_get("attempts")?;
    let attempts: Vec<AuditAttempt> = serde_json::from_str(&attempts)
        .map_err(|e| BillingError::CorruptRow(format!("audit attempts: {e}")))?;
    Ok(from_columns!(
        AuditRecord,
        row,
        [
            request_id,
            front_door,
            key_id,
            tenant,
            model,
            target,
            upstream_model,
            status,
            error_class,
            error_code,
            finish_reason,
            cache_outcome,
            client_ip,
            user_agent,
            client_request_id,
            request_body,
            response_body,
        ],
        {
            ts_ms: u("ts_ms")?,
            http_status: ou("http_status")?.and_then(|v| u16::try_from(v).ok()),
            fallbacks: u32::try_from(u("fallbacks")?).unwrap_or(u32::MAX),
            attempts,
            prompt_tokens: u("prompt_tokens")?,
            completion_tokens: u("completion_tokens")?,
            cached_tokens: u("cached_tokens")?,
            cost_usd: None,
            charge_usd: row.try_get::<Option<String>, _>("charge_usd")?.map(|c| {
                c.parse::<Decimal>()
                    .map_or(c, |d| d.normalize().to_string())
            }),
            ttft_ms: ou("ttft_ms")?,
            latency_ms: u("latency_ms")?,
            overhead_ms: ou("overhead_ms")?,
            cache_hit: row.try_get::<i64, _>("cache_hit")? != 0,
        }
    ))
}

/// Deletes audit rows with `ts_ms` before `now_ms - retention_days` days, at most
/// [`PURGE_BATCH`] rows per statement (each its own short transaction on `audit_log` only, so
/// the usage tables are never locked), until none is left. Returns how many were deleted;
/// `retention_days` 0 deletes nothing.
pub async fn purge_expired(
    ledger: &Ledger,
    now_ms: u64,
    retention_days: u32,
) -> Result<u64, BillingError> {
    if retention_days == 0 {
        return Ok(0);
    }
    let cutoff = now_ms.saturating_sub(u64::from(retention_days) * DAY_MS);
    let cutoff = i64::try_from(cutoff).unwrap_or(i64::MAX);
    let mut total = 0;
    loop {
        let done = sqlx::query(
            "DELETE FROM audit_log WHERE request_id IN \
             (SELECT request_id FROM audit_log WHERE ts_ms < $1 LIMIT $2)",
        )
        .bind(cutoff)
        .bind(PURGE_BATCH)
        .execute(ledger.pool())
        .await?
        .rows_affected();
        total += done;
        if done < PURGE_BATCH as u64 {
            return Ok(total);
        }
    }
}

/// Runs [`purge_expired`] now and every [`PURGE_EVERY`] with the ledger's
/// [`Ledger::audit_retention_days`] until `shutdown` completes.
pub async fn run_retention(ledger: Ledger, shutdown: impl Future) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(PURGE_EVERY);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.as_mut() => return,
            _ = tick.tick() => {}
        }
        let days = ledger.audit_retention_days();
        match purge_expired(&ledger, switchyard_schemas::now_ms(), days).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, retention_days = days, "audit rows expired"),
            Err(e) => tracing::warn!(error = %e, "audit retention pass failed"),
        }
    }
}

/// JSON of `answer`; a page too large for one NATS message (`max_payload` bytes, less room for
/// headers) is cut (halved until it fits) and its `next_cursor` moved to the last kept record.
fn encode(mut answer: AuditAnswer, max_payload: usize) -> Vec<u8> {
    loop {
        let body = match serde_json::to_vec(&answer) {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(error = %e, "encoding an audit answer failed");
                return b"{\"error\":\"encoding the audit answer failed\"}".to_vec();
            }
        };
        let fits = max_payload == 0 || body.len() + 1024 <= max_payload;
        match &mut answer {
            AuditAnswer::Ok(p) if !fits && p.data.len() > 1 => {
                p.data.truncate(p.data.len() / 2);
                p.next_cursor = p.data.last().map(|r| cursor_of(r.ts_ms, &r.request_id));
            }
            _ => return body,
        }
    }
}

/// The JSON answer to one request payload, as [`crate::serve_queries`] sends it on
/// `<prefix>.billing.audit`: the [`page`] a JSON [`AuditQuery`] asks for, or an error; cut to fit
/// `max_payload` bytes (0: no limit).
pub(crate) async fn reply(ledger: &Ledger, payload: &[u8], max_payload: usize) -> Vec<u8> {
    let answer = match serde_json::from_slice::<AuditQuery>(payload) {
        Ok(q) => match page(ledger, &q).await {
            Ok(p) => AuditAnswer::Ok(p),
            Err(e) => AuditAnswer::Err {
                error: e.to_string(),
            },
        },
        Err(e) => AuditAnswer::Err {
            error: format!("bad audit query: {e}"),
        },
    };
    encode(answer, max_payload)
}
