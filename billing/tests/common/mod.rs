//! Shared test helpers: a real nats-server per test, a throwaway PostgreSQL schema, polling.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sqlx::Connection;
use std::future::Future;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a nats-server may take to accept connections.
const NATS_START_TIMEOUT: Duration = Duration::from_secs(15);

/// The nats-server binary: `$SWITCHYARD_NATS_SERVER`, else `<workspace>/.tools/bin/nats-server`.
pub fn nats_server_binary() -> PathBuf {
    match std::env::var_os("SWITCHYARD_NATS_SERVER") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../.tools/bin/nats-server"
        )),
    }
}

/// A nats-server with JetStream on a free localhost port, storing into its own temp dir.
/// Killed (and its storage removed) on drop.
pub struct NatsServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts the server and waits (bounded) until its client port accepts connections.
    /// Retries on another port if the chosen one was taken meanwhile.
    pub fn start() -> Self {
        let binary = nats_server_binary();
        assert!(
            binary.exists(),
            "nats-server not found at {} (run scripts/bootstrap or set SWITCHYARD_NATS_SERVER)",
            binary.display()
        );
        let mut last_error = String::new();
        for _ in 0..3 {
            match Self::try_start(&binary) {
                Ok(server) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("nats-server did not start: {last_error}");
    }

    fn try_start(binary: &PathBuf) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = free_port();
        let log = dir.path().join("nats.log");
        let stderr = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let child = Command::new(binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path().join("js"))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", binary.display()))?;
        let mut server = Self { child, port, dir };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + NATS_START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("exited with {status}: {log}"));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "port {port} not accepting after {NATS_START_TIMEOUT:?}: {log}"
                ));
            }
            // Poll interval of the bounded readiness loop above.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// Polls `check` every 20 ms until it returns true; panics after `timeout` naming `what`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
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
pub fn postgres_base_url() -> String {
    std::env::var("SWITCHYARD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh schema `billing_test_<random>` that ledger connections use via `search_path`.
pub struct PgSchema {
    /// Base URL plus `options=-c search_path=<schema>`.
    pub url: String,
    base: String,
    name: String,
}

impl PgSchema {
    /// Creates the schema. `None` (after printing a skip notice) when PostgreSQL is unreachable,
    /// unless `SWITCHYARD_REQUIRE_POSTGRES` is set, in which case this panics.
    pub async fn create() -> Option<Self> {
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
    pub async fn drop_schema(self) {
        let mut conn = sqlx::PgConnection::connect(&self.base).await.unwrap();
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        sqlx::query(&sql).execute(&mut conn).await.unwrap();
        conn.close().await.unwrap();
    }
}
