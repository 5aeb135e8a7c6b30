//! Token usage and the usage events billing consumes from the durable JetStream stream.

use crate::error::ErrorClass;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Normalised token counts of one upstream call.
///
/// Parts are subsets, never added on top: `prompt_tokens` already includes `cached_tokens` and
/// `cache_write_tokens` (as OpenAI's `prompt_tokens` includes `prompt_tokens_details.cached_tokens`);
/// `completion_tokens` already includes `reasoning_tokens` (as OpenAI's
/// `completion_tokens_details.reasoning_tokens`). Anthropic reports `input_tokens` *excluding* cache
/// reads and writes, so its adapter adds them in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// All input tokens, cached or not.
    pub prompt_tokens: u64,
    /// Input tokens read from the provider's prompt cache (subset of `prompt_tokens`).
    #[serde(default)]
    pub cached_tokens: u64,
    /// Input tokens written to the provider's prompt cache (subset of `prompt_tokens`).
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// All generated tokens, reasoning included.
    pub completion_tokens: u64,
    /// Hidden reasoning tokens (subset of `completion_tokens`).
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// Cache writes with the 1-hour TTL (subset of `cache_write_tokens`; the rest are 5-minute
    /// writes). Anthropic `usage.cache_creation.ephemeral_1h_input_tokens` (Anthropic docs,
    /// "Prompt caching", "Tracking cache performance"); 0 without a `cache_creation` object.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_1h_tokens: u64,
    /// Audio input tokens (subset of `prompt_tokens`): OpenAI
    /// `prompt_tokens_details.audio_tokens`, priced at the card's `audio_input`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub audio_input_tokens: u64,
    /// Audio output tokens (subset of `completion_tokens`): OpenAI
    /// `completion_tokens_details.audio_tokens`, priced at the card's `audio_output`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub audio_output_tokens: u64,
    /// The service tier the upstream says served the call (OpenAI `service_tier`, Anthropic
    /// `usage.service_tier`); `None` = the standard tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<ServiceTier>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A provider service tier priced apart from the standard one (OpenAI "Priority processing" and
/// "Flex processing"; Anthropic "Service tiers", `priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceTier {
    /// Priority processing (higher price, lower latency).
    Priority,
    /// Flex processing (lower price, slower).
    Flex,
}

impl ServiceTier {
    /// The snake_case name stored in the ledger (`priority`, `flex`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Priority => "priority",
            Self::Flex => "flex",
        }
    }

    /// A provider's tier name → the tier priced apart: `priority` and `flex`; every other value
    /// (`default`, `auto`, `standard`, `scale`, `batch`) is the standard tier (`None`).
    pub fn from_provider(name: &str) -> Option<Self> {
        match name {
            "priority" => Some(Self::Priority),
            "flex" => Some(Self::Flex),
            _ => None,
        }
    }
}

impl Usage {
    /// `prompt_tokens + completion_tokens`.
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// Which side of the pipeline wrote a usage event; billing joins the two by request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageKind {
    /// Written by the worker: what the upstream reported for one upstream call.
    Upstream,
    /// Written by ingress: what the tenant is charged for the request as a whole.
    Charge,
    /// Written by ingress for a request refused before admission (bad body, unknown model, bad
    /// key, limit or budget refusal; docs/audit.md): billing stores only its `audit_log` row,
    /// never a usage row, so a refused request still leaves no usage record (docs/budgets.md).
    Audit,
}

impl UsageKind {
    /// The subject token and ledger value, e.g. `upstream`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Upstream => "upstream",
            Self::Charge => "charge",
            Self::Audit => "audit",
        }
    }
}

/// Outcome of the request or upstream call a usage event describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageStatus {
    /// Completed normally.
    Ok,
    /// Ended with an error (see `error_class`).
    Error,
    /// The client went away before the end.
    Cancelled,
}

/// The tenant of health-probe calls (workers' prober): `upstream` rows with no `charge` row by
/// design, which reconciliation expects and reports label `probe`.
pub const PROBE_TENANT: &str = "_switchyard_probe";

/// One usage record. Idempotent by (`request_id`, `kind`, `attempt`): redelivery never double counts.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageEvent {
    /// The request (UUIDv7).
    pub request_id: Uuid,
    /// Who wrote it.
    pub kind: UsageKind,
    /// Attempt number for `upstream` events (one per upstream call); 0 for `charge`.
    #[serde(default)]
    pub attempt: u32,
    /// When the event was produced, ms since the Unix epoch.
    pub ts_ms: u64,
    /// Tenant, when auth is on.
    pub tenant: Option<String>,
    /// Calling key id, when auth is on.
    pub key_id: Option<String>,
    /// Standard model id or route tag the client asked for.
    pub model: String,
    /// Target that served (or last tried).
    pub target: Option<String>,
    /// Model id sent upstream.
    pub upstream_model: Option<String>,
    /// Token counts.
    pub usage: Usage,
    /// True when the counts are an estimate (upstream aborted before reporting usage).
    #[serde(default)]
    pub estimated: bool,
    /// Outcome.
    pub status: UsageStatus,
    /// Error class when `status` is `error`.
    pub error_class: Option<ErrorClass>,
    /// Time to first content, ms (from request admission for `charge`, from upstream call for `upstream`).
    pub ttft_ms: Option<u64>,
    /// Total duration, ms.
    pub latency_ms: u64,
    /// Number of fallbacks before the serving target (`charge` only).
    #[serde(default)]
    pub fallbacks: u32,
    /// Whether the answer came from the cache (`charge` only).
    #[serde(default)]
    pub cache_hit: bool,
    /// A budget settlement ingress could not write itself (`charge` only; docs/budgets.md):
    /// billing applies it once after storing the event.
    pub budget_owed: Option<BudgetOwed>,
    /// The batch job this request was an item of (`None` for live traffic): priced at the
    /// catalog's batch rate (`batch_discount`) and reported apart.
    pub batch_id: Option<String>,
    /// What the audit log adds (`charge` and `audit` only; docs/audit.md): stored by billing in
    /// `audit_log`.
    pub audit: Option<Box<crate::audit::AuditInfo>>,
    /// Why generation stopped, in OpenAI's vocabulary (`stop`, `length`, `tool_calls`,
    /// `content_filter`: a provider's safety system withheld the answer — OpenAI
    /// `content_filter`, Anthropic `refusal`, Gemini `SAFETY`/`PROHIBITED_CONTENT`/…, Bedrock
    /// `content_filtered`/`guardrail_intervened`); `None` when the call or request ended
    /// without an end frame (error, cancel). Stored in the ledger's `finish_reason` column.
    pub finish_reason: Option<crate::FinishReason>,
}

impl UsageEvent {
    /// A completed (`status` `ok`) `kind` event of `request_id` for `model`, produced at
    /// `ts_ms` (ms since the Unix epoch), with everything else at its zero value: attempt 0,
    /// no tenant, key, target or upstream model, no tokens (not estimated), no error, no TTFT,
    /// latency 0 ms, no fallback, no cache hit, nothing owed, no batch, audit or finish reason.
    /// Producers set the rest with struct update syntax:
    /// `UsageEvent { latency_ms: 12, ..UsageEvent::new(id, kind, now_ms(), model) }`.
    pub fn new(request_id: Uuid, kind: UsageKind, ts_ms: u64, model: impl Into<String>) -> Self {
        Self {
            request_id,
            kind,
            attempt: 0,
            ts_ms,
            tenant: None,
            key_id: None,
            model: model.into(),
            target: None,
            upstream_model: None,
            usage: Usage::default(),
            estimated: false,
            status: UsageStatus::Ok,
            error_class: None,
            ttft_ms: None,
            latency_ms: 0,
            fallbacks: 0,
            cache_hit: false,
            budget_owed: None,
            batch_id: None,
            audit: None,
            finish_reason: None,
        }
    }
}

/// What a request still owes its budget scopes: `usd` (sale price) and `tokens` (input +
/// output) to add to each of `scopes` (`key.<id>`, `tenant.<id>` in the `SY_BUDGETS` bucket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetOwed {
    /// KV keys of the scopes.
    pub scopes: Vec<String>,
    /// Charge, USD.
    #[serde(with = "rust_decimal::serde::str")]
    pub usd: rust_decimal::Decimal,
    /// Tokens.
    pub tokens: u64,
}
