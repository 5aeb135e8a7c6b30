//! The audit log (docs/audit.md): one record per admitted request, carried by the request's
//! `charge` usage event ([`crate::UsageEvent::audit`]) and stored by billing in the `audit_log`
//! table in the same transaction as the event's `usage_events` row, so the audit log never costs
//! the client a second JetStream message.
//!
//! Also the admin query over NATS (`<prefix>.billing.audit`, request/reply): JSON
//! [`AuditQuery`] in, [`AuditAnswer`] back.

use serde::{Deserialize, Serialize};

/// Default largest captured body, bytes (16 KiB).
pub const DEFAULT_CAPTURE_MAX_BYTES: usize = 16 * 1024;
/// Default age after which billing deletes audit rows, days.
pub const DEFAULT_RETENTION_DAYS: u32 = 30;
/// Most records one [`AuditQuery`] returns.
pub const MAX_PAGE: u32 = 1000;

/// The `audit` config section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Audit rows older than this are deleted by the billing service (in batches of
    /// 1,000 rows), days; 0 keeps them forever. Default 30.
    pub retention_days: u32,
    /// Request/response body capture (off unless a key or model is listed).
    pub capture: CaptureConfig,
    /// Most audit records of requests refused before admission one ingress publishes per
    /// second; more are dropped and counted (`switchyard_audit_dropped_total`), so a flood of
    /// bad requests cannot grow the usage stream without bound. 0 records none. Default 1,000.
    pub refused_per_second: u32,
}

/// Default of [`AuditConfig::refused_per_second`].
pub const DEFAULT_REFUSED_PER_SECOND: u32 = 1000;

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            retention_days: DEFAULT_RETENTION_DAYS,
            capture: CaptureConfig::default(),
            refused_per_second: DEFAULT_REFUSED_PER_SECOND,
        }
    }
}

/// Which requests keep their bodies in the audit log. Off by default: a body is captured when
/// the calling key id is in `keys` or the (routed) model id is in `models`; `"*"` in either
/// matches all. Captured text is redacted ([`crate::secret::redact_credentials`]) and cut to
/// `max_bytes` (on a UTF-8 boundary).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Key ids whose requests are captured.
    pub keys: Vec<String>,
    /// Model ids whose requests are captured.
    pub models: Vec<String>,
    /// Largest captured body (request and response each), bytes. Default 16,384.
    pub max_bytes: usize,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            models: Vec::new(),
            max_bytes: DEFAULT_CAPTURE_MAX_BYTES,
        }
    }
}

impl CaptureConfig {
    /// Whether a request of `key_id` for `model` is captured.
    pub fn captures(&self, key_id: Option<&str>, model: &str) -> bool {
        let hit = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        key_id.is_some_and(|k| hit(&self.keys, k)) || hit(&self.models, model)
    }

    /// `text` redacted and cut to `max_bytes`.
    pub fn clip(&self, text: &str) -> String {
        clip(&crate::secret::redact_credentials(text), self.max_bytes)
    }
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default().to_owned()
}

/// The values of [`AuditInfo::cache_outcome`]: `hit` and `semantic-hit` (answered from the
/// cache), `miss` (looked up, answered live; also with `no-store`), `bypass` (the route caches,
/// but this request was not looked up: `no-cache`, `n` > 1, a passthrough field that may shape the
/// answer, the cache unavailable or slower than its timeout), `off` (the route has no cache).
pub const CACHE_OUTCOMES: &[&str] = &["hit", "semantic-hit", "miss", "bypass", "off"];

/// One failed attempt of a request (the serving attempt is the record's `target`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditAttempt {
    /// Target id tried.
    pub target: String,
    /// Model id sent upstream.
    pub upstream_model: String,
    /// Its error class (snake_case [`crate::ErrorClass`]).
    pub error_class: crate::ErrorClass,
    /// Its error message, redacted ([`crate::secret::redact_credentials`]), at most 512 bytes.
    pub error: String,
}

/// What the `charge` event adds for the audit log (all optional on the wire: events of older
/// ingresses decode with the defaults).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditInfo {
    /// The front door: `openai`, `anthropic`, `responses`, `embeddings`, `batch`.
    pub front_door: Option<String>,
    /// HTTP status the client got (499 when it went away first).
    pub http_status: Option<u16>,
    /// Finish reason of the answer (`stop`, `length`, `tool_calls`, ...).
    pub finish_reason: Option<String>,
    /// The error's code as the client got it (OpenAI `error.code`, e.g. `model_not_found`,
    /// else `error.type`, e.g. Anthropic's `authentication_error`): set for requests refused
    /// before admission.
    pub error_code: Option<String>,
    /// Gateway time before the first upstream attempt was dispatched (admission, budgets,
    /// planning), ms.
    pub overhead_ms: Option<u64>,
    /// Client address: the TCP peer's IP (`x-forwarded-for` is not trusted).
    pub client_ip: Option<String>,
    /// Client `user-agent`, at most 256 bytes.
    pub user_agent: Option<String>,
    /// The client's `x-request-id` when well-formed (1 to 128 characters of `[A-Za-z0-9._:-]`), kept
    /// for correlation; the gateway's own request id stays the ledger key.
    pub client_request_id: Option<String>,
    /// The answer cache's outcome ([`CACHE_OUTCOMES`]); `None` for requests that never reached
    /// the cache check (refused before it, embeddings).
    pub cache_outcome: Option<String>,
    /// Failed attempts before the serving (or last) one, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AuditAttempt>,
    /// Captured request body (messages JSON), when capture is on for the request.
    pub request_body: Option<String>,
    /// Captured response text, when capture is on for the request.
    pub response_body: Option<String>,
}

/// One row of the audit log as the admin API returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Request id.
    pub request_id: String,
    /// Event time of the charge (request end), ms since the Unix epoch.
    pub ts_ms: u64,
    /// Front door.
    pub front_door: Option<String>,
    /// Key id.
    pub key_id: Option<String>,
    /// Tenant.
    pub tenant: Option<String>,
    /// Standard model id.
    pub model: String,
    /// Target that served (or was tried last).
    pub target: Option<String>,
    /// Model id sent upstream.
    pub upstream_model: Option<String>,
    /// `ok`, `error` or `cancelled`.
    pub status: String,
    /// HTTP status.
    pub http_status: Option<u16>,
    /// Error class when not ok.
    pub error_class: Option<String>,
    /// The error code the client got (`model_not_found`, `authentication_error`, …) for a
    /// request refused before admission; `None` otherwise.
    pub error_code: Option<String>,
    /// Finish reason.
    pub finish_reason: Option<String>,
    /// Fallbacks before the serving target.
    pub fallbacks: u32,
    /// Failed attempts.
    pub attempts: Vec<AuditAttempt>,
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Cached input tokens.
    pub cached_tokens: u64,
    /// Cost price, USD (decimal string; `None` when unpriced). Sum of the request's
    /// `upstream` rows stored so far.
    pub cost_usd: Option<String>,
    /// Charge to the tenant, USD (decimal string; `None` when unpriced).
    pub charge_usd: Option<String>,
    /// Time to first content, ms.
    pub ttft_ms: Option<u64>,
    /// Duration, ms.
    pub latency_ms: u64,
    /// Gateway overhead, ms.
    pub overhead_ms: Option<u64>,
    /// Answered from the cache.
    pub cache_hit: bool,
    /// The cache outcome ([`CACHE_OUTCOMES`]); `None` when the request never reached the cache
    /// check.
    pub cache_outcome: Option<String>,
    /// Client address.
    pub client_ip: Option<String>,
    /// Client user agent.
    pub user_agent: Option<String>,
    /// The client's own `x-request-id`.
    pub client_request_id: Option<String>,
    /// Captured request body.
    pub request_body: Option<String>,
    /// Captured response body.
    pub response_body: Option<String>,
}

/// A page query of the audit log. Records are ordered newest first by (`ts_ms`, `request_id`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditQuery {
    /// Records at or after this time, ms since the Unix epoch.
    pub from_ms: Option<u64>,
    /// Records before this time, ms since the Unix epoch.
    pub to_ms: Option<u64>,
    /// Only this key id.
    pub key_id: Option<String>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this standard model id.
    pub model: Option<String>,
    /// Only this outcome (`ok`, `error`, `cancelled`) or HTTP status (`429`).
    pub status: Option<String>,
    /// The previous page's `next_cursor`: records strictly after it in the order.
    pub cursor: Option<String>,
    /// Page size, 1..=1000 (default 100).
    pub limit: Option<u32>,
}

/// A page of records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditPage {
    /// Records, newest first.
    pub data: Vec<AuditRecord>,
    /// Cursor of the next page (`None` on the last page).
    pub next_cursor: Option<String>,
}

/// Billing's answer to an [`AuditQuery`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AuditAnswer {
    /// The page.
    Ok(AuditPage),
    /// Why it could not be answered.
    Err {
        /// Message.
        error: String,
    },
}

/// The client's `x-request-id` value kept when it is well-formed (one rule for the gateway:
/// [`crate::trace::well_formed_request_id`]).
pub use crate::trace::well_formed_request_id;

/// A page cursor: `<ts_ms>_<request_id>` of the last record of a page.
pub fn cursor_of(ts_ms: u64, request_id: &str) -> String {
    format!("{ts_ms}_{request_id}")
}

/// Parses a [`cursor_of`] cursor; `None` when malformed.
pub fn parse_cursor(cursor: &str) -> Option<(u64, String)> {
    let (ts, id) = cursor.split_once('_')?;
    let ts = ts.parse().ok()?;
    uuid::Uuid::parse_str(id).ok()?;
    Some((ts, id.to_owned()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn capture_matches_keys_models_and_wildcards() {
        let c = CaptureConfig {
            keys: vec!["k1".into()],
            models: vec!["m1".into()],
            max_bytes: 5,
        };
        assert!(c.captures(Some("k1"), "x"));
        assert!(c.captures(None, "m1"));
        assert!(!c.captures(Some("k2"), "m2"));
        assert!(!CaptureConfig::default().captures(Some("k1"), "m1"));
        let all = CaptureConfig {
            models: vec!["*".into()],
            ..CaptureConfig::default()
        };
        assert!(all.captures(None, "anything"));
        assert_eq!(c.clip("héllo world"), "héll");
        assert_eq!(clip("abc", 10), "abc");
    }

    #[test]
    fn cursor_roundtrip() {
        let id = uuid::Uuid::now_v7().to_string();
        let c = cursor_of(42, &id);
        assert_eq!(parse_cursor(&c), Some((42, id)));
        assert_eq!(parse_cursor("x_y"), None);
    }
}
