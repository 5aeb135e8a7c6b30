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
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Row};
use std::time::Duration;
use switchyard_schemas::usage::UsageEvent;
use switchyard_schemas::{ErrorClass, FinishReason, UsageKind};
use uuid::Uuid;

pub use crate::ledger_url::ScratchSchema;
use crate::ledger_url::{connect_options, prepare_sqlite_url};
use crate::ledger_write::Price;
pub use crate::row::Backend;
use crate::row::{UsageRow, from_usage_row, parse_enum, to_uint, uint, usage_row_columns};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

/// Per-connection SQLite settings (docs/architecture.md, "The ledger's writes"):
/// - `busy_timeout`: a connection waits up to 5,000 ms for a competing writer's lock.
/// - `synchronous = FULL` (SQLite's default, kept explicit): every commit is fsync'd before
///   billing acks its events, so an acked usage event survives an OS crash or power loss of the
///   box, not only a process crash. `NORMAL` would save that fsync per batch at the cost of the
///   last commits on a power loss; it is not taken until the bench shows the fsync matters
///   (issue 41 asks for machine-crash durability).
/// - `wal_autocheckpoint`: SQLite checkpoints inside the commit that grows the WAL past this
///   many pages (4 KiB each, so 40 MiB). The billing consumer runs a passive checkpoint every
///   second after its acks ([`Ledger::checkpoint`]); this is the backstop for writers without
///   the consumer.
const SQLITE_PRAGMAS: [&str; 3] = [
    "PRAGMA busy_timeout = 5000",
    "PRAGMA synchronous = FULL",
    "PRAGMA wal_autocheckpoint = 10000",
];

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
                            for pragma in SQLITE_PRAGMAS {
                                sqlx::query(pragma).execute(&mut *conn).await?;
                            }
                            Ok(())
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

    /// Prices one row with `catalog`: cost price for `upstream` events, charge for `charge` events, with what
    /// had no price (see [`Cost::unpriced`]; `model` when the model has no card at all and the
    /// row has tokens to price). Nothing is unpriced on a row without tokens or a cache hit.
    fn price(&self, catalog: &Catalog, row: &UsageRow) -> Price {
        let usage = row.usage();
        // Batch items are priced at the catalog's batch rate (`batch_discount`).
        let batch = row.batch_id.is_some();
        let cost = match row.kind {
            "upstream" => match row.upstream_model.as_deref() {
                Some(m) => catalog.upstream_cost(m, &usage, batch),
                None => return Price::default(),
            },
            // Cache pricing policy: a cache hit is free to the tenant (no upstream call was made);
            // its row keeps the original usage, which prices the savings in reports.
            _ if row.cache_hit => return Price::new(Some(Cost::default()), None),
            _ => catalog.charge_with(&row.model, &usage, batch, self.unpriced.as_ref()),
        };
        let unpriced = match &cost {
            Some(c) => (!c.unpriced.is_empty()).then(|| c.unpriced.join(",")),
            None if usage.total_tokens() > 0 => Some("model".to_owned()),
            None => None,
        };
        Price::new(cost, unpriced)
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
            .map(|event| UsageRow::from_event(event.clone(), None))
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
    /// line inserts. Every row is priced here, once, with one catalog for the whole batch.
    async fn insert_rows_once(
        &self,
        rows: &[UsageRow],
        tolerant: bool,
    ) -> Result<u64, BillingError> {
        // `audit` events (requests refused before admission) are audit rows only, never usage.
        let (refused, rows): (Vec<&UsageRow>, Vec<&UsageRow>) = rows
            .iter()
            .partition(|r| r.kind == UsageKind::Audit.as_str());
        let catalog = self.catalog();
        let prices: Vec<Price> = rows.iter().map(|row| self.price(&catalog, row)).collect();
        crate::ledger_write::store(&self.pool, self.backend, &rows, &prices, &refused, tolerant)
            .await
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
        v.map(|s| crate::row::parse_decimal(&request_id.to_string(), &s))
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

    /// Copies what the WAL holds into a SQLite ledger's database file without waiting for
    /// readers or writers (`PRAGMA wal_checkpoint(PASSIVE)`; pages a reader still needs stay for
    /// the next one). Nothing to do on PostgreSQL, whose server checkpoints on its own
    /// (`checkpoint_timeout`, `max_wal_size`).
    pub async fn checkpoint(&self) -> Result<(), BillingError> {
        if self.backend == Backend::Sqlite {
            sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&self.pool)
                .await?;
        }
        Ok(())
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

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
