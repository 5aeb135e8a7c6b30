//! The normalised chat request ingress publishes and workers consume.
//!
//! The shape follows the OpenAI Chat Completions vocabulary (the lingua franca of the field), with
//! everything a provider adapter needs to translate to its own wire format and nothing tied to one
//! front door. Reference: OpenAI API reference, "Create chat completion".

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use uuid::Uuid;

/// One chat completion request after validation and routing.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Request id (UUIDv7), also the idempotency key sent upstream and the usage join key.
    pub id: Uuid,
    /// Tenant the calling key belongs to, when auth is on.
    pub tenant: Option<String>,
    /// Id of the calling API key (never the key itself), when auth is on.
    pub key_id: Option<String>,
    /// The standard model id or route tag the client asked for, e.g. `demo/mock`. Echoed to the client.
    pub model: String,
    /// The target chosen for this attempt.
    pub target: TargetRef,
    /// The conversation, in order.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// OpenAI `tool_choice`: `"auto"`, `"none"`, `"required"` or `{"type":"function","function":{"name"}}`.
    pub tool_choice: Option<serde_json::Value>,
    /// Sampling and output-shaping parameters.
    #[serde(default)]
    pub params: SamplingParams,
    /// Whether the client asked for an SSE stream.
    pub stream: bool,
    /// Whether the client asked for a final usage chunk (`stream_options.include_usage`).
    #[serde(default)]
    pub include_usage: bool,
    /// Absolute deadline, ms since the Unix epoch; workers abandon the request after it.
    pub deadline_ms: u64,
    /// Zero-based attempt number across fallbacks (0 = first target).
    #[serde(default)]
    pub attempt: u32,
    /// The batch job this request is an item of (`None` for live traffic). Workers admit batch
    /// items only within the share of each target's limits left to them, and price their usage
    /// at the batch rate.
    pub batch_id: Option<String>,
    /// Provider-specific fields a front door accepted that have no normalised equivalent, keyed by
    /// the provider family they are meant for ([`Passthrough::ANTHROPIC`], [`Passthrough::OPENAI`]).
    /// The adapter of that family sends them unchanged; every other adapter ignores them (each
    /// adapter's docs say what it maps instead). Absent in older payloads.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub passthrough: BTreeMap<String, Passthrough>,
    /// Ingress's estimate of the prompt, tokens ([`crate::tokens`]: o200k of `messages` and
    /// `tools` plus framing), when admission computed one (a budgeted caller): workers charge
    /// TPM with it instead of tokenizing the prompt again. `None` after the messages changed
    /// (context trimming) and in older payloads.
    pub prompt_tokens: Option<u64>,
}

/// Fields and headers passed unchanged to one provider family (see [`ChatRequest::passthrough`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Passthrough {
    /// Top-level body fields, e.g. Anthropic `thinking`, `context_management`, `output_config`.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub body: serde_json::Map<String, serde_json::Value>,
    /// HTTP headers (lower-case names), e.g. `anthropic-beta`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

impl Passthrough {
    /// Key of the Anthropic Messages family (the Anthropic adapter).
    pub const ANTHROPIC: &'static str = "anthropic";
    /// Key of the OpenAI Chat Completions family (the OpenAI and Azure OpenAI adapters;
    /// OpenAI-compatible servers do not get these fields).
    pub const OPENAI: &'static str = "openai";

    /// Whether nothing is carried.
    pub fn is_empty(&self) -> bool {
        self.body.is_empty() && self.headers.is_empty()
    }
}

/// `null` → the type's default (OpenAI SDKs send `null` for absent optional lists, e.g.
/// `tool_calls: null` from `message.model_dump()`).
pub fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The target an attempt goes to: which provider adapter, which configured target, which upstream model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetRef {
    /// Configured target id, e.g. `mock` or `openai-main`.
    pub id: String,
    /// Provider queue (subject token), e.g. `openai`; workers for it share queue group `workers.<provider>`.
    pub provider: String,
    /// The model id the upstream expects, e.g. `gpt-4o-mini-2024-07-18`.
    pub upstream_model: String,
}

/// Who said a message. `developer` is OpenAI's newer name for system instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// System instructions.
    System,
    /// Developer instructions (OpenAI o-series name for system).
    Developer,
    /// The end user.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

/// One message of the conversation.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Author role.
    pub role: Role,
    /// Text or multi-part content; absent on assistant messages that only call tools.
    pub content: Option<Content>,
    /// Optional participant name.
    pub name: Option<String>,
    /// Tool calls made by an assistant message (`null` reads as none).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub tool_calls: Vec<ToolCall>,
    /// For `role: tool`, the id of the call this answers.
    pub tool_call_id: Option<String>,
    /// Reasoning an assistant turn produced before its content (Anthropic "Extended thinking":
    /// `thinking` blocks with their `signature`, `redacted_thinking` blocks), replayed to
    /// providers that verify it (Anthropic) and dropped by the others. Wire name as LiteLLM's
    /// OpenAI-shaped messages use it.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub thinking_blocks: Vec<ThinkingBlock>,
    /// An Anthropic prompt-caching breakpoint at the end of this message (Anthropic "Prompt
    /// caching": `cache_control` on the message's last block, e.g. `{"type":"ephemeral"}`; the
    /// message-level form LiteLLM accepts on OpenAI-shaped messages). The Anthropic adapter puts
    /// it on the message's last content block; other adapters do not send it.
    pub cache_control: Option<serde_json::Value>,
}

/// One block of model reasoning (Anthropic "Extended thinking", content block types).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingBlock {
    /// `{"type":"thinking","thinking","signature"}`: readable reasoning and the provider's
    /// signature over it (must be replayed unchanged).
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Opaque signature, e.g. `EqQBCkYIBRgCKkA1…`.
        signature: Option<String>,
    },
    /// `{"type":"redacted_thinking","data"}`: encrypted reasoning.
    RedactedThinking {
        /// Opaque encrypted data.
        data: String,
    },
    /// An OpenAI Responses `reasoning` item passed back with its `encrypted_content` (OpenAI API
    /// reference, "Reasoning" input item; `include: ["reasoning.encrypted_content"]`): only the
    /// upstream deployment that produced it can decrypt it. Sent unchanged to Responses-API
    /// targets only (every other adapter drops it); a conversation holding one is pinned to the
    /// target that first accepted it (the Responses door, docs/routing.md).
    Reasoning {
        /// The item id, e.g. `rs_…`.
        id: Option<String>,
        /// Opaque encrypted reasoning.
        encrypted_content: String,
        /// The readable summary parts as sent (`[{"type":"summary_text","text"}]`).
        #[serde(default)]
        summary: Vec<serde_json::Value>,
    },
}

impl ThinkingBlock {
    /// The readable text (empty for redacted blocks).
    pub fn text(&self) -> &str {
        match self {
            Self::Thinking { thinking, .. } => thinking,
            Self::RedactedThinking { .. } | Self::Reasoning { .. } => "",
        }
    }

    /// Whether this is an OpenAI encrypted `reasoning` item (readable by one deployment only).
    pub fn is_encrypted_reasoning(&self) -> bool {
        matches!(self, Self::Reasoning { .. })
    }
}

/// Message content: a plain string or a list of parts (OpenAI's two accepted forms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// A plain string.
    Text(String),
    /// Multi-part content (text and images).
    Parts(Vec<ContentPart>),
}

impl Content {
    /// All text of the content joined with `\n` (images skipped): for token estimates and cache keys.
    pub fn text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    ContentPart::ImageUrl { .. } | ContentPart::File { .. } => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// One part of multi-part content, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// `{"type":"text","text":…}`
    Text {
        /// The text.
        text: String,
    },
    /// `{"type":"image_url","image_url":{"url","detail"}}`; `url` is an http(s) or `data:` URL.
    ImageUrl {
        /// The image reference.
        image_url: ImageUrl,
    },
    /// `{"type":"file","file":{"filename","file_data"}}` (OpenAI API reference, Chat Completions
    /// "File content part"): a document given inline, a PDF today. Anthropic's `document` block
    /// with a base64 PDF source arrives as this; each provider sends its own document form.
    File {
        /// The document.
        file: FilePart,
    },
}

/// An inline document of a [`ContentPart::File`].
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilePart {
    /// The file name (Anthropic: the document `title`), if given.
    pub filename: Option<String>,
    /// `data:application/pdf;base64,<data>` (checked by `input::file_data`); empty when the
    /// document is given by [`Self::file_url`] or [`Self::file_id`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file_data: String,
    /// An `https`/`http` URL of the document (Anthropic `document` `source: {"type": "url"}`,
    /// Responses `input_file.file_url`), checked like image URLs (`input::image_url`: never a
    /// loopback, private or link-local address); the gateway never fetches it. Providers that
    /// take document URLs get it (Anthropic, OpenAI Responses, Gemini `fileData`); the others
    /// answer 400 naming the part.
    pub file_url: Option<String>,
    /// A file uploaded to the provider itself (OpenAI `file.file_id`, Anthropic `document`
    /// `source: {"type": "file"}` with the Files API beta): sent unchanged to providers that take
    /// file references (OpenAI, Azure, OpenAI Responses, Anthropic); the id is the provider's, so
    /// route such a request to that provider (e.g. `x-switchyard-only`). Others answer 400.
    pub file_id: Option<String>,
}

/// An image reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageUrl {
    /// `https://…` or `data:image/png;base64,…`.
    pub url: String,
    /// `auto`, `low` or `high`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A function tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// Always `function` today.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function's declaration.
    pub function: FunctionDef,
}

/// A function declaration: name, description and JSON Schema parameters.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    /// Function name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// JSON Schema of the arguments.
    pub parameters: Option<serde_json::Value>,
    /// OpenAI structured-outputs strict mode.
    pub strict: Option<bool>,
}

/// A complete tool call made by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id, e.g. `call_abc`.
    pub id: String,
    /// Always `function` (absent reads as `function`, as OpenAI accepts it).
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// Name and JSON-encoded arguments.
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".into()
}

/// The function part of a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON string (as OpenAI sends them).
    pub arguments: String,
}

/// Sampling and output-shaping parameters; `None` means "provider default".
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0–2.
    pub temperature: Option<f64>,
    /// Nucleus sampling, 0–1.
    pub top_p: Option<f64>,
    /// Upper bound on generated tokens (OpenAI `max_completion_tokens` or legacy `max_tokens`).
    pub max_tokens: Option<u32>,
    /// Stop sequences (up to 4 on OpenAI).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Number of choices.
    pub n: Option<u32>,
    /// Best-effort determinism seed.
    pub seed: Option<i64>,
    /// −2 to 2.
    pub presence_penalty: Option<f64>,
    /// −2 to 2.
    pub frequency_penalty: Option<f64>,
    /// OpenAI `response_format` object (`text`, `json_object`, `json_schema`).
    pub response_format: Option<serde_json::Value>,
    /// Whether the model may call several tools in one turn.
    pub parallel_tool_calls: Option<bool>,
    /// End-user id for abuse tracking and stable canary hashing.
    pub user: Option<String>,
    /// OpenAI `reasoning_effort` (`none`, `minimal`, `low`, `medium`, `high`, `xhigh`): OpenAI
    /// passes it on, Anthropic maps it to a `thinking` budget, other adapters drop it.
    pub reasoning_effort: Option<String>,
    /// OpenAI `logprobs`: passed to OpenAI-style upstreams, dropped by the others.
    pub logprobs: Option<bool>,
    /// OpenAI `top_logprobs` (0–20): as `logprobs`.
    pub top_logprobs: Option<u32>,
    /// Top-k sampling (Anthropic `top_k`, Gemini `topK`); OpenAI-style upstreams do not get it.
    pub top_k: Option<u32>,
}

impl ChatRequest {
    /// All message text joined: the input to token estimates.
    pub fn prompt_text(&self) -> String {
        self.messages
            .iter()
            .filter_map(|m| m.content.as_ref().map(Content::text))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
