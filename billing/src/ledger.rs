//! The usage ledger: one SQL row per [`UsageEvent`], on SQLite (default) or PostgreSQL.
//!
//! Both backends go through one [`sqlx::AnyPool`], so every query is written once. The SQL sticks
//! to the common subset: `$n` placeholders (SQLite accepts them too), `BIGINT`/`TEXT` columns and
//! `INSERT .. ON CONFLICT DO NOTHING`. The one difference, booleans (`INTEGER` 0/1 in SQLite,
//! `BOOLEAN` in PostgreSQL), is bound as Rust `bool` and read back through
//! `CASE WHEN col THEN 1 ELSE 0 END`, which yields an integer on both. Each backend has its own
//! migration directory, embedded at compile time.

use crate::BillingError;
use crate::pricing::{Catalog, Cost, UnpricedPolicy};
use rust_decimal::Decimal;
use serde::de::DeserializeOwned;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Row};
use std::collections::HashSet;
use std::time::Duration;
use switchyard_schemas::usage::{ServiceTier, Usage, UsageEvent, UsageStatus};
use switchyard_schemas::{ErrorClass, FinishReason, UsageKind};
use uuid::Uuid;

pub use crate::ledger_url::ScratchSchema;
use crate::ledger_url::{connect_options, prepare_sqlite_url};
use crate::multi_row::{PerBackend, StatementTexts, insert_columns, statement_sizes};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

/// How long a SQLite connection waits for a competing writer's lock before failing.
const SQLITE_BUSY_TIMEOUT_MS: u32 = 5_000;

/// Which database a [`Ledger`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file (`sqlite://path`), journal in WAL mode.
    Sqlite,
    /// A PostgreSQL database (`postgres://...`).
    Postgres,
}

impl Backend {
    /// The backend a ledger URL names, if any: `sqlite:` or `postgres://` / `postgresql://`.
    pub fn from_url(url: &str) -> Option<Self> {
        if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else {
            None
        }
    }
}

/// The durable record of usage events. Cheap to clone (shares one connection pool).
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: AnyPool,
    backend: Backend,
    catalog: CatalogSource,
    unpriced: Option<UnpricedPolicy>,
}

/// Where the ledger's prices come from.
#[derive(Debug, Clone)]
enum CatalogSource {
    /// One catalog for the ledger's life.
    Fixed(std::sync::Arc<Catalog>),
    /// The live config's: each row is priced with the snapshot current when it is stored.
    Live(switchyard_schemas::config::ConfigHandle),
}

/// One [`UsageEvent`] checked and converted to the ledger's column types, plus its original JSON.
#[derive(Debug, Clone)]
pub(crate) struct UsageRow {
    pub(crate) request_id: String,
    pub(crate) kind: &'static str,
    pub(crate) attempt: i64,
    pub(crate) ts_ms: i64,
    pub(crate) tenant: Option<String>,
    pub(crate) key_id: Option<String>,
    pub(crate) model: String,
    pub(crate) target: Option<String>,
    pub(crate) upstream_model: Option<String>,
    pub(crate) prompt_tokens: i64,
    pub(crate) cached_tokens: i64,
    pub(crate) cache_write_tokens: i64,
    pub(crate) completion_tokens: i64,
    pub(crate) reasoning_tokens: i64,
    pub(crate) cache_write_1h_tokens: i64,
    pub(crate) audio_input_tokens: i64,
    pub(crate) audio_output_tokens: i64,
    pub(crate) service_tier: Option<&'static str>,
    /// `finish_reason` column: OpenAI vocabulary, `None` without an end.
    pub(crate) finish_reason: Option<&'static str>,
    pub(crate) estimated: bool,
    pub(crate) status: &'static str,
    pub(crate) error_class: Option<&'static str>,
    pub(crate) ttft_ms: Option<i64>,
    pub(crate) latency_ms: i64,
    pub(crate) fallbacks: i64,
    pub(crate) cache_hit: bool,
    pub(crate) batch_id: Option<String>,
    pub(crate) raw: String,
    /// The audit values of a `charge` event (`None` for `upstream`).
    pub(crate) audit: Option<Box<crate::audit::AuditValues>>,
}

impl UsageRow {
    /// Checks `event` fits the columns (counts within `i64`, no NUL in strings, which PostgreSQL
    /// `TEXT` rejects) and converts it. `raw` is the JSON to keep; `None` re-serialises `event`.
    pub(crate) fn from_event(
        event: &UsageEvent,
        raw: Option<String>,
    ) -> Result<Self, BillingError> {
        let invalid = |reason: String| BillingError::InvalidEvent {
            request_id: event.request_id,
            kind: event.kind.as_str(),
            attempt: event.attempt,
            reason,
        };
        let int = |field: &str, value: u64| {
            i64::try_from(value).map_err(|_| invalid(format!("{field} = {value} exceeds i64::MAX")))
        };
        let text = |field: &str, value: &str| {
            if value.contains('\0') {
                Err(invalid(format!("{field} contains a NUL character")))
            } else {
                Ok(value.to_owned())
            }
        };
        let opt_text = |field: &str, value: &Option<String>| {
            value.as_deref().map(|v| text(field, v)).transpose()
        };
        // Captured bodies live in `audit_log` only (under its retention), not in `raw`.
        let has_bodies = event
            .audit
            .as_ref()
            .is_some_and(|a| a.request_body.is_some() || a.response_body.is_some());
        let raw = match raw {
            Some(raw) if !has_bodies => raw,
            _ if has_bodies => {
                let mut lean = event.clone();
                if let Some(a) = lean.audit.as_mut() {
                    a.request_body = None;
                    a.response_body = None;
                }
                serde_json::to_string(&lean).map_err(|e| invalid(e.to_string()))?
            }
            _ => serde_json::to_string(event).map_err(|e| invalid(e.to_string()))?,
        };
        let audit = match event.kind {
            UsageKind::Charge | UsageKind::Audit => Some(Box::new(
                crate::audit::AuditValues::of(event).map_err(invalid)?,
            )),
            UsageKind::Upstream => None,
        };
        let usage = &event.usage;
        Ok(Self {
            request_id: event.request_id.to_string(),
            kind: event.kind.as_str(),
            attempt: i64::from(event.attempt),
            ts_ms: int("ts_ms", event.ts_ms)?,
            tenant: opt_text("tenant", &event.tenant)?,
            key_id: opt_text("key_id", &event.key_id)?,
            model: text("model", &event.model)?,
            target: opt_text("target", &event.target)?,
            upstream_model: opt_text("upstream_model", &event.upstream_model)?,
            prompt_tokens: int("prompt_tokens", usage.prompt_tokens)?,
            cached_tokens: int("cached_tokens", usage.cached_tokens)?,
            cache_write_tokens: int("cache_write_tokens", usage.cache_write_tokens)?,
            completion_tokens: int("completion_tokens", usage.completion_tokens)?,
            reasoning_tokens: int("reasoning_tokens", usage.reasoning_tokens)?,
            cache_write_1h_tokens: int("cache_write_1h_tokens", usage.cache_write_1h_tokens)?,
            audio_input_tokens: int("audio_input_tokens", usage.audio_input_tokens)?,
            audio_output_tokens: int("audio_output_tokens", usage.audio_output_tokens)?,
            service_tier: usage.service_tier.map(ServiceTier::as_str),
            finish_reason: event.finish_reason.map(FinishReason::as_str),
            estimated: event.estimated,
            status: status_str(event.status),
            error_class: event.error_class.map(ErrorClass::as_str),
            ttft_ms: event.ttft_ms.map(|v| int("ttft_ms", v)).transpose()?,
            latency_ms: int("latency_ms", event.latency_ms)?,
            fallbacks: i64::from(event.fallbacks),
            cache_hit: event.cache_hit,
            batch_id: opt_text("batch_id", &event.batch_id)?,
            raw,
            audit,
        })
    }
}

impl UsageRow {
    /// Which of `lanes` (≥ 1) concurrent writers stores this row: a function of the request id
    /// only, so every copy of one event goes to the same writer and two concurrent transactions
    /// never insert the same key (which could deadlock them on PostgreSQL).
    pub(crate) fn lane(&self, lanes: usize) -> usize {
        let hash = self.request_id.bytes().fold(0usize, |h, b| {
            h.wrapping_mul(31).wrapping_add(usize::from(b))
        });
        hash % lanes.max(1)
    }

    /// The token counts (validated non-negative at construction).
    fn usage(&self) -> Usage {
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        Usage {
            prompt_tokens: u(self.prompt_tokens),
            cached_tokens: u(self.cached_tokens),
            cache_write_tokens: u(self.cache_write_tokens),
            completion_tokens: u(self.completion_tokens),
            reasoning_tokens: u(self.reasoning_tokens),
            cache_write_1h_tokens: u(self.cache_write_1h_tokens),
            audio_input_tokens: u(self.audio_input_tokens),
            audio_output_tokens: u(self.audio_output_tokens),
            service_tier: self.service_tier.and_then(ServiceTier::from_provider),
        }
    }
}

/// The name a [`UsageStatus`] is stored (and reported) under.
pub(crate) fn status_str(status: UsageStatus) -> &'static str {
    match status {
        UsageStatus::Ok => "ok",
        UsageStatus::Error => "error",
        UsageStatus::Cancelled => "cancelled",
    }
}

insert_columns! {
    usage_events, INSERT_HEAD, EVENT_COLUMNS,
    fn bind_event<'q>(
        row: &'q UsageRow,
        ingested_at_ms: i64,
        cost_usd: Option<String>,
        unpriced: Option<&'q str>,
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
        cost_usd: cost_usd,
        cache_write_1h_tokens: row.cache_write_1h_tokens,
        audio_input_tokens: row.audio_input_tokens,
        audio_output_tokens: row.audio_output_tokens,
        service_tier: row.service_tier,
        unpriced: unpriced,
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
/// Tail of the line insert when a line may already exist (see [`Ledger::insert_rows`]).
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

/// The `usage_events` columns [`from_usage_row`] reads (with [`usage_from_row`]'s), as a
/// `SELECT` list for `concat!`.
macro_rules! usage_row_columns {
    () => {
        "request_id, kind, attempt, ts_ms, tenant, key_id, model, target, upstream_model, \
         prompt_tokens, cached_tokens, cache_write_tokens, completion_tokens, reasoning_tokens, \
         cache_write_1h_tokens, audio_input_tokens, audio_output_tokens, service_tier, \
         CASE WHEN estimated THEN 1 ELSE 0 END AS estimated, status, fallbacks, \
         CASE WHEN cache_hit THEN 1 ELSE 0 END AS cache_hit, batch_id"
    };
}
pub(crate) use usage_row_columns;

/// The columns [`event_from_row`] reads.
const SELECT_COLUMNS: &str = concat!(
    usage_row_columns!(),
    ", error_class, ttft_ms, latency_ms, finish_reason"
);

impl Ledger {
    /// Connects to the ledger at `url` and applies pending migrations.
    ///
    /// `sqlite://<path>` (relative to the working directory; `sqlite:///abs/path` for absolute
    /// paths): the file and its parent directory are created if missing (`mode=rwc` is implied),
    /// the journal is switched to WAL and every connection waits up to 5 s on a locked database.
    /// `sqlite::memory:` gives a private in-memory ledger (single connection).
    /// `postgres://user@host:port/db[?options=-c%20search_path%3Dschema]`: a PostgreSQL database.
    pub async fn connect(url: &str) -> Result<Self, BillingError> {
        sqlx::any::install_default_drivers();
        let backend =
            Backend::from_url(url).ok_or_else(|| BillingError::UnsupportedUrl(url.to_owned()))?;
        let pool = match backend {
            Backend::Sqlite => {
                let (url, in_memory) = prepare_sqlite_url(url)?;
                let pool = AnyPoolOptions::new()
                    .max_connections(if in_memory { 1 } else { 4 })
                    .after_connect(|conn, _meta| {
                        Box::pin(async move {
                            let pragma = format!("PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}");
                            sqlx::query(&pragma).execute(conn).await.map(|_| ())
                        })
                    })
                    .connect_with(connect_options(&url)?)
                    .await?;
                if !in_memory {
                    // Persistent in the file: once set, every later connection uses WAL.
                    sqlx::query("PRAGMA journal_mode = WAL")
                        .execute(&pool)
                        .await?;
                }
                SQLITE_MIGRATIONS.run(&pool).await?;
                pool
            }
            Backend::Postgres => {
                let pool = AnyPoolOptions::new()
                    .max_connections(8)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(connect_options(url)?)
                    .await?;
                POSTGRES_MIGRATIONS.run(&pool).await?;
                pool
            }
        };
        let catalog = std::sync::Arc::new(Catalog::bundled().unwrap_or_else(|e| {
            tracing::error!(error = %e, "bundled pricing catalog unreadable; costs will be NULL");
            Catalog::empty()
        }));
        Ok(Self {
            pool,
            backend,
            catalog: CatalogSource::Fixed(catalog),
            unpriced: None,
        })
    }

    /// Uses `catalog` to price events from now on (default: the bundled catalog).
    pub fn with_catalog(mut self, catalog: Catalog) -> Self {
        self.catalog = CatalogSource::Fixed(std::sync::Arc::new(catalog));
        self
    }

    /// Prices each event with the catalog of `config`'s current snapshot
    /// ([`ConfigHandle::catalog`](switchyard_schemas::config::ConfigHandle::catalog)), so a pushed
    /// `pricing_file` change prices the next usage row; an unreadable catalog prices nothing.
    pub fn with_live_catalog(mut self, config: switchyard_schemas::config::ConfigHandle) -> Self {
        self.catalog = CatalogSource::Live(config);
        self
    }

    /// The pricing catalog in use now.
    pub fn catalog(&self) -> std::sync::Arc<Catalog> {
        match &self.catalog {
            CatalogSource::Fixed(c) => c.clone(),
            CatalogSource::Live(h) => h
                .catalog()
                .unwrap_or_else(|| std::sync::Arc::new(Catalog::empty())),
        }
    }

    /// Charges what has no price by `policy` (the config's `unpriced:`; default `None`: $0,
    /// recorded). Only [`UnpricedPolicy::ChargeAt`] changes amounts; every policy records the
    /// gap in the row's `unpriced` column.
    pub fn with_unpriced(mut self, policy: Option<UnpricedPolicy>) -> Self {
        self.unpriced = policy;
        self
    }

    /// Prices one row: cost price for `upstream` events, charge for `charge` events, with what
    /// had no price (see [`Cost::unpriced`]; `model` when the model has no card at all and the
    /// row has tokens to price). Nothing is unpriced on a row without tokens or a cache hit.
    fn price(&self, row: &UsageRow) -> (Option<Cost>, Vec<&'static str>) {
        let usage = row.usage();
        // Batch items are priced at the catalog's batch rate (`batch_discount`).
        let batch = row.batch_id.is_some();
        let catalog = self.catalog();
        let cost = match row.kind {
            "upstream" => match row.upstream_model.as_deref() {
                Some(m) => catalog.upstream_cost(m, &usage, batch),
                None => return (None, Vec::new()),
            },
            // Cache pricing policy: a cache hit is free to the tenant (no upstream call was made);
            // its row keeps the original usage, which prices the savings in reports.
            _ if row.cache_hit => return (Some(Cost::default()), Vec::new()),
            _ => catalog.charge_with(&row.model, &usage, batch, self.unpriced.as_ref()),
        };
        let unpriced = match &cost {
            Some(c) => c.unpriced.clone(),
            None if usage.total_tokens() > 0 => vec!["model"],
            None => Vec::new(),
        };
        (cost, unpriced)
    }

    /// `audit.retention_days` of the live config; the default (30) for a fixed catalog.
    pub fn audit_retention_days(&self) -> u32 {
        match &self.catalog {
            CatalogSource::Live(h) => h.get().audit.retention_days,
            CatalogSource::Fixed(_) => switchyard_schemas::audit::DEFAULT_RETENTION_DAYS,
        }
    }

    /// The database this ledger runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The underlying pool, for ad-hoc queries (reports, budgets). SQL must work on both
    /// backends: `$n` placeholders, booleans read through `CASE WHEN col THEN 1 ELSE 0 END`.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Stores `events` in one transaction; an event whose (`request_id`, `kind`, `attempt`) is
    /// already stored is skipped, so redelivery and replay never double count. Returns how many
    /// rows were newly inserted. Fails without storing anything if any event is not storable
    /// (see [`BillingError::InvalidEvent`]).
    pub async fn insert_batch(&self, events: &[UsageEvent]) -> Result<u64, BillingError> {
        let rows = events
            .iter()
            .map(|event| UsageRow::from_event(event, None))
            .collect::<Result<Vec<_>, _>>()?;
        self.insert_rows(&rows).await
    }

    /// [`Ledger::insert_batch`] for rows already checked by [`UsageRow::from_event`].
    ///
    /// One transaction of multi-row statements: the events first (`ON CONFLICT DO NOTHING
    /// RETURNING` the keys actually stored), then the ledger lines of exactly those events, so a
    /// replayed event adds neither a row nor a line. When a batch holds one key twice, the first
    /// occurrence is stored, as row-by-row inserts would.
    ///
    /// The lines of a newly stored event cannot exist yet, so they are inserted without
    /// `ON CONFLICT` (which costs PostgreSQL a speculative insertion per row). Should one exist
    /// anyway (lines left behind by a manual delete of their event), the transaction fails with a
    /// unique violation and is retried once keeping existing lines, so such a batch is never
    /// stuck.
    pub(crate) async fn insert_rows(&self, rows: &[UsageRow]) -> Result<u64, BillingError> {
        if rows.is_empty() {
            return Ok(0);
        }
        match self.insert_rows_once(rows, false).await {
            Err(BillingError::Db(e))
                if e.as_database_error()
                    .is_some_and(|d| d.is_unique_violation()) =>
            {
                tracing::warn!(error = %e, "ledger lines already present; retrying keeping them");
                self.insert_rows_once(rows, true).await
            }
            result => result,
        }
    }

    /// One attempt of [`Ledger::insert_rows`]; `tolerant` adds `ON CONFLICT DO NOTHING` to the
    /// line inserts.
    async fn insert_rows_once(
        &self,
        rows: &[UsageRow],
        tolerant: bool,
    ) -> Result<u64, BillingError> {
        let [events_sql, lines_sql, tolerant_lines_sql] = statement_texts(self.backend);
        let lines_sql = if tolerant {
            tolerant_lines_sql
        } else {
            lines_sql
        };
        let ingested_at_ms = i64::try_from(switchyard_schemas::now_ms()).unwrap_or(i64::MAX);
        // `audit` events (requests refused before admission) are audit rows only, never usage.
        let (refused, rows): (Vec<&UsageRow>, Vec<&UsageRow>) = rows
            .iter()
            .partition(|r| r.kind == UsageKind::Audit.as_str());
        let priced: Vec<(Option<Cost>, Vec<&'static str>)> =
            rows.iter().map(|row| self.price(row)).collect();
        let costs: Vec<Option<Cost>> = priced.iter().map(|(c, _)| c.clone()).collect();
        let unpriced: Vec<Option<String>> = priced
            .iter()
            .map(|(_, u)| (!u.is_empty()).then(|| u.join(",")))
            .collect();
        let mut tx = self.pool.begin().await?;
        let mut stored: HashSet<(String, String, i64)> = HashSet::with_capacity(rows.len());
        let mut offset = 0;
        for size in statement_sizes(rows.len(), EVENTS_PER_STATEMENT) {
            let sql = events_sql.get(size);
            let mut query = sqlx::query(&sql);
            for ((row, cost), unpriced) in rows[offset..offset + size]
                .iter()
                .zip(&costs[offset..offset + size])
                .zip(&unpriced[offset..offset + size])
            {
                query = bind_event(
                    query,
                    row,
                    ingested_at_ms,
                    cost.as_ref().map(|c| c.total.to_string()),
                    unpriced.as_deref(),
                );
            }
            for key in query.fetch_all(&mut *tx).await? {
                stored.insert((key.try_get(0)?, key.try_get(1)?, key.try_get(2)?));
            }
            offset += size;
        }
        // The audit rows of the newly stored `charge` events, in the same transaction, and
        // those of the refused requests (counted as inserted when new).
        crate::audit::insert(self.backend, &mut tx, &rows, &costs, Some(&stored)).await?;
        let refused_costs = vec![None; refused.len()];
        let inserted = stored.len() as u64
            + crate::audit::insert(self.backend, &mut tx, &refused, &refused_costs, None).await?;
        // Lines only with a newly stored event (its first occurrence in the batch).
        let mut lines = Vec::new();
        for (row, cost) in rows.iter().zip(&costs) {
            let Some(cost) = cost else { continue };
            if !stored.remove(&(row.request_id.clone(), row.kind.to_owned(), row.attempt)) {
                continue;
            }
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
        Ok(inserted)
    }

    /// Every stored event of `request_id`, ordered by kind then attempt, rebuilt from the columns.
    pub async fn usage_for(&self, request_id: Uuid) -> Result<Vec<UsageEvent>, BillingError> {
        let sql = format!(
            "SELECT {SELECT_COLUMNS} FROM usage_events WHERE request_id = $1 ORDER BY kind, attempt"
        );
        let rows = sqlx::query(&sql)
            .bind(request_id.to_string())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// The stored cost (`upstream`) or charge (`charge`) of one event, USD; `None` when the event is
    /// missing or its model is not priced; [`BillingError::CorruptRow`] when the stored text does
    /// not parse.
    pub async fn cost_of(
        &self,
        request_id: Uuid,
        kind: UsageKind,
        attempt: u32,
    ) -> Result<Option<Decimal>, BillingError> {
        let v = self
            .text_column_of("cost_usd", request_id, kind, attempt)
            .await?;
        // A cost that does not parse is a corrupt row, not "unpriced".
        v.map(|s| crate::reconcile::parse_decimal(&request_id.to_string(), &s))
            .transpose()
    }

    /// What had no price on one event (the `unpriced` column split at commas; empty when
    /// everything was priced or the event is missing).
    pub async fn unpriced_of(
        &self,
        request_id: Uuid,
        kind: UsageKind,
        attempt: u32,
    ) -> Result<Vec<String>, BillingError> {
        let v = self
            .text_column_of("unpriced", request_id, kind, attempt)
            .await?;
        Ok(v.map(|s| s.split(',').map(str::to_owned).collect())
            .unwrap_or_default())
    }

    /// The nullable TEXT `column` of one event; `None` when it is NULL or the event is missing.
    async fn text_column_of(
        &self,
        column: &'static str,
        request_id: Uuid,
        kind: UsageKind,
        attempt: u32,
    ) -> Result<Option<String>, BillingError> {
        let sql = format!(
            "SELECT {column} FROM usage_events WHERE request_id = $1 AND kind = $2 AND attempt = $3"
        );
        let v: Option<Option<String>> = sqlx::query_scalar(&sql)
            .bind(request_id.to_string())
            .bind(kind.as_str())
            .bind(i64::from(attempt))
            .fetch_optional(&self.pool)
            .await?;
        Ok(v.flatten())
    }

    /// The ledger lines of one event as (billing type, tokens, amount USD), in billing-type order.
    /// An amount that does not parse or a negative count is [`BillingError::CorruptRow`].
    pub async fn lines_of(
        &self,
        request_id: Uuid,
        kind: UsageKind,
        attempt: u32,
    ) -> Result<Vec<(String, u64, Decimal)>, BillingError> {
        let rows = sqlx::query(
            "SELECT billing_type, tokens, amount_usd FROM ledger_lines \
             WHERE request_id = $1 AND kind = $2 AND attempt = $3 ORDER BY billing_type",
        )
        .bind(request_id.to_string())
        .bind(kind.as_str())
        .bind(i64::from(attempt))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let amount: String = r.try_get(2)?;
                let amount = amount.parse().map_err(|e| {
                    BillingError::CorruptRow(format!("amount_usd `{amount}` of {request_id}: {e}"))
                })?;
                Ok((r.try_get(0)?, to_uint("tokens", r.try_get(1)?)?, amount))
            })
            .collect()
    }

    /// The original JSON stored for (`request_id`, `kind`, `attempt`), if that event is stored.
    pub async fn raw_for(
        &self,
        request_id: Uuid,
        kind: UsageKind,
        attempt: u32,
    ) -> Result<Option<String>, BillingError> {
        // `raw` is never NULL, so `None` means the event is missing.
        self.text_column_of("raw", request_id, kind, attempt).await
    }

    /// Number of stored events (rows of `usage_events`).
    pub async fn count(&self) -> Result<u64, BillingError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM usage_events")
            .fetch_one(&self.pool)
            .await?;
        u64::try_from(n).map_err(|_| BillingError::CorruptRow(format!("negative count {n}")))
    }

    /// Closes every pooled connection; waits for connections in use to be returned.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// `$ty { .. }` with each `$column` field read from the same-named column of `$row` (`?` on a
/// missing column or a value of another type), then the `$rest` fields.
macro_rules! from_columns {
    ($ty:ident, $row:ident, [$($column:ident),* $(,)?], { $($rest:tt)* }) => {
        $ty {
            $($column: sqlx::Row::try_get($row, stringify!($column))?,)*
            $($rest)*
        }
    };
}
pub(crate) use from_columns;

/// `$ty { .. }` from the `usage_events` row `$row`: the columns [`UsageEvent`] and
/// [`LedgerRow`](crate::reconcile::LedgerRow) both hold, read alike (a value that does not fit
/// its field is [`BillingError::CorruptRow`], returned with `?`), then the `$rest` fields. The
/// row must hold these columns, booleans as integers (`CASE WHEN .. THEN 1 ELSE 0 END`).
macro_rules! from_usage_row {
    ($ty:ident, $row:ident, { $($rest:tt)* }) => {
        $crate::ledger::from_columns!(
            $ty,
            $row,
            [tenant, key_id, model, target, upstream_model, batch_id],
            {
                kind: $crate::ledger::parse_enum(
                    "kind",
                    &sqlx::Row::try_get::<String, _>($row, "kind")?,
                )?,
                attempt: $crate::ledger::uint($row, "attempt")?,
                ts_ms: $crate::ledger::uint($row, "ts_ms")?,
                usage: $crate::ledger::usage_from_row($row)?,
                estimated: sqlx::Row::try_get::<i64, _>($row, "estimated")? != 0,
                status: $crate::ledger::parse_enum(
                    "status",
                    &sqlx::Row::try_get::<String, _>($row, "status")?,
                )?,
                fallbacks: $crate::ledger::uint($row, "fallbacks")?,
                cache_hit: sqlx::Row::try_get::<i64, _>($row, "cache_hit")? != 0,
                $($rest)*
            }
        )
    };
}
pub(crate) use from_usage_row;

fn event_from_row(row: &AnyRow) -> Result<UsageEvent, BillingError> {
    let request_id: String = row.try_get("request_id")?;
    let request_id = Uuid::parse_str(&request_id)
        .map_err(|e| BillingError::CorruptRow(format!("request_id `{request_id}`: {e}")))?;
    let error_class = row
        .try_get::<Option<String>, _>("error_class")?
        .map(|s| parse_enum::<ErrorClass>("error_class", &s))
        .transpose()?;
    Ok(from_usage_row!(UsageEvent, row, {
        request_id,
        error_class,
        ttft_ms: row
            .try_get::<Option<i64>, _>("ttft_ms")?
            .map(|v| to_uint("ttft_ms", v))
            .transpose()?,
        latency_ms: uint(row, "latency_ms")?,
        budget_owed: None,
        audit: None,
        finish_reason: row
            .try_get::<Option<String>, _>("finish_reason")?
            .map(|s| parse_enum::<FinishReason>("finish_reason", &s))
            .transpose()?,
    }))
}

/// The token counts and service tier of a `usage_events` row; shared by [`event_from_row`] and
/// the rows reconciliation reads ([`crate::reconcile`]).
pub(crate) fn usage_from_row(row: &AnyRow) -> Result<Usage, BillingError> {
    Ok(Usage {
        prompt_tokens: uint(row, "prompt_tokens")?,
        cached_tokens: uint(row, "cached_tokens")?,
        cache_write_tokens: uint(row, "cache_write_tokens")?,
        completion_tokens: uint(row, "completion_tokens")?,
        reasoning_tokens: uint(row, "reasoning_tokens")?,
        cache_write_1h_tokens: uint(row, "cache_write_1h_tokens")?,
        audio_input_tokens: uint(row, "audio_input_tokens")?,
        audio_output_tokens: uint(row, "audio_output_tokens")?,
        service_tier: row
            .try_get::<Option<String>, _>("service_tier")?
            .as_deref()
            .and_then(ServiceTier::from_provider),
    })
}

/// Reads an integer column into an unsigned type; a value out of its range is a corrupt row.
pub(crate) fn uint<T: TryFrom<i64>>(row: &AnyRow, column: &str) -> Result<T, BillingError> {
    to_uint(column, row.try_get::<i64, _>(column)?)
}

fn to_uint<T: TryFrom<i64>>(column: &str, value: i64) -> Result<T, BillingError> {
    T::try_from(value)
        .map_err(|_| BillingError::CorruptRow(format!("{column} = {value} out of range")))
}

/// Parses a snake_case enum value stored as TEXT through its serde name.
pub(crate) fn parse_enum<T: DeserializeOwned>(
    column: &str,
    value: &str,
) -> Result<T, BillingError> {
    serde_json::from_value(serde_json::Value::String(value.to_owned()))
        .map_err(|e| BillingError::CorruptRow(format!("{column} `{value}`: {e}")))
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
