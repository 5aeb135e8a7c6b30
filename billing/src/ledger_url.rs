//! Ledger URLs: SQLite URL preparation, connect options, and throwaway PostgreSQL schemas for
//! benchmarks and tests ([`ScratchSchema`]).

use crate::BillingError;
use crate::row::Backend;
use uuid::Uuid;

/// A throwaway PostgreSQL schema `<prefix>_<uuid>` for benchmarks: created empty by
/// [`ScratchSchema::create`]; [`ScratchSchema::url`] points a [`Ledger`] at it (through
/// `search_path`), and [`ScratchSchema::drop_schema`] removes it with everything in it, so a
/// benchmark never writes into the database's real ledger tables.
#[derive(Debug)]
pub struct ScratchSchema {
    url: String,
    base: String,
    name: String,
}

impl ScratchSchema {
    /// Creates the schema on the database of `base_url` (`postgres://…`, without a
    /// `search_path` option). `prefix` must be a plain SQL identifier (letters, digits, `_`).
    pub async fn create(base_url: &str, prefix: &str) -> Result<Self, BillingError> {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        if Backend::from_url(base_url) != Some(Backend::Postgres)
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(BillingError::UnsupportedUrl(base_url.to_owned()));
        }
        let name = format!("{prefix}_{}", Uuid::now_v7().simple());
        let mut conn = sqlx::AnyConnection::connect(base_url).await?;
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        let sep = if base_url.contains('?') { '&' } else { '?' };
        let url = format!("{base_url}{sep}options=-c%20search_path%3D{name}");
        Ok(Self {
            url,
            base: base_url.to_owned(),
            name,
        })
    }

    /// The URL to [`Ledger::connect`] with: the base URL plus `options=-c search_path=<schema>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's name, `<prefix>_<uuid>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Drops the schema and everything in it (`DROP SCHEMA … CASCADE`).
    pub async fn drop_schema(self) -> Result<(), BillingError> {
        use sqlx::Connection;
        let mut conn = sqlx::AnyConnection::connect(&self.base).await?;
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok(())
    }
}

/// The options of `url` with sqlx's statement logging off: the batched inserts are statements of
/// up to ~100 KB of SQL text, which sqlx would log whole at DEBUG for every batch and at WARN
/// whenever one takes over a second. Failures are still logged by the callers.
pub(crate) fn connect_options(url: &str) -> Result<sqlx::any::AnyConnectOptions, BillingError> {
    use sqlx::ConnectOptions as _;
    use std::str::FromStr as _;
    Ok(sqlx::any::AnyConnectOptions::from_str(url)?.disable_statement_logging())
}

/// Splits off the SQLite path of `url`, creates its parent directory and adds `mode=rwc` unless
/// a mode is given. Returns the URL to connect with and whether the database is in memory.
pub(crate) fn prepare_sqlite_url(url: &str) -> Result<(String, bool), BillingError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or_default();
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    let in_memory = path.is_empty()
        || path == ":memory:"
        || query.is_some_and(|q| q.split('&').any(|kv| kv == "mode=memory"));
    if in_memory {
        return Ok((url.to_owned(), true));
    }
    if let Some(parent) = std::path::Path::new(path).parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent)?;
    }
    let has_mode = query.is_some_and(|q| q.split('&').any(|kv| kv.starts_with("mode=")));
    let url = match (query, has_mode) {
        (_, true) => url.to_owned(),
        (Some(_), false) => format!("{url}&mode=rwc"),
        (None, false) => format!("{url}?mode=rwc"),
    };
    Ok((url, false))
}
