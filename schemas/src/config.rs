//! Gateway configuration types, shared by every service so they read one file the same way.
//!
//! Every struct rejects unknown fields (a typo is an error naming the field, not a silent default);
//! [`GatewayConfig::validate`] checks cross-field rules at start-up. Parsing YAML and `${ENV}`
//! interpolation happen in the `switchyard` binary.

use crate::routing::{Breaker, Limits, Policy, Probe, Retry, TimeoutOverrides};
use crate::secret::Secret;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// The base URL value that means "the built-in mock upstream started by `switchyard up`".
pub const BUILTIN_MOCK_URL: &str = "builtin:mock";

/// Whether `url` is `builtin:mock/x/<spec>`: the built-in mock with per-target behaviour keys
/// (`<spec>` = `key=value,key=value`, one path segment: no `/`, `?`, `#` or whitespace). Workers
/// resolve it to `<mock root>/x/<spec>/v1`.
pub fn is_mock_path_prefix(url: &str) -> bool {
    url.strip_prefix(BUILTIN_MOCK_URL)
        .and_then(|rest| rest.strip_prefix("/x/"))
        .is_some_and(|spec| {
            !spec.is_empty()
                && !spec.contains(['/', '?', '#'])
                && !spec.chars().any(char::is_whitespace)
        })
}

/// The base URL value that means "the local model server started by `switchyard up`"
/// (SmolLM2-135M on llama.cpp, see `scripts/local_model.py`); workers resolve it to that server's
/// `/v1` URL.
pub const BUILTIN_LOCAL_MODEL_URL: &str = "builtin:local-model";

/// The whole configuration file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// HTTP listen address of ingress, default `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// NATS server URL. `None` makes `switchyard up` start a private nats-server.
    pub nats_url: Option<String>,
    /// NATS credentials and TLS (`nats:`); CLI flags and `SWITCHYARD_NATS_*` override it.
    #[serde(default)]
    pub nats: crate::nats_config::NatsConfig,
    /// Subject prefix (one NATS token), default `sy`.
    #[serde(default = "default_prefix")]
    pub subject_prefix: String,
    /// Where the embedded nats-server and the SQLite ledger keep data, default `./data`.
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// Upstream targets.
    #[serde(default)]
    pub targets: Vec<TargetConfig>,
    /// Models clients can name, each mapped to ordered targets.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Routing policies models refer to.
    #[serde(default)]
    pub policies: Vec<Policy>,
    /// Timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Billing ledger.
    #[serde(default)]
    pub billing: BillingConfig,
    /// Pricing catalog file (same shape as the bundled `schemas/pricing/catalog.yaml`); `None` =
    /// the bundled catalog. Read by ingress (budget reservations, cost routing) and billing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing_file: Option<String>,
    /// What a request whose model, or a component of whose usage, has no price is charged
    /// (`reject`, `zero` or `{charge_at: <standard model>}`); `None`: `reject` for callers with a
    /// USD budget, `zero` (with the `unpriced_component` alarm) otherwise. See docs/pricing.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpriced: Option<crate::pricing::UnpricedPolicy>,
    /// API keys. Empty = no authentication (every request is anonymous and unlimited).
    #[serde(default)]
    pub keys: Vec<crate::tenancy::KeyConfig>,
    /// Tenants with budgets shared by their keys.
    #[serde(default)]
    pub tenants: Vec<crate::tenancy::TenantConfig>,
    /// Admin API keys and the replica staleness limit (`/admin/…`, docs/security.md).
    #[serde(default)]
    pub admin: crate::tenancy::AdminConfig,
    /// How admission estimates the cost it reserves against budgets.
    #[serde(default)]
    pub budgets: crate::tenancy::BudgetSettings,
    /// Ingress HTTP server limits and the shutdown drain (read at start; a reload does not
    /// change them).
    #[serde(default)]
    pub server: ServerConfig,
    /// Batch jobs (OpenAI Batch API, Anthropic Message Batches): how each ingress runs items.
    #[serde(default)]
    pub batch: BatchConfig,
    /// Stored responses of the OpenAI Responses front door (`store`, `previous_response_id`).
    #[serde(default)]
    pub responses: ResponsesConfig,
    /// The audit log: retention and body capture (docs/audit.md).
    #[serde(default)]
    pub audit: crate::audit::AuditConfig,
    /// OpenTelemetry span export over OTLP, off by default (docs/tracing.md).
    #[serde(default)]
    pub tracing: crate::trace::TracingConfig,
    /// An exact-layer copy of the response cache in each ingress (read at start), off by
    /// default: see [`crate::cache::CacheReplica`].
    #[serde(default)]
    pub cache_replica: crate::cache::CacheReplica,
}

/// How batch items share an ingress with live traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Run batch items in this process (every ingress does by default; the items stream is a
    /// work queue, so they spread over the replicas).
    pub run: bool,
    /// Items one ingress runs at once. Default 8.
    pub max_in_flight: usize,
    /// A new item waits while this ingress has more than this many live requests in flight, so
    /// interactive traffic goes first (its bursts are what make the p99). Default 4.
    pub yield_above: u64,
    /// How long a runner may hold an item without acknowledging it before JetStream hands it to
    /// another runner (the items consumer's `ack_wait`, set when the consumer is created),
    /// seconds. A running item reports progress every third of it, so only a dead runner's items
    /// move. Default 60.
    pub ack_wait_s: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            run: true,
            max_in_flight: 8,
            yield_above: 4,
            ack_wait_s: 60,
        }
    }
}

/// The stored responses of `POST /v1/responses` (JetStream KV bucket `SY_RESPONSES`), read at
/// ingress start: the bucket's age limit (`max_age`) is set to `ttl_s` then, also on an existing bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponsesConfig {
    /// How long a stored response (and its input items) stays retrievable and continuable,
    /// seconds. Default 2,592,000 (30 days, as OpenAI keeps stored responses).
    pub ttl_s: u64,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        Self {
            ttl_s: 30 * 24 * 3600,
        }
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_prefix() -> String {
    "sy".into()
}
fn default_data_dir() -> String {
    "./data".into()
}
fn yes() -> bool {
    true
}
fn one() -> f64 {
    1.0
}

/// Which adapter speaks to a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI Chat Completions (`{base_url}/chat/completions`, bearer auth).
    Openai,
    /// Any OpenAI-compatible server (vLLM, Ollama, llama.cpp, Groq, …).
    OpenaiCompatible,
    /// Anthropic Messages (`{base_url}/messages`, `x-api-key`).
    Anthropic,
    /// Google Gemini API (`{base_url}/models/{model}:streamGenerateContent?alt=sse`,
    /// `x-goog-api-key`; Gemini API reference, "Generating content").
    Gemini,
    /// Azure OpenAI (`{base_url}/openai/deployments/{deployment}/chat/completions?api-version=…`,
    /// `api-key`; Azure OpenAI REST API reference, data plane inference).
    AzureOpenai,
    /// Amazon Bedrock Converse API (`{base_url}/model/{modelId}/converse-stream`, AWS SigV4 with
    /// service `bedrock`; Amazon Bedrock API Reference, "ConverseStream"). Needs [`AwsTarget`].
    Bedrock,
}

impl ProviderKind {
    /// Every provider family, in declaration order.
    pub const ALL: &'static [ProviderKind] = &[
        Self::Openai,
        Self::OpenaiCompatible,
        Self::Anthropic,
        Self::Gemini,
        Self::AzureOpenai,
        Self::Bedrock,
    ];

    /// Whether the provider's API has a token-count endpoint Switchyard calls (Anthropic
    /// `POST /v1/messages/count_tokens`); for the others `count_tokens` answers a local estimate.
    pub fn counts_tokens(self) -> bool {
        matches!(self, Self::Anthropic)
    }

    /// The subject token and queue-group suffix of this provider's workers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::OpenaiCompatible => "openai_compatible",
            Self::Anthropic => "anthropic",
            Self::Gemini => "gemini",
            Self::AzureOpenai => "azure_openai",
            Self::Bedrock => "bedrock",
        }
    }
}

/// One upstream target: a provider endpoint with a model and credentials.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Unique id, e.g. `openai-main`.
    pub id: String,
    /// Adapter.
    pub provider: ProviderKind,
    /// API base including the version path, e.g. `https://api.openai.com/v1`, or `builtin:mock` /
    /// `builtin:local-model`. May be left out (empty) only for `bedrock` targets, which then use
    /// the regional endpoint `https://bedrock-runtime.{region}.amazonaws.com` (AWS General
    /// Reference, "Amazon Bedrock endpoints and quotas").
    #[serde(default)]
    pub base_url: String,
    /// Credential; supports `${ENV_VAR}` interpolation. Empty = no auth header.
    #[serde(default)]
    pub api_key: Secret,
    /// Model id the upstream expects (for `azure_openai`: the deployment name).
    pub upstream_model: String,
    /// Azure OpenAI `api-version` query parameter, e.g. `2024-10-21` (Azure OpenAI REST API
    /// reference: every data-plane call requires it). Only valid for `azure_openai` targets;
    /// `None` means the adapter's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// AWS region and credentials of a `bedrock` target (required there, rejected elsewhere);
    /// requests are signed with SigV4 (AWS IAM User Guide, "AWS Signature Version 4 for API
    /// requests"). `api_key` is not used by `bedrock` targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws: Option<AwsTarget>,
    /// Which API an `openai` / `openai_compatible` / `azure_openai` target is called through:
    /// `chat_completions` (default) or `responses` (`{base_url}/responses`, OpenAI API
    /// reference, "Responses"; Azure: `{base_url}/openai/v1/responses`). Rejected on other
    /// providers.
    #[serde(default)]
    pub api: OpenAiApi,
    /// Disabled targets are never chosen.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Order under the `priority` strategy: lower first.
    #[serde(default)]
    pub priority: i32,
    /// Share under the `weighted` strategy (relative).
    #[serde(default = "one")]
    pub weight: f64,
    /// Context window of the upstream model, tokens; requests estimated larger skip the target.
    pub context_window: Option<u64>,
    /// RPM / TPM / concurrency limits.
    #[serde(default)]
    pub limits: Limits,
    /// Circuit breaker.
    #[serde(default)]
    pub breaker: Breaker,
    /// Retries inside the worker.
    #[serde(default)]
    pub retry: Retry,
    /// Timeout overrides for this target.
    #[serde(default)]
    pub timeouts: TimeoutOverrides,
    /// Active health probe; `None` = passive health only.
    pub probe: Option<Probe>,
}

/// The OpenAI API a target speaks (see [`TargetConfig::api`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpenAiApi {
    /// `POST {base_url}/chat/completions`.
    #[default]
    ChatCompletions,
    /// `POST {base_url}/responses`, with `store: false` (Switchyard keeps the conversation).
    Responses,
}

/// Region and credentials for SigV4-signed AWS targets (`bedrock`). The secrets support
/// `${ENV_VAR}` interpolation like `api_key`, and never print.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsTarget {
    /// AWS region, e.g. `us-east-1`: part of the endpoint host and of the SigV4 credential scope.
    pub region: String,
    /// Access key id (`AKIA…` for long-term keys, `ASIA…` for temporary ones).
    pub access_key_id: Secret,
    /// Secret access key.
    pub secret_access_key: Secret,
    /// Session token of temporary (STS) credentials, sent as `x-amz-security-token` (AWS IAM User
    /// Guide, "Use temporary credentials with AWS resources").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<Secret>,
}

/// Checks the `aws` block of target `i`: required for `bedrock`, rejected elsewhere, with a
/// region of lower-case letters, digits and `-` and non-empty keys.
fn validate_aws(i: usize, t: &TargetConfig) -> Result<(), ConfigError> {
    let aws = match (&t.aws, t.provider) {
        (None, ProviderKind::Bedrock) => {
            return Err(err(
                format!("targets[{i}].aws"),
                "bedrock targets need `aws: {region, access_key_id, secret_access_key}`",
            ));
        }
        (None, _) => return Ok(()),
        (Some(aws), ProviderKind::Bedrock) => aws,
        (Some(_), other) => {
            return Err(err(
                format!("targets[{i}].aws"),
                format!(
                    "only bedrock targets take aws settings (this one is {})",
                    other.as_str()
                ),
            ));
        }
    };
    let region_ok = !aws.region.is_empty()
        && aws
            .region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !region_ok {
        return Err(err(
            format!("targets[{i}].aws.region"),
            format!("`{}` is not an AWS region like us-east-1", aws.region),
        ));
    }
    for (name, value) in [
        ("access_key_id", &aws.access_key_id),
        ("secret_access_key", &aws.secret_access_key),
    ] {
        if value.expose().trim().is_empty() {
            return Err(err(format!("targets[{i}].aws.{name}"), "must not be empty"));
        }
    }
    Ok(())
}

fn validate_budget(field: &str, b: &crate::tenancy::Budget) -> Result<(), ConfigError> {
    if let Some(s) = b.downgrade_at {
        if s.is_zero() || s > rust_decimal::Decimal::ONE {
            return Err(err(format!("{field}.downgrade_at"), "must be in (0, 1]"));
        }
        if b.daily_usd.is_none() {
            return Err(err(
                format!("{field}.downgrade_at"),
                "needs `daily_usd` (it is a share of the daily budget)",
            ));
        }
    }
    Ok(())
}

fn validate_rates(field: &str, l: &crate::tenancy::RateLimits) -> Result<(), ConfigError> {
    let zero = [
        ("rpm", l.rpm == Some(0)),
        ("tpm", l.tpm == Some(0)),
        ("max_concurrent", l.max_concurrent == Some(0)),
    ];
    match zero.iter().find(|(_, z)| *z) {
        Some((name, _)) => Err(err(
            format!("{field}.{name}"),
            "must be at least 1 (omit it for no limit)",
        )),
        None => Ok(()),
    }
}

/// A model (standard id or route tag) clients name in `model`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Standard id, e.g. `openai/gpt-4o-mini`, listed by `GET /v1/models`.
    pub id: String,
    /// Target ids in fallback order.
    pub targets: Vec<String>,
    /// Owner shown in `/v1/models` (`owned_by`), default the part before `/`.
    pub owned_by: Option<String>,
    /// Routing policy id; `None` = `priority` over `targets` in order.
    pub policy: Option<String>,
    /// Response cache settings of this route (default: on, exact + semantic, `open` profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::RouteCache>,
    /// The cheaper model (another `models` id) that serves this route for a caller past its
    /// budget's `downgrade_at` share of the daily budget (cost-priority routing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cheaper: Option<String>,
}

/// Timeouts, all in milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Ingress: no frame at all from a worker within this → try the next target.
    pub first_frame_ms: u64,
    /// Ingress: no frame (heartbeats count) within this after the start → the worker is gone.
    pub worker_silence_ms: u64,
    /// Worker: heartbeat interval while the upstream is silent. Must be < `worker_silence_ms`.
    pub heartbeat_ms: u64,
    /// Worker: TCP/TLS connect timeout.
    pub connect_ms: u64,
    /// Worker: time to the first upstream byte of the body (TTFT bound).
    pub first_byte_ms: u64,
    /// Worker: longest gap between two upstream body reads.
    pub idle_ms: u64,
    /// Whole request, admission to last byte.
    pub total_ms: u64,
    /// Worker: longest wait for flow-control credit from ingress (the client stopped reading its
    /// stream). Then the worker cancels the upstream call, ends the attempt with an error frame and
    /// bills what it delivered. Must be ≥ 1.
    pub stall_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            first_frame_ms: 2_000,
            worker_silence_ms: 5_000,
            heartbeat_ms: 1_000,
            connect_ms: 5_000,
            first_byte_ms: 60_000,
            idle_ms: 60_000,
            total_ms: 600_000,
            stall_ms: 30_000,
        }
    }
}

/// Ingress HTTP server limits (HTTP/1.1), durations in milliseconds. Every value must be > 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// A request head (request line and headers) must arrive within this, else the connection is
    /// closed without an answer (slowloris). The same timer runs while a keep-alive connection
    /// waits for its next request, so it also bounds the idle time. Default 10,000.
    pub header_read_timeout_ms: u64,
    /// The whole request body must arrive within this after its head, else 408. Default 30,000.
    pub body_read_timeout_ms: u64,
    /// A keep-alive connection with no request in flight is closed after this (the effective
    /// limit is the smaller of this and `header_read_timeout_ms`). Default 10,000.
    pub idle_timeout_ms: u64,
    /// A connection whose socket writes make no progress for this long (a client that stopped
    /// reading) is closed, ending its stream. Default 30,000.
    pub write_stall_ms: u64,
    /// Open client connections; one more is answered 503 with `Retry-After` and closed. Lowered
    /// at start to the process's file-descriptor limit minus a reserve of 1,024. Default 10,000.
    pub max_connections: usize,
    /// Requests in flight (a stream counts until its last byte); one more gets 503
    /// `server_overloaded` with `Retry-After: 1`. `/healthz` and `/metrics` are not counted.
    /// Default 5,000.
    pub max_in_flight: usize,
    /// On SIGTERM/SIGINT, how long in-flight requests and streams may take to finish before
    /// their connections are closed. Default 30,000.
    pub drain_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            idle_timeout_ms: 10_000,
            write_stall_ms: 30_000,
            max_connections: 10_000,
            max_in_flight: 5_000,
            drain_timeout_ms: 30_000,
        }
    }
}

impl ServerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let fields = [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("write_stall_ms", self.write_stall_ms),
            ("max_connections", self.max_connections as u64),
            ("max_in_flight", self.max_in_flight as u64),
            ("drain_timeout_ms", self.drain_timeout_ms),
        ];
        match fields.iter().find(|(_, v)| *v == 0) {
            Some((name, _)) => Err(err(format!("server.{name}"), "must be > 0")),
            None => Ok(()),
        }
    }
}

/// Billing ledger settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BillingConfig {
    /// sqlx URL, `sqlite://…` or `postgres://…`. `None` = SQLite at `<data_dir>/ledger.db`.
    pub database_url: Option<String>,
}

/// A configuration rule that does not hold, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config field `{field}`: {message}")]
pub struct ConfigError {
    /// Dotted path of the offending field, e.g. `models[0].targets[1]`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

/// Adds `id` to `seen`; an empty or repeated one is an error at `field()`.
fn unique_id<'a>(
    seen: &mut HashSet<&'a str>,
    id: &'a str,
    field: impl FnOnce() -> String,
) -> Result<(), ConfigError> {
    if id.is_empty() || !seen.insert(id) {
        return Err(err(field(), format!("`{id}` is empty or repeated")));
    }
    Ok(())
}

impl GatewayConfig {
    /// Checks rules serde cannot: unique ids, references, a valid subject prefix, timeout order.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.subject_prefix.is_empty() || self.subject_prefix.contains(['.', '*', '>', ' ']) {
            return Err(err(
                "subject_prefix",
                "must be one NATS token (no '.', '*', '>', spaces)",
            ));
        }
        self.nats
            .validate()
            .map_err(|e| err("nats", e.to_string()))?;
        self.tracing.validate().map_err(|e| err("tracing", e))?;
        let mut target_ids = HashSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            unique_id(&mut target_ids, &t.id, || format!("targets[{i}].id"))?;
            let bedrock_default = t.base_url.is_empty() && t.provider == ProviderKind::Bedrock;
            if !bedrock_default
                && t.base_url != BUILTIN_MOCK_URL
                && !is_mock_path_prefix(&t.base_url)
                && t.base_url != BUILTIN_LOCAL_MODEL_URL
                && !t.base_url.starts_with("http://")
                && !t.base_url.starts_with("https://")
            {
                return Err(err(
                    format!("targets[{i}].base_url"),
                    format!(
                        "`{}` must start with http:// or https:// (or be {BUILTIN_MOCK_URL}, \
                         {BUILTIN_MOCK_URL}/x/<key=value,...> or {BUILTIN_LOCAL_MODEL_URL})",
                        t.base_url
                    ),
                ));
            }
            if let Some(v) = &t.api_version {
                if t.provider != ProviderKind::AzureOpenai {
                    return Err(err(
                        format!("targets[{i}].api_version"),
                        format!(
                            "only azure_openai targets take an api_version (this one is {})",
                            t.provider.as_str()
                        ),
                    ));
                }
                if v.trim().is_empty() || v.contains(['&', '#', ' ', '?']) {
                    return Err(err(
                        format!("targets[{i}].api_version"),
                        format!("`{v}` is not an api-version like 2024-10-21"),
                    ));
                }
            }
            if t.api == OpenAiApi::Responses
                && !matches!(
                    t.provider,
                    ProviderKind::Openai
                        | ProviderKind::OpenaiCompatible
                        | ProviderKind::AzureOpenai
                )
            {
                return Err(err(
                    format!("targets[{i}].api"),
                    format!(
                        "only openai, openai_compatible and azure_openai targets can use api: responses (this one is {})",
                        t.provider.as_str()
                    ),
                ));
            }
            validate_aws(i, t)?;
        }
        let mut model_ids = HashSet::new();
        for (i, m) in self.models.iter().enumerate() {
            unique_id(&mut model_ids, &m.id, || format!("models[{i}].id"))?;
            if m.targets.is_empty() {
                return Err(err(
                    format!("models[{i}].targets"),
                    "needs at least one target",
                ));
            }
            if let Some(t) = m.cache.as_ref().and_then(|c| c.threshold)
                && !(t > 0.0 && t <= 1.0)
            {
                return Err(err(
                    format!("models[{i}].cache.threshold"),
                    "must be in (0, 1]",
                ));
            }
            for (j, t) in m.targets.iter().enumerate() {
                if !target_ids.contains(t.as_str()) {
                    return Err(err(
                        format!("models[{i}].targets[{j}]"),
                        format!("unknown target `{t}`"),
                    ));
                }
            }
        }
        let mut policy_ids = HashSet::new();
        for (i, p) in self.policies.iter().enumerate() {
            unique_id(&mut policy_ids, &p.id, || format!("policies[{i}].id"))?;
            if let Some(c) = &p.canary {
                if !(0.0..=100.0).contains(&c.percent) {
                    return Err(err(
                        format!("policies[{i}].canary.percent"),
                        "must be between 0 and 100",
                    ));
                }
                if !target_ids.contains(c.target.as_str()) {
                    return Err(err(
                        format!("policies[{i}].canary.target"),
                        format!("unknown target `{}`", c.target),
                    ));
                }
            } else if p.strategy == crate::routing::Strategy::Canary {
                return Err(err(
                    format!("policies[{i}].canary"),
                    "strategy `canary` needs `canary: {target, percent}`",
                ));
            }
        }
        for (i, m) in self.models.iter().enumerate() {
            if let Some(p) = &m.policy
                && !policy_ids.contains(p.as_str())
            {
                return Err(err(
                    format!("models[{i}].policy"),
                    format!("unknown policy `{p}`"),
                ));
            }
        }
        for (i, t) in self.targets.iter().enumerate() {
            if !(t.weight.is_finite() && t.weight >= 0.0) {
                return Err(err(
                    format!("targets[{i}].weight"),
                    "must be a finite number >= 0",
                ));
            }
            if t.retry.max_attempts == 0 {
                return Err(err(
                    format!("targets[{i}].retry.max_attempts"),
                    "must be at least 1",
                ));
            }
        }
        for (i, m) in self.models.iter().enumerate() {
            if let Some(c) = &m.cheaper
                && (c == &m.id || !model_ids.contains(c.as_str()))
            {
                return Err(err(
                    format!("models[{i}].cheaper"),
                    format!("`{c}` must name another model"),
                ));
            }
        }
        self.validate_tenancy()?;
        let t = &self.timeouts;
        if t.heartbeat_ms == 0 || t.heartbeat_ms >= t.worker_silence_ms {
            return Err(err(
                "timeouts.heartbeat_ms",
                "must be > 0 and < timeouts.worker_silence_ms",
            ));
        }
        if t.stall_ms == 0 {
            return Err(err("timeouts.stall_ms", "must be > 0"));
        }
        if self.responses.ttl_s == 0 {
            return Err(err("responses.ttl_s", "must be > 0"));
        }
        self.server.validate()
    }

    /// Keys: valid unique ids, exactly one of `key_sha256` / `key`, unique hashes; tenants: valid
    /// unique ids; budget shares in (0, 1].
    fn validate_tenancy(&self) -> Result<(), ConfigError> {
        use crate::tenancy::valid_id;
        let mut tenant_ids = HashSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if !valid_id(&t.id) || !tenant_ids.insert(t.id.as_str()) {
                return Err(err(
                    format!("tenants[{i}].id"),
                    format!("`{}` is repeated or not 1-64 of [A-Za-z0-9_-]", t.id),
                ));
            }
            validate_budget(&format!("tenants[{i}].budget"), &t.budget)?;
            validate_rates(&format!("tenants[{i}].limits"), &t.limits)?;
        }
        let mut key_ids = HashSet::new();
        let mut hashes = HashSet::new();
        for (i, k) in self.keys.iter().enumerate() {
            if !valid_id(&k.id) || !key_ids.insert(k.id.as_str()) {
                return Err(err(
                    format!("keys[{i}].id"),
                    format!("`{}` is repeated or not 1-64 of [A-Za-z0-9_-]", k.id),
                ));
            }
            if !valid_id(&k.tenant) {
                return Err(err(
                    format!("keys[{i}].tenant"),
                    format!("`{}` is not 1-64 of [A-Za-z0-9_-]", k.tenant),
                ));
            }
            match (&k.key_sha256, &k.key) {
                (Some(h), None) => {
                    if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(err(
                            format!("keys[{i}].key_sha256"),
                            "must be 64 hex digits (the SHA-256 of the key)",
                        ));
                    }
                }
                (None, Some(s)) if s.expose().len() >= 8 => {}
                (None, Some(_)) => {
                    return Err(err(
                        format!("keys[{i}].key"),
                        "must be at least 8 characters",
                    ));
                }
                _ => {
                    return Err(err(
                        format!("keys[{i}]"),
                        "needs exactly one of `key_sha256` and `key`",
                    ));
                }
            }
            if let Some(h) = k.sha256()
                && !hashes.insert(h)
            {
                return Err(err(
                    format!("keys[{i}]"),
                    "the same key is configured twice",
                ));
            }
            validate_budget(&format!("keys[{i}].budget"), &k.budget)?;
            validate_rates(&format!("keys[{i}].limits"), &k.limits)?;
        }
        let mut admin_ids = HashSet::new();
        let mut admin_hashes = HashSet::new();
        for (i, k) in self.admin.keys.iter().enumerate() {
            if !valid_id(&k.id) || !admin_ids.insert(k.id.as_str()) {
                return Err(err(
                    format!("admin.keys[{i}].id"),
                    format!("`{}` is repeated or not 1-64 of [A-Za-z0-9_-]", k.id),
                ));
            }
            match (&k.key_sha256, &k.key) {
                (Some(h), None) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    let h = h.to_ascii_lowercase();
                    if hashes.contains(&h) {
                        return Err(err(
                            format!("admin.keys[{i}]"),
                            "an admin key must not also be a client key",
                        ));
                    }
                    // One key under two ids would sign in as whichever comes first, and
                    // revoking one id would leave the key working under the other.
                    if !admin_hashes.insert(h) {
                        return Err(err(
                            format!("admin.keys[{i}]"),
                            "the same admin key is configured twice",
                        ));
                    }
                }
                (Some(_), None) => {
                    return Err(err(
                        format!("admin.keys[{i}].key_sha256"),
                        "must be 64 hex digits (the SHA-256 of the key)",
                    ));
                }
                (None, Some(_)) => {}
                _ => {
                    return Err(err(
                        format!("admin.keys[{i}]"),
                        "needs exactly one of `key_sha256` and `key`",
                    ));
                }
            }
            if let Some(t) = &k.tenant
                && !valid_id(t)
            {
                return Err(err(
                    format!("admin.keys[{i}].tenant"),
                    format!("`{t}` is not 1-64 of [A-Za-z0-9_-]"),
                ));
            }
        }
        if self.admin.stale_after_ms == 0 {
            return Err(err("admin.stale_after_ms", "must be > 0"));
        }
        let b = &self.budgets;
        if b.safety_margin > rust_decimal::Decimal::from(10) {
            return Err(err("budgets.safety_margin", "must be between 0 and 10"));
        }
        Ok(())
    }

    /// The target with this id.
    pub fn target(&self, id: &str) -> Option<&TargetConfig> {
        self.targets.iter().find(|t| t.id == id)
    }

    /// The policy with this id.
    pub fn policy(&self, id: &str) -> Option<&Policy> {
        self.policies.iter().find(|p| p.id == id)
    }

    /// The model with this id.
    pub fn model(&self, id: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.id == id)
    }
}

pub use crate::config_handle::{ConfigHandle, Confirmation, LiveStatus, Versioned};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn base() -> GatewayConfig {
        serde_json::from_value(serde_json::json!({
            "targets": [{"id": "mock", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "mock"}],
            "models": [{"id": "demo/mock", "targets": ["mock"]}]
        }))
        .unwrap()
    }

    #[test]
    fn valid_default_shape() {
        let c = base();
        assert_eq!(c.listen, "127.0.0.1:8080");
        assert!(c.validate().is_ok());
    }

    #[test]
    fn server_section_defaults_partial_and_rejects() {
        assert_eq!(base().server, ServerConfig::default());
        let c: GatewayConfig = serde_json::from_value(serde_json::json!({
            "server": {"max_in_flight": 4, "header_read_timeout_ms": 500}
        }))
        .unwrap();
        assert_eq!(c.server.max_in_flight, 4);
        assert_eq!(c.server.header_read_timeout_ms, 500);
        assert_eq!(c.server.drain_timeout_ms, 30_000);
        let unknown = serde_json::json!({"server": {"max_inflight": 4}});
        assert!(serde_json::from_value::<GatewayConfig>(unknown).is_err());
        let mut c = base();
        c.server.write_stall_ms = 0;
        assert_eq!(c.validate().unwrap_err().field, "server.write_stall_ms");
    }

    #[test]
    fn unknown_target_names_the_field() {
        let mut c = base();
        c.models[0].targets.push("nope".into());
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "models[0].targets[1]");
    }

    #[test]
    fn responses_api_only_on_openai_kinds() {
        let mut c = base();
        c.targets[0].api = OpenAiApi::Responses;
        assert!(c.validate().is_ok());
        c.targets[0].provider = ProviderKind::Anthropic;
        assert_eq!(c.validate().unwrap_err().field, "targets[0].api");
        let t: TargetConfig = serde_json::from_value(serde_json::json!({"id": "a",
            "provider": "azure_openai", "base_url": "https://x", "upstream_model": "d",
            "api": "responses"}))
        .unwrap();
        assert_eq!(t.api, OpenAiApi::Responses);
        let bad = serde_json::json!({"id": "a", "provider": "openai", "base_url": "https://x",
            "upstream_model": "d", "api": "assistants"});
        assert!(serde_json::from_value::<TargetConfig>(bad).is_err());
    }

    #[test]
    fn api_version_only_on_azure() {
        let mut c = base();
        c.targets[0].api_version = Some("2024-10-21".into());
        assert_eq!(c.validate().unwrap_err().field, "targets[0].api_version");
        c.targets[0].provider = ProviderKind::AzureOpenai;
        assert!(c.validate().is_ok());
        c.targets[0].api_version = Some("2024-10-21&x=1".into());
        assert_eq!(c.validate().unwrap_err().field, "targets[0].api_version");
        let t: TargetConfig = serde_json::from_value(serde_json::json!({"id": "g",
            "provider": "gemini", "base_url": "builtin:mock", "upstream_model": "m"}))
        .unwrap();
        assert_eq!((t.provider.as_str(), t.api_version), ("gemini", None));
        let t: TargetConfig = serde_json::from_value(serde_json::json!({"id": "a",
            "provider": "azure_openai", "base_url": "builtin:mock", "upstream_model": "d"}))
        .unwrap();
        assert_eq!(t.provider.as_str(), "azure_openai");
    }

    #[test]
    fn builtin_base_urls_are_valid_and_others_are_not() {
        let mut c = base();
        c.targets[0].base_url = BUILTIN_LOCAL_MODEL_URL.into();
        assert!(c.validate().is_ok());
        c.targets[0].base_url = "builtin:mock/x/status=503,retry_after=2".into();
        assert!(c.validate().is_ok());
        for bad in [
            "builtin:mock/x/",
            "builtin:mock/x/a/b",
            "builtin:mock/y/a",
            "builtin:mockx",
        ] {
            c.targets[0].base_url = bad.into();
            assert_eq!(
                c.validate().unwrap_err().field,
                "targets[0].base_url",
                "{bad}"
            );
        }
        c.targets[0].base_url = "builtin:nope".into();
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "targets[0].base_url");
        assert!(e.message.contains(BUILTIN_LOCAL_MODEL_URL), "{}", e.message);
    }

    #[test]
    fn bedrock_targets_need_aws_settings() {
        let mut c = base();
        c.targets[0].provider = ProviderKind::Bedrock;
        assert_eq!(c.validate().unwrap_err().field, "targets[0].aws");
        let t: TargetConfig = serde_json::from_value(serde_json::json!({"id": "mock",
            "provider": "bedrock", "upstream_model": "anthropic.claude-3-haiku-20240307-v1:0",
            "aws": {"region": "us-east-1", "access_key_id": "AKID", "secret_access_key": "s",
                "session_token": "tok"}}))
        .unwrap();
        assert_eq!((t.provider.as_str(), t.base_url.as_str()), ("bedrock", ""));
        let aws = t.aws.clone().unwrap();
        assert_eq!(format!("{aws:?}").matches("[redacted]").count(), 3);
        c.targets[0] = t;
        assert!(c.validate().is_ok(), "{:?}", c.validate());
        c.targets[0].aws.as_mut().unwrap().region = "US East".into();
        assert_eq!(c.validate().unwrap_err().field, "targets[0].aws.region");
        c.targets[0].aws.as_mut().unwrap().region = "eu-west-3".into();
        c.targets[0].aws.as_mut().unwrap().secret_access_key = Secret::new("");
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "targets[0].aws.secret_access_key");
        c.targets[0].aws = Some(aws);
        c.targets[0].provider = ProviderKind::Openai;
        assert_eq!(c.validate().unwrap_err().field, "targets[0].base_url");
        c.targets[0].base_url = "https://api.openai.com/v1".into();
        assert_eq!(c.validate().unwrap_err().field, "targets[0].aws");
        let r: Result<AwsTarget, _> = serde_json::from_value(serde_json::json!({"region": "x",
            "access_key_id": "a", "secret_access_key": "b", "profile": "p"}));
        assert!(r.unwrap_err().to_string().contains("profile"));
    }

    #[test]
    fn an_admin_key_hash_under_two_ids_is_rejected() {
        let h = "ab".repeat(32);
        let mut c = base();
        c.admin = serde_json::from_value(serde_json::json!({"keys": [
            {"id": "ops", "key_sha256": h},
            {"id": "ops-2", "key_sha256": h.to_ascii_uppercase()}
        ]}))
        .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("admin.keys[1]"), "{e}");
        assert!(e.contains("the same admin key is configured twice"), "{e}");
        c.admin.keys.pop();
        assert!(c.validate().is_ok());
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let r: Result<GatewayConfig, _> =
            serde_json::from_value(serde_json::json!({"listne": "x"}));
        assert!(r.unwrap_err().to_string().contains("listne"));
    }
}
