//! The write statements of the ledger: multi-row inserts into `usage_events`, `ledger_lines`
//! and `audit_log`, declared once per table next to the values they bind, and the body of one
//! insert transaction ([`store`]). Above [`crate::row`] and [`crate::multi_row`], below the
//! [`Ledger`](crate::Ledger), which prices the rows and calls it.

use crate::BillingError;
use crate::multi_row::{PerBackend, StatementTexts, insert_columns, statement_sizes};
use crate::pricing::Cost;
use crate::row::{AuditValues, Backend, UsageRow};
use sqlx::Row;
use std::collections::{HashMap, HashSet};

insert_columns! {
    usage_events, INSERT_HEAD, EVENT_COLUMNS,
    fn bind_event<'q>(
        row: &'q UsageRow,
        ingested_at_ms: i64,
        price: &'q Price,
    ) {
        request_id: row.request_id.as_str(),
        kind: row.kind,
        attempt: row.attempt,
        ts_ms: row.ts_ms,
        tenant: row.tenant.as_deref(),
        key_id: row.key_id.as_deref(),
        model: row.model.as_str(),
        target: row.target.as_deref(),
        upstream_model: row.upstream_model.as_deref(),
        prompt_tokens: row.prompt_tokens,
        cached_tokens: row.cached_tokens,
        cache_write_tokens: row.cache_write_tokens,
        completion_tokens: row.completion_tokens,
        reasoning_tokens: row.reasoning_tokens,
        estimated: row.estimated,
        status: row.status,
        error_class: row.error_class,
        ttft_ms: row.ttft_ms,
        latency_ms: row.latency_ms,
        fallbacks: row.fallbacks,
        cache_hit: row.cache_hit,
        batch_id: row.batch_id.as_deref(),
        raw: row.raw.as_str(),
        ingested_at_ms: ingested_at_ms,
        cost_usd: price.total.as_deref(),
        cache_write_1h_tokens: row.cache_write_1h_tokens,
        audio_input_tokens: row.audio_input_tokens,
        audio_output_tokens: row.audio_output_tokens,
        service_tier: row.service_tier,
        unpriced: price.unpriced.as_deref(),
        finish_reason: row.finish_reason,
    }
}
/// The keys of the rows an event insert stored (a conflicting row returns nothing).
const INSERT_TAIL: &str = " ON CONFLICT DO NOTHING RETURNING request_id, kind, attempt";

insert_columns! {
    ledger_lines, LINE_HEAD, LINE_COLUMNS,
    fn bind_line<'q>(line: &'q LineValues<'_>) {
        request_id: line.row.request_id.as_str(),
        kind: line.row.kind,
        attempt: line.row.attempt,
        billing_type: line.billing_type,
        tokens: line.tokens,
        unit_price_usd: line.unit_price.as_str(),
        amount_usd: line.amount.as_str(),
    }
}
/// Tail of the line insert when a line may already exist (see [`Ledger::insert_rows`](crate::Ledger)).
const LINE_TAIL_TOLERANT: &str = " ON CONFLICT DO NOTHING";

/// Most events in one INSERT statement, rows (a power of two; 512 × 31 = 15,872 bind values,
/// below SQLite's 32,766 and PostgreSQL's 65,535).
const EVENTS_PER_STATEMENT: usize = 512;
/// Most ledger lines in one INSERT statement, rows (a power of two; 2,048 × 7 = 14,336 values).
const LINES_PER_STATEMENT: usize = 2048;

/// The event inserts, and the line inserts without and with `ON CONFLICT DO NOTHING`, of
/// `backend`.
fn statement_texts(backend: Backend) -> &'static [StatementTexts; 3] {
    static TEXTS: PerBackend<[StatementTexts; 3]> = PerBackend::new();
    TEXTS.get(backend, |backend| {
        let (head, tail) = (INSERT_HEAD, INSERT_TAIL);
        [
            StatementTexts::build(backend, head, EVENT_COLUMNS, EVENTS_PER_STATEMENT, tail),
            StatementTexts::build(backend, LINE_HEAD, LINE_COLUMNS, LINES_PER_STATEMENT, ""),
            StatementTexts::build(
                backend,
                LINE_HEAD,
                LINE_COLUMNS,
                LINES_PER_STATEMENT,
                LINE_TAIL_TOLERANT,
            ),
        ]
    })
}

/// One `ledger_lines` row ready to bind.
struct LineValues<'a> {
    row: &'a UsageRow,
    billing_type: &'static str,
    tokens: i64,
    unit_price: String,
    amount: String,
}

insert_columns! {
    audit_log, AUDIT_HEAD, AUDIT_COLUMNS,
    fn bind_audit<'q>(row: &'q UsageRow, a: &'q AuditValues, charge_usd: Option<&'q str>) {
        request_id: row.request_id.as_str(),
        ts_ms: row.ts_ms,
        front_door: a.front_door.as_deref(),
        key_id: row.key_id.as_deref(),
        tenant: row.tenant.as_deref(),
        model: row.model.as_str(),
        target: row.target.as_deref(),
        upstream_model: row.upstream_model.as_deref(),
        status: row.status,
        http_status: a.http_status,
        error_class: row.error_class,
        finish_reason: a.finish_reason.as_deref(),
        fallbacks: row.fallbacks,
        attempts: a.attempts.as_str(),
        prompt_tokens: row.prompt_tokens,
        completion_tokens: row.completion_tokens,
        cached_tokens: row.cached_tokens,
        charge_usd: charge_usd,
        ttft_ms: row.ttft_ms,
        latency_ms: row.latency_ms,
        overhead_ms: a.overhead_ms,
        cache_hit: row.cache_hit,
        client_ip: a.client_ip.as_deref(),
        user_agent: a.user_agent.as_deref(),
        client_request_id: a.client_request_id.as_deref(),
        request_body: a.request_body.as_deref(),
        response_body: a.response_body.as_deref(),
        error_code: a.error_code.as_deref(),
        cache_outcome: a.cache_outcome.as_deref(),
    }
}
/// 512 × 29 = 14,848 bind values, below SQLite's 32,766.
const AUDITS_PER_STATEMENT: usize = 512;
/// Tail of the audit insert: a request's audit row is stored once.
const AUDIT_TAIL: &str = " ON CONFLICT DO NOTHING";

/// The audit inserts of `backend`.
fn audit_texts(backend: Backend) -> &'static StatementTexts {
    static TEXTS: PerBackend<StatementTexts> = PerBackend::new();
    TEXTS.get(backend, |backend| {
        StatementTexts::build(
            backend,
            AUDIT_HEAD,
            AUDIT_COLUMNS,
            AUDITS_PER_STATEMENT,
            AUDIT_TAIL,
        )
    })
}

/// The price of one row, worked out once by the [`Ledger`](crate::Ledger) before the
/// transaction: what [`store`] writes into `usage_events.cost_usd`, `unpriced`, the ledger lines
/// and the audit row's `charge_usd`.
#[derive(Debug, Default)]
pub(crate) struct Price {
    /// Cost price (`upstream`) or charge (`charge`); `None`: not priced.
    pub(crate) cost: Option<Cost>,
    /// `cost.total` as the exact decimal text stored (`None` with `cost`).
    pub(crate) total: Option<String>,
    /// What had no price, comma-separated (`None`: everything priced).
    pub(crate) unpriced: Option<String>,
}

impl Price {
    /// `cost` and what had no price (comma-separated; `None` when everything was priced).
    pub(crate) fn new(cost: Option<Cost>, unpriced: Option<String>) -> Self {
        Self {
            total: cost.as_ref().map(|c| c.total.to_string()),
            cost,
            unpriced,
        }
    }
}

/// One transaction storing `rows` (usage rows, priced: `prices[i]` is `rows[i]`'s) and
/// `refused` (`audit` events: an audit row each, no usage row), as
/// [`Ledger::insert_rows`](crate::Ledger) describes; `tolerant` adds `ON CONFLICT DO NOTHING` to
/// the line inserts. Returns the rows newly inserted (usage rows plus refused requests' audit
/// rows).
pub(crate) async fn store(
    pool: &sqlx::AnyPool,
    backend: Backend,
    rows: &[&UsageRow],
    prices: &[Price],
    refused: &[&UsageRow],
    tolerant: bool,
) -> Result<u64, BillingError> {
    let [events_sql, lines_sql, tolerant_lines_sql] = statement_texts(backend);
    let lines_sql = if tolerant {
        tolerant_lines_sql
    } else {
        lines_sql
    };
    let ingested_at_ms = i64::try_from(switchyard_schemas::now_ms()).unwrap_or(i64::MAX);
    // The first occurrence of each key in the batch, by index: a key the insert returns marks it.
    let mut first: HashMap<(&str, &str, i64), usize> = HashMap::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        first
            .entry((row.request_id.as_str(), row.kind, row.attempt))
            .or_insert(i);
    }
    let mut stored = vec![false; rows.len()];
    let mut tx = pool.begin().await?;
    let mut offset = 0;
    for size in statement_sizes(rows.len(), EVENTS_PER_STATEMENT) {
        let sql = events_sql.get(size);
        let mut query = sqlx::query(&sql);
        for (row, price) in rows[offset..offset + size]
            .iter()
            .zip(&prices[offset..offset + size])
        {
            query = bind_event(query, row, ingested_at_ms, price);
        }
        for key in query.fetch_all(&mut *tx).await? {
            let (id, kind, attempt): (String, String, i64) =
                (key.try_get(0)?, key.try_get(1)?, key.try_get(2)?);
            if let Some(&i) = first.get(&(id.as_str(), kind.as_str(), attempt)) {
                stored[i] = true;
            }
        }
        offset += size;
    }
    let inserted = stored.iter().filter(|s| **s).count() as u64;
    // The audit rows of the newly stored `charge` events, in the same transaction, and those of
    // the refused requests (counted as inserted when new).
    let charges = rows
        .iter()
        .zip(prices)
        .zip(&stored)
        .filter(|(_, stored)| **stored)
        .map(|((row, price), _)| (*row, price.total.as_deref()));
    insert_audit(backend, &mut tx, charges).await?;
    let refused = insert_audit(backend, &mut tx, refused.iter().map(|row| (*row, None))).await?;
    // Lines only with a newly stored event (its first occurrence in the batch).
    let mut lines = Vec::new();
    for ((row, price), _) in rows.iter().zip(prices).zip(&stored).filter(|(_, s)| **s) {
        let Some(cost) = &price.cost else { continue };
        lines.extend(cost.lines.iter().map(|line| LineValues {
            row,
            billing_type: line.billing_type.as_str(),
            tokens: i64::try_from(line.tokens).unwrap_or(i64::MAX),
            unit_price: line.unit_price.normalize().to_string(),
            amount: line.amount.normalize().to_string(),
        }));
    }
    let mut offset = 0;
    for size in statement_sizes(lines.len(), LINES_PER_STATEMENT) {
        let sql = lines_sql.get(size);
        let mut query = sqlx::query(&sql);
        for line in &lines[offset..offset + size] {
            query = bind_line(query, line);
        }
        query.execute(&mut *tx).await?;
        offset += size;
    }
    tx.commit().await?;
    Ok(inserted + refused)
}

/// Inserts the audit row of every row of `rows` that has audit values (a `charge` or `audit`
/// event), each with its charge text (USD), first occurrence of a request id only, inside `tx`.
/// Returns the audit rows newly inserted (`ON CONFLICT DO NOTHING` keyed by request id).
async fn insert_audit<'a>(
    backend: Backend,
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    rows: impl Iterator<Item = (&'a UsageRow, Option<&'a str>)>,
) -> Result<u64, BillingError> {
    let mut seen = HashSet::new();
    let audit: Vec<(&UsageRow, &AuditValues, Option<&str>)> = rows
        .filter_map(|(row, charge)| {
            let values = row.audit.as_deref()?;
            seen.insert(row.request_id.as_str())
                .then_some((row, values, charge))
        })
        .collect();
    let mut offset = 0;
    let mut inserted = 0;
    for size in statement_sizes(audit.len(), AUDITS_PER_STATEMENT) {
        let sql = audit_texts(backend).get(size);
        let mut query = sqlx::query(&sql);
        for (row, a, charge) in &audit[offset..offset + size] {
            query = bind_audit(query, row, a, *charge);
        }
        inserted += query.execute(&mut **tx).await?.rows_affected();
        offset += size;
    }
    Ok(inserted)
}
