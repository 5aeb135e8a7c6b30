//! The ledger's shared row types, the bottom layer of billing: the [`Backend`], a usage event
//! checked for the columns ([`UsageRow`], with its audit values), and reading columns back
//! (the [`from_usage_row!`] macros, [`parse_enum`], [`parse_decimal`]). Everything above — the
//! write statements, the [`Ledger`](crate::Ledger), audit, reconciliation, queries — imports
//! from here, never the other way.

use crate::BillingError;
use rust_decimal::Decimal;
use serde::de::DeserializeOwned;
use sqlx::Row;
use sqlx::any::AnyRow;
use switchyard_schemas::audit::AuditInfo;
use switchyard_schemas::usage::{ServiceTier, Usage, UsageEvent, UsageStatus};
use switchyard_schemas::{ErrorClass, FinishReason, UsageKind};

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
    pub(crate) audit: Option<Box<AuditValues>>,
}

impl UsageRow {
    /// Checks `event` fits the columns (counts within `i64`, no NUL in strings, which PostgreSQL
    /// `TEXT` rejects) and converts it, moving its strings. `raw` is the event's JSON as received,
    /// kept for the `raw` column; `None` (or captured bodies in the event's audit values, which
    /// live in `audit_log` only, not in `raw`) serialises `event` instead. Its `budget_owed` is
    /// not a column: the caller reads it first.
    pub(crate) fn from_event(
        mut event: UsageEvent,
        raw: Option<&str>,
    ) -> Result<Self, BillingError> {
        let (request_id, kind, attempt) = (event.request_id, event.kind, event.attempt);
        let invalid = |reason: String| BillingError::InvalidEvent {
            request_id,
            kind: kind.as_str(),
            attempt,
            reason,
        };
        let int = |field: &str, value: u64| {
            i64::try_from(value).map_err(|_| invalid(format!("{field} = {value} exceeds i64::MAX")))
        };
        let text = |field: &str, value: String| {
            if value.contains('\0') {
                Err(invalid(format!("{field} contains a NUL character")))
            } else {
                Ok(value)
            }
        };
        let opt_text =
            |field: &str, value: Option<String>| value.map(|v| text(field, v)).transpose();
        // Captured bodies live in `audit_log` only (under its retention), not in `raw`.
        let bodies = event
            .audit
            .as_mut()
            .map(|a| (a.request_body.take(), a.response_body.take()));
        let has_bodies = matches!(bodies, Some((Some(_), _) | (_, Some(_))));
        let raw = match raw {
            Some(raw) if !has_bodies => raw.to_owned(),
            _ => serde_json::to_string(&event).map_err(|e| invalid(e.to_string()))?,
        };
        let audit = match kind {
            UsageKind::Charge | UsageKind::Audit => {
                let mut info = event.audit.take().map(|a| *a).unwrap_or_default();
                if let Some((request_body, response_body)) = bodies {
                    info.request_body = request_body;
                    info.response_body = response_body;
                }
                Some(Box::new(AuditValues::of(info).map_err(invalid)?))
            }
            UsageKind::Upstream => None,
        };
        let usage = &event.usage;
        Ok(Self {
            request_id: request_id.to_string(),
            kind: event.kind.as_str(),
            attempt: i64::from(event.attempt),
            ts_ms: int("ts_ms", event.ts_ms)?,
            tenant: opt_text("tenant", event.tenant)?,
            key_id: opt_text("key_id", event.key_id)?,
            model: text("model", event.model)?,
            target: opt_text("target", event.target)?,
            upstream_model: opt_text("upstream_model", event.upstream_model)?,
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
            batch_id: opt_text("batch_id", event.batch_id)?,
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
    pub(crate) fn usage(&self) -> Usage {
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

/// The audit columns of a `charge` event that the usage row does not already hold, checked.
#[derive(Debug, Clone)]
pub(crate) struct AuditValues {
    pub(crate) front_door: Option<String>,
    pub(crate) http_status: Option<i64>,
    pub(crate) finish_reason: Option<String>,
    pub(crate) error_code: Option<String>,
    pub(crate) overhead_ms: Option<i64>,
    pub(crate) client_ip: Option<String>,
    pub(crate) user_agent: Option<String>,
    pub(crate) client_request_id: Option<String>,
    pub(crate) attempts: String,
    pub(crate) cache_outcome: Option<String>,
    pub(crate) request_body: Option<String>,
    pub(crate) response_body: Option<String>,
}

impl AuditValues {
    /// The values of an event's [`UsageEvent::audit`] (moved; all empty when it has none).
    /// Fails when a string holds a NUL (PostgreSQL `TEXT` rejects it) or a number exceeds `i64`.
    pub(crate) fn of(a: AuditInfo) -> Result<Self, String> {
        let text = |field: &str, v: Option<String>| match v {
            Some(v) if v.contains('\0') => Err(format!("audit.{field} contains a NUL character")),
            v => Ok(v),
        };
        let attempts = if a.attempts.is_empty() {
            "[]".to_owned()
        } else {
            serde_json::to_string(&a.attempts).map_err(|e| format!("audit.attempts: {e}"))?
        };
        if attempts.contains("\\u0000") {
            return Err("audit.attempts contains a NUL character".into());
        }
        Ok(Self {
            front_door: text("front_door", a.front_door)?,
            http_status: a.http_status.map(i64::from),
            finish_reason: text("finish_reason", a.finish_reason)?,
            error_code: text("error_code", a.error_code)?,
            overhead_ms: a
                .overhead_ms
                .map(|v| i64::try_from(v).map_err(|_| format!("audit.overhead_ms = {v}")))
                .transpose()?,
            client_ip: text("client_ip", a.client_ip)?,
            user_agent: text("user_agent", a.user_agent)?,
            client_request_id: text("client_request_id", a.client_request_id)?,
            attempts,
            cache_outcome: text("cache_outcome", a.cache_outcome)?,
            request_body: text("request_body", a.request_body)?,
            response_body: text("response_body", a.response_body)?,
        })
    }
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
        $crate::row::from_columns!(
            $ty,
            $row,
            [tenant, key_id, model, target, upstream_model, batch_id],
            {
                kind: $crate::row::parse_enum(
                    "kind",
                    &sqlx::Row::try_get::<String, _>($row, "kind")?,
                )?,
                attempt: $crate::row::uint($row, "attempt")?,
                ts_ms: $crate::row::uint($row, "ts_ms")?,
                usage: $crate::row::usage_from_row($row)?,
                estimated: sqlx::Row::try_get::<i64, _>($row, "estimated")? != 0,
                status: $crate::row::parse_enum(
                    "status",
                    &sqlx::Row::try_get::<String, _>($row, "status")?,
                )?,
                fallbacks: $crate::row::uint($row, "fallbacks")?,
                cache_hit: sqlx::Row::try_get::<i64, _>($row, "cache_hit")? != 0,
                $($rest)*
            }
        )
    };
}
pub(crate) use from_usage_row;

/// The token counts and service tier of a `usage_events` row; shared by
/// [`crate::ledger`]'s event reads and the rows reconciliation reads ([`crate::reconcile`]).
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

pub(crate) fn to_uint<T: TryFrom<i64>>(column: &str, value: i64) -> Result<T, BillingError> {
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

/// Parses a stored money string exactly.
pub(crate) fn parse_decimal(request_id: &str, s: &str) -> Result<Decimal, BillingError> {
    s.parse()
        .map_err(|e| BillingError::CorruptRow(format!("cost_usd `{s}` of {request_id}: {e}")))
}
