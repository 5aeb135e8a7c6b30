//! Upstream targets (provider endpoints with a model and credentials) and the models clients
//! name, mapped onto them.

use crate::routing::{Breaker, Limits, Probe, Retry, TimeoutOverrides};
use crate::secret::Secret;
use serde::{Deserialize, Serialize};

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

fn yes() -> bool {
    true
}
fn one() -> f64 {
    1.0
}
