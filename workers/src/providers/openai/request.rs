//! Normalised request → OpenAI Chat Completions and embeddings request bodies: the typed wire
//! shapes (OpenAI API reference, "Create chat completion" → request body,
//! <https://platform.openai.com/docs/api-reference/chat/create>, and "Create embeddings",
//! <https://platform.openai.com/docs/api-reference/embeddings/create>), with the dialects of
//! compatible servers and Azure OpenAI api-versions ([`ChatDialect`]).
//!
//! The normalised request is OpenAI-shaped, so messages, tools and content parts go out in
//! their own (typed) serialisation; what stays `serde_json::Value` is the client's JSON:
//! `tool_choice`, `response_format` and the [`Passthrough::OPENAI`] fields, merged over the
//! serialised body.

use serde::Serialize;
use serde_json::{Map, Value};
use switchyard_schemas::config::ProviderKind;
use switchyard_schemas::embed::{EmbedInput, EmbedRequest};
use switchyard_schemas::request::{Content, Message, Passthrough, Role, Tool, ToolCall};
use switchyard_schemas::{ChatRequest, ErrorInfo};

use crate::providers::shared::to_json_object;

/// How an OpenAI-style server wants a chat body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatDialect {
    /// The token cap goes in `max_completion_tokens` (OpenAI deprecated `max_tokens` for it;
    /// compatible servers and older Azure api-versions mostly know only the old name).
    pub max_completion_tokens: bool,
    /// `developer` messages are sent as `system` (servers that predate the role).
    pub developer_as_system: bool,
    /// `reasoning_effort` and the [`Passthrough::OPENAI`] fields are sent (OpenAI's reasoning
    /// models take them; compatible servers commonly reject unknown fields).
    pub openai_fields: bool,
}

impl ChatDialect {
    /// OpenAI's own dialect for [`ProviderKind::Openai`], the compatible servers' for any other.
    pub fn of(kind: ProviderKind) -> Self {
        let openai = kind == ProviderKind::Openai;
        ChatDialect {
            max_completion_tokens: openai,
            developer_as_system: kind == ProviderKind::OpenaiCompatible,
            openai_fields: openai,
        }
    }
}

/// A Chat Completions request body; unset optional parameters are left out.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
struct ChatCompletionsRequest<'a> {
    model: &'a str,
    messages: Vec<ChatMessage<'a>>,
    #[serde(skip_serializing_if = "<[Tool]>::is_empty")]
    tools: &'a [Tool],
    tool_choice: Option<&'a Value>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_completion_tokens: Option<u32>,
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    n: Option<u32>,
    seed: Option<i64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    response_format: Option<&'a Value>,
    parallel_tool_calls: Option<bool>,
    /// See [`user_field`].
    user: Option<String>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    reasoning_effort: Option<&'a str>,
    /// `true` for a streaming client, else absent.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    /// With `stream`: `{"include_usage": true}`, so usage arrives in a last chunk.
    stream_options: Option<StreamOptions>,
}

/// `stream_options`.
#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// A normalised message as sent: its OpenAI fields, without the Anthropic-only
/// `thinking_blocks` (signed reasoning OpenAI-style servers do not take back) and
/// `cache_control` (Anthropic's cache breakpoints).
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
struct ChatMessage<'a> {
    role: Role,
    content: Option<&'a Content>,
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "<[ToolCall]>::is_empty")]
    tool_calls: &'a [ToolCall],
    tool_call_id: Option<&'a str>,
}

impl<'a> ChatMessage<'a> {
    fn new(m: &'a Message, dialect: ChatDialect) -> Self {
        // Every field named: a new `Message` field does not compile until it is decided here.
        let Message {
            role,
            content,
            name,
            tool_calls,
            tool_call_id,
            thinking_blocks: _,
            cache_control: _,
        } = m;
        let role = match role {
            Role::Developer if dialect.developer_as_system => Role::System,
            other => *other,
        };
        ChatMessage {
            role,
            content: content.as_ref(),
            name: name.as_deref(),
            tool_calls,
            tool_call_id: tool_call_id.as_deref(),
        }
    }
}

/// Builds the upstream JSON body of [`ProviderKind`] `kind` (see [`build_object`]). Public for
/// tests and benchmarks.
pub fn build_body(
    kind: ProviderKind,
    upstream_model: &str,
    req: &ChatRequest,
) -> Result<Vec<u8>, ErrorInfo> {
    let body = build_object(ChatDialect::of(kind), upstream_model, req)?;
    Ok(Value::Object(body).to_string().into_bytes())
}

/// The upstream JSON body as an object (the FC-12 retry drops its `stream_options`); an
/// `internal` error only if JSON encoding fails.
///
/// Beyond the normalised fields: `logprobs` / `top_logprobs` go to every OpenAI-style upstream
/// (the answer's `logprobs.content` entries come back as `logprobs` frames); `reasoning_effort`
/// and the [`Passthrough::OPENAI`] fields (`service_tier`, `prediction`, `logit_bias`, …) only
/// with [`ChatDialect::openai_fields`] (OpenAI and Azure OpenAI), the passthrough winning over
/// the translated fields except `stream` / `stream_options`. `thinking_blocks` and
/// `cache_control` are never sent; `top_k` and the Anthropic passthrough are not either.
pub fn build_object(
    dialect: ChatDialect,
    upstream_model: &str,
    req: &ChatRequest,
) -> Result<Map<String, Value>, ErrorInfo> {
    let p = &req.params;
    let max_tokens = p.max_tokens;
    let body = ChatCompletionsRequest {
        model: upstream_model,
        messages: (req.messages.iter())
            .map(|m| ChatMessage::new(m, dialect))
            .collect(),
        tools: &req.tools,
        tool_choice: req.tool_choice.as_ref(),
        temperature: p.temperature,
        top_p: p.top_p,
        max_completion_tokens: max_tokens.filter(|_| dialect.max_completion_tokens),
        max_tokens: max_tokens.filter(|_| !dialect.max_completion_tokens),
        stop: &p.stop,
        n: p.n,
        seed: p.seed,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        response_format: p.response_format.as_ref(),
        parallel_tool_calls: p.parallel_tool_calls,
        user: p.user.as_deref().map(user_field),
        logprobs: p.logprobs,
        top_logprobs: p.top_logprobs,
        reasoning_effort: (p.reasoning_effort.as_deref()).filter(|_| dialect.openai_fields),
        stream: req.stream,
        stream_options: req.stream.then_some(StreamOptions {
            include_usage: true,
        }),
    };
    let mut o = to_json_object(&body)?;
    if dialect.openai_fields
        && let Some(extra) = req.passthrough.get(Passthrough::OPENAI)
    {
        for (k, v) in &extra.body {
            if !(req.stream && (k == "stream" || k == "stream_options")) {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(o)
}

/// Longest `user` OpenAI accepts, characters ("Invalid 'user': string too long. Expected a string
/// with maximum length 64").
pub const MAX_USER_CHARS: usize = 64;

/// `user` as sent upstream: as is up to [`MAX_USER_CHARS`], else its SHA-256 in hex (64
/// characters: still one stable id per end user). Claude Code's `metadata.user_id`, which the
/// Anthropic door makes `user`, is a ~150-character JSON text.
pub fn user_field(user: &str) -> String {
    if user.chars().count() <= MAX_USER_CHARS {
        user.to_owned()
    } else {
        switchyard_schemas::tenancy::sha256_hex(user)
    }
}

/// An embeddings request body: floats on the wire, whatever the client asked.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
pub struct EmbeddingsBody<'a> {
    model: &'a str,
    input: &'a EmbedInput,
    encoding_format: &'static str,
    dimensions: Option<u32>,
    user: Option<&'a str>,
}

/// The upstream body of an embeddings call (see [`EmbeddingsBody`]).
pub fn embed_body<'a>(upstream_model: &'a str, req: &'a EmbedRequest) -> EmbeddingsBody<'a> {
    EmbeddingsBody {
        model: upstream_model,
        input: &req.input,
        encoding_format: "float",
        dimensions: req.dimensions,
        user: req.user.as_deref(),
    }
}
