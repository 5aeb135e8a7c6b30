//! Shared test helpers: a real nats-server per test, a throwaway PostgreSQL schema, polling.
#![allow(
    dead_code,
    unused_imports,
    unused_macros,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use sqlx::Connection;
use std::future::Future;
use std::time::Duration;

/// How long a nats-server may take to accept connections.
const NATS_START_TIMEOUT: Duration = Duration::from_secs(15);

/// A real nats-server on a port it picks itself, with a temporary JetStream directory.
pub(crate) struct NatsServer(switchyard_natsd::NatsServer);

impl NatsServer {
    /// Starts it, panicking with the reason when it cannot.
    pub(crate) fn start() -> Self {
        Self(switchyard_natsd::NatsServer::start_temp().expect("start nats-server"))
    }

    /// `nats://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        self.0.url()
    }
}

pub(crate) async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The PostgreSQL server tests use: `$SWITCHYARD_TEST_POSTGRES_URL`, else the local trust-auth one.
pub(crate) fn postgres_base_url() -> String {
    std::env::var("SWITCHYARD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh schema `billing_test_<random>` that ledger connections use via `search_path`.
pub(crate) struct PgSchema {
    /// Base URL plus `options=-c search_path=<schema>`.
    pub url: String,
    base: String,
    name: String,
}

impl PgSchema {
    /// Creates the schema. `None` (after printing a skip notice) when PostgreSQL is unreachable,
    /// unless `SWITCHYARD_REQUIRE_POSTGRES` is set, in which case this panics.
    pub(crate) async fn create() -> Option<Self> {
        let base = postgres_base_url();
        let conn = tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&base))
            .await
            .map_err(|_| "connect timed out".to_owned())
            .and_then(|r| r.map_err(|e| e.to_string()));
        let mut conn = match conn {
            Ok(conn) => conn,
            Err(e) if std::env::var_os("SWITCHYARD_REQUIRE_POSTGRES").is_some() => {
                panic!(
                    "PostgreSQL at {base} unreachable and SWITCHYARD_REQUIRE_POSTGRES is set: {e}"
                )
            }
            Err(e) => {
                eprintln!(
                    "SKIPPED: PostgreSQL at {base} unreachable ({e}); \
                     set SWITCHYARD_REQUIRE_POSTGRES=1 to make this a failure"
                );
                return None;
            }
        };
        let name = format!("billing_test_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{name}");
        Some(Self { url, base, name })
    }

    /// Drops the schema and everything in it.
    pub(crate) async fn drop_schema(self) {
        let mut conn = sqlx::PgConnection::connect(&self.base).await.unwrap();
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        sqlx::query(&sql).execute(&mut conn).await.unwrap();
        conn.close().await.unwrap();
    }
}

/// Runs `scenario` on a fresh schema's URL (skipped like [`PgSchema::create`]) and drops the
/// schema afterwards, also when the scenario panics (the panic is then re-raised).
pub(crate) async fn on_postgres<F, Fut>(scenario: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    use futures::FutureExt as _;
    let Some(schema) = PgSchema::create().await else {
        return;
    };
    let outcome = std::panic::AssertUnwindSafe(scenario(schema.url.clone()))
        .catch_unwind()
        .await;
    schema.drop_schema().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// `sqlite://<dir>/ledger.db`, the ledger file the scenario tests use in a temporary directory.
pub(crate) fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}/ledger.db", dir.path().display())
}

/// A ledger on a fresh SQLite file; the directory lives as long as the returned guard.
pub(crate) async fn sqlite_ledger() -> (tempfile::TempDir, switchyard_billing::Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = switchyard_billing::Ledger::connect(&sqlite_url(&dir))
        .await
        .unwrap();
    (dir, ledger)
}

/// Runs `scenario` on the URL of a fresh SQLite ledger in a temporary directory.
pub(crate) async fn on_sqlite<F, Fut>(scenario: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    scenario(sqlite_url(&dir)).await;
}

/// `SELECT COUNT(*) FROM <table>` on the ledger.
pub(crate) async fn count_rows(ledger: &switchyard_billing::Ledger, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(ledger.pool())
        .await
        .unwrap()
}

/// Declares the tests `$sqlite` and `$postgres`, running the async `$scenario(&str)` on a ledger
/// URL: a SQLite file ([`on_sqlite`]) and a fresh PostgreSQL schema ([`on_postgres`]).
macro_rules! on_both_ledgers {
    ($scenario:ident, $sqlite:ident, $postgres:ident) => {
        #[tokio::test]
        async fn $sqlite() {
            $crate::common::on_sqlite(|url| async move { $scenario(&url).await }).await;
        }

        #[tokio::test]
        async fn $postgres() {
            $crate::common::on_postgres(|url| async move { $scenario(&url).await }).await;
        }
    };
}
pub(crate) use on_both_ledgers;

/// An ok `kind` event at `ts_ms` with a fresh request id: attempt 0, tenant `acme`, no key,
/// `openai/gpt-4o` on `openai-east` (upstream `gpt-4o`), no usage, TTFT 100 ms, latency 500 ms,
/// no fallback, cache hit, batch or audit. Fixtures override what they are about.
pub(crate) fn event(
    kind: switchyard_schemas::usage::UsageKind,
    ts_ms: u64,
) -> switchyard_schemas::usage::UsageEvent {
    switchyard_schemas::usage::UsageEvent {
        tenant: Some("acme".into()),
        target: Some("openai-east".into()),
        upstream_model: Some("gpt-4o".into()),
        ttft_ms: Some(100),
        latency_ms: 500,
        ..switchyard_schemas::usage::UsageEvent::new(
            uuid::Uuid::now_v7(),
            kind,
            ts_ms,
            "openai/gpt-4o",
        )
    }
}

/// A nats-server holding billing's usage stream ([`switchyard_billing::ensure_usage_stream`]) on
/// the default subjects: the server (stopped on drop), a client, its JetStream context, the
/// subjects and the stream.
pub(crate) async fn usage_stream() -> (
    NatsServer,
    async_nats::Client,
    async_nats::jetstream::Context,
    switchyard_schemas::subjects::Subjects,
    async_nats::jetstream::stream::Stream,
) {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let subjects = switchyard_schemas::subjects::Subjects::default();
    let stream = switchyard_billing::ensure_usage_stream(&js, &subjects)
        .await
        .unwrap();
    (nats, client, js, subjects, stream)
}

/// An exact decimal from its text.
pub(crate) fn d(s: &str) -> rust_decimal::Decimal {
    s.parse().unwrap()
}
