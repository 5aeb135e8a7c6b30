//! Parses and validates an Anthropic `POST /v1/messages` body into the normalised request
//! ([`Inbound`], routed exactly like the OpenAI front door's).
//!
//! Reference: Anthropic API reference, "Messages" (create a Message): `model`, `max_tokens`
//! (required), `messages` (`user`/`assistant` turns, string or content-block content; `system`
//! turns mid-conversation too, as Claude Code sends them), top-level `system` (string or text
//! blocks), `tools` (`name`, `description`, `input_schema`), `tool_choice`
//! (`auto|any|tool|none`, `disable_parallel_tool_use`), `temperature`, `top_p`, `top_k`,
//! `stop_sequences`, `stream`, `metadata.user_id`, `thinking`. Content blocks: "Vision" (`image`
//! with a `base64` or `url` source), "Tool use" (`tool_use` in assistant turns, `tool_result`
//! in user turns) and "Extended thinking" (`thinking` with `signature`, `redacted_thinking`, in
//! assistant turns: kept as the message's `thinking_blocks`).
//!
//! Every top-level field the API defines is accepted. Those without a normalised equivalent
//! travel in the request's [`Passthrough::ANTHROPIC`] fields, sent unchanged to an Anthropic
//! upstream and dropped for every other provider: `thinking` (`enabled` + `budget_tokens`,
//! `adaptive`, `disabled`), `context_management`, `output_config`, `output_format`,
//! `service_tier`, `container`, `mcp_servers`, `inference_geo`, the whole `metadata`, the
//! top-level `cache_control`, and the raw `system` blocks and `tools` (keeping their
//! `cache_control`). The `anthropic-beta` header rides along the same way ([`parse_with`]).
//! `cache_control` on message blocks becomes the normalised message's `cache_control` (a
//! breakpoint at the end of that message: the Anthropic adapter puts it on the message's last
//! block; several breakpoints within one message become one). `citations` on input text blocks,
//! `eager_input_streaming` on tools and `caller: {"type":"direct"}` on `tool_use` blocks are
//! accepted and not forwarded. Unknown fields are a 400 naming the field (Anthropic:
//! "Extra inputs are not permitted").

use crate::error::ApiError;
use crate::route::Inbound;
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use switchyard_schemas::input;
use switchyard_schemas::request::{
    Content, ContentPart, FilePart, FunctionCall, FunctionDef, ImageUrl, Message, Passthrough,
    Role, SamplingParams, ThinkingBlock, Tool, ToolCall,
};

/// Top-level fields Switchyard translates ("Messages" request body).
const KNOWN: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
];

/// Fields sent unchanged to an Anthropic upstream only (see the module docs).
const PASSTHROUGH: &[&str] = &[
    "thinking",
    "context_management",
    "output_config",
    "output_format",
    "service_tier",
    "container",
    "mcp_servers",
    "inference_geo",
    "cache_control",
];

/// Fields Anthropic requires (the API answers "<field>: Field required").
const REQUIRED: &[&str] = &["model", "max_tokens", "messages"];

/// Content block types Switchyard translates.
const BLOCK_TYPES: &[&str] = &[
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
];

#[derive(Debug, Deserialize)]
struct Body {
    model: String,
    messages: Vec<InMessage>,
    max_tokens: u32,
    system: Option<Value>,
    metadata: Option<Metadata>,
    stop_sequences: Option<Vec<String>>,
    stream: Option<bool>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u32>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<InToolChoice>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InMessage {
    role: InRole,
    content: Value,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum InRole {
    User,
    Assistant,
    /// Mid-conversation instructions (Claude Code sends them).
    System,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    user_id: Option<String>,
}

/// One input content block ("Messages", `content` block types).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Block {
    Text {
        text: String,
        #[serde(default)]
        cache_control: Option<Value>,
        #[serde(default, rename = "citations")]
        _citations: Option<IgnoredAny>,
    },
    Image {
        source: ImageSource,
        #[serde(default)]
        cache_control: Option<Value>,
    },
    /// A document (Anthropic "PDF support" / "Citations"): a base64 PDF becomes a
    /// [`ContentPart::File`], a plain-text or content source its text; `context` and `citations`
    /// have no normalised equivalent and are dropped.
    Document {
        source: DocumentSource,
        #[serde(default)]
        title: Option<String>,
        #[serde(default, rename = "context")]
        _context: Option<IgnoredAny>,
        #[serde(default, rename = "citations")]
        _citations: Option<IgnoredAny>,
        #[serde(default)]
        cache_control: Option<Value>,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
        #[serde(default)]
        caller: Option<Value>,
        #[serde(default)]
        cache_control: Option<Value>,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<Value>,
        /// No normalised equivalent: the result text (which states the failure) goes through.
        #[serde(default, rename = "is_error")]
        _is_error: Option<bool>,
        #[serde(default)]
        cache_control: Option<Value>,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    RedactedThinking {
        data: String,
    },
}

impl Block {
    /// The block's `cache_control` (a prompt-caching breakpoint), if any.
    fn cache_control(&self) -> Option<&Value> {
        match self {
            Block::Text { cache_control, .. }
            | Block::Image { cache_control, .. }
            | Block::Document { cache_control, .. }
            | Block::ToolUse { cache_control, .. }
            | Block::ToolResult { cache_control, .. } => cache_control.as_ref(),
            Block::Thinking { .. } | Block::RedactedThinking { .. } => None,
        }
        .filter(|v| !v.is_null())
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

/// The `source` of a `document` block.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum DocumentSource {
    Base64 { media_type: String, data: String },
    Text { media_type: String, data: String },
    Content { content: Value },
    Url { url: String },
    File { file_id: String },
}

/// A custom tool. Fields beyond these (`cache_control`, `eager_input_streaming`, `type`,
/// `input_examples`, `defer_loading`, …) are accepted: the raw tools reach an Anthropic upstream
/// unchanged, which judges them.
#[derive(Debug, Deserialize)]
struct InTool {
    name: String,
    description: Option<String>,
    input_schema: Value,
    strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum InToolChoice {
    Auto {
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        disable_parallel_tool_use: Option<bool>,
    },
    #[serde(rename = "none")]
    NoTool {},
}

/// A 400 `invalid_request_error` about `param`, worded like Anthropic's (`<param>: <problem>`).
fn invalid(param: &str, problem: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(format!("{param}: {problem}"), Some(param.to_owned()))
}

/// Deserialises `v`, naming the failing field's path below `at` in the error.
fn from_value_at<T: DeserializeOwned>(v: Value, at: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.path().to_string();
        let path = match (at.is_empty(), inner.as_str()) {
            (_, ".") => at.to_owned(),
            (true, _) => inner,
            (false, i) if i.starts_with('[') => format!("{at}{i}"),
            (false, i) => format!("{at}.{i}"),
        };
        let err = e.into_inner();
        if path.is_empty() {
            ApiError::invalid(format!("Invalid request body: {err}"), None)
        } else {
            invalid(&path, err)
        }
    })
}

/// Parses `body` into the normalised [`Inbound`]; errors name the offending field's path.
pub fn parse(body: &[u8]) -> Result<Inbound, ApiError> {
    parse_with(body, None)
}

/// [`parse`], carrying the request's `anthropic-beta` header (comma-separated beta names) to an
/// Anthropic upstream.
pub fn parse_with(body: &[u8], beta: Option<&str>) -> Result<Inbound, ApiError> {
    let root: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    })?;
    let Value::Object(mut obj) = root else {
        return Err(ApiError::invalid(
            "The request body must be a JSON object.",
            None,
        ));
    };
    // `null` means absent for every optional field.
    obj.retain(|_, v| !v.is_null());
    check_fields(&obj)?;
    let mut extra = Passthrough::default();
    for key in PASSTHROUGH {
        if let Some(v) = obj.remove(*key) {
            extra.body.insert((*key).to_owned(), v);
        }
    }
    if let Some(t) = extra.body.get("thinking") {
        check_thinking(t)?;
    }
    for key in ["metadata", "tools"] {
        if let Some(v) = obj.get(key) {
            extra.body.insert(key.to_owned(), v.clone());
        }
    }
    if let Some(system @ Value::Array(_)) = obj.get("system") {
        extra.body.insert("system".into(), system.clone());
    }
    if let Some(beta) = beta.map(str::trim).filter(|b| !b.is_empty()) {
        extra
            .headers
            .insert("anthropic-beta".into(), beta.to_owned());
    }
    let b: Body = from_value_at(Value::Object(obj), "")?;
    if b.model.trim().is_empty() {
        return Err(invalid("model", "must not be empty"));
    }
    if b.max_tokens == 0 {
        return Err(invalid("max_tokens", "must be greater than or equal to 1"));
    }
    if b.messages.is_empty() {
        return Err(invalid("messages", "at least one message is required"));
    }
    check_range("temperature", b.temperature)?;
    check_range("top_p", b.top_p)?;
    let mut messages = Vec::with_capacity(b.messages.len() + 1);
    let mut leading_system = false;
    if let Some(system) = b.system {
        let m = system_message(system, "system")?;
        leading_system = m.is_some();
        messages.extend(m);
    }
    if !leading_system {
        // An empty `system` became no message: the adapter's "first system message is the raw
        // `system`" rule must not skip a later one.
        extra.body.remove("system");
    }
    for (i, m) in b.messages.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        match m.role {
            InRole::User => user_turn(m.content, &at, &mut messages)?,
            InRole::Assistant => messages.push(assistant_turn(m.content, &at)?),
            InRole::System => {
                let cache = match &m.content {
                    Value::Array(blocks) => blocks
                        .iter()
                        .rev()
                        .find_map(|b| b.get("cache_control").filter(|c| !c.is_null()).cloned()),
                    _ => None,
                };
                let system = system_message(m.content, &format!("{at}.content"))?;
                messages.extend(system.map(|mut s| {
                    s.cache_control = cache;
                    s
                }));
            }
        }
    }
    let tools = b
        .tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| tool(t, &format!("tools[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let server_tools = tools.iter().any(Option::is_none);
    let tools: Vec<Tool> = tools.into_iter().flatten().collect();
    let (mut tool_choice, parallel_tool_calls) =
        tool_choice(b.tool_choice, !tools.is_empty() || server_tools)?;
    if tools.is_empty() {
        // Only server tools: the choice cannot be expressed without them.
        tool_choice = None;
    }
    let mut passthrough = BTreeMap::new();
    if !extra.is_empty() {
        passthrough.insert(Passthrough::ANTHROPIC.to_owned(), extra);
    }
    Ok(Inbound {
        model: b.model,
        messages,
        tools,
        tool_choice,
        params: SamplingParams {
            temperature: b.temperature,
            top_p: b.top_p,
            top_k: b.top_k,
            max_tokens: Some(b.max_tokens),
            stop: b.stop_sequences.unwrap_or_default(),
            parallel_tool_calls,
            user: b.metadata.and_then(|m| m.user_id),
            ..SamplingParams::default()
        },
        stream: b.stream.unwrap_or(false),
        include_usage: false,
        passthrough,
    })
}

/// `thinking` is `{"type":"enabled","budget_tokens":N}` (N ≥ 1,024), `{"type":"adaptive"}` or
/// `{"type":"disabled"}` ("Extended thinking"); other members pass through unchecked.
fn check_thinking(t: &Value) -> Result<(), ApiError> {
    match t.get("type").and_then(Value::as_str) {
        Some("enabled") => match t.get("budget_tokens").and_then(Value::as_u64) {
            Some(n) if n >= 1024 => Ok(()),
            Some(_) => Err(invalid(
                "thinking.enabled.budget_tokens",
                "Input should be greater than or equal to 1024",
            )),
            None => Err(invalid("thinking.enabled.budget_tokens", "Field required")),
        },
        Some("adaptive" | "disabled") => Ok(()),
        Some(other) => Err(invalid(
            "thinking.type",
            format!(
                "Input tag '{other}' found using 'type' does not match any of the expected tags: 'enabled', 'disabled', 'adaptive'"
            ),
        )),
        None => Err(invalid("thinking.type", "Field required")),
    }
}

/// Unknown and missing top-level fields, each named in the error.
fn check_fields(obj: &Map<String, Value>) -> Result<(), ApiError> {
    for key in obj.keys() {
        if !KNOWN.contains(&key.as_str()) && !PASSTHROUGH.contains(&key.as_str()) {
            return Err(invalid(&input::echo(key), "Extra inputs are not permitted"));
        }
    }
    match REQUIRED.iter().find(|k| !obj.contains_key(**k)) {
        Some(missing) => Err(invalid(missing, "Field required")),
        None => Ok(()),
    }
}

/// Anthropic accepts `temperature` and `top_p` in 0–1.
fn check_range(name: &str, v: Option<f64>) -> Result<(), ApiError> {
    match v {
        Some(x) if !(0.0..=1.0).contains(&x) => Err(invalid(
            name,
            format!("{x} is out of range: expected 0 to 1"),
        )),
        _ => Ok(()),
    }
}

/// The blocks of a block-list `content`, each checked for a supported `type` first.
fn blocks(content: Vec<Value>, at: &str) -> Result<Vec<Block>, ApiError> {
    content
        .into_iter()
        .enumerate()
        .map(|(j, v)| {
            let at = format!("{at}[{j}]");
            match v.get("type").and_then(Value::as_str) {
                Some(t) if BLOCK_TYPES.contains(&t) => from_value_at(v, &at),
                Some(t) => Err(invalid(
                    &format!("{at}.type"),
                    format!("content blocks of type `{t}` are not supported by Switchyard yet"),
                )),
                None => Err(invalid(&format!("{at}.type"), "Field required")),
            }
        })
        .collect()
}

/// String or block-list `content` as blocks (a string is one text block).
fn content_blocks(content: Value, at: &str) -> Result<Vec<Block>, ApiError> {
    match content {
        Value::String(text) => Ok(vec![Block::Text {
            text,
            cache_control: None,
            _citations: None,
        }]),
        Value::Array(items) => blocks(items, at),
        _ => Err(invalid(
            at,
            "Input should be a valid string or a list of content blocks",
        )),
    }
}

/// Parts as normalised content: a single text part becomes a plain string.
fn parts_content(mut parts: Vec<ContentPart>) -> Content {
    if let [ContentPart::Text { .. }] = parts.as_slice()
        && let Some(ContentPart::Text { text }) = parts.pop()
    {
        return Content::Text(text);
    }
    Content::Parts(parts)
}

/// A message with `role` and `content` and nothing else.
fn plain(role: Role, content: Option<Content>) -> Message {
    Message {
        role,
        content,
        name: None,
        tool_calls: Vec::new(),
        tool_call_id: None,
        thinking_blocks: Vec::new(),
        cache_control: None,
    }
}

/// `system` (string or text blocks, at `at`) → one `system` message (none when empty).
fn system_message(system: Value, at: &str) -> Result<Option<Message>, ApiError> {
    let mut parts = Vec::new();
    for block in content_blocks(system, at)? {
        match block {
            Block::Text { text, .. } if text.is_empty() => {}
            Block::Text { text, .. } => parts.push(ContentPart::Text { text }),
            _ => {
                return Err(invalid(at, "only text blocks are allowed in `system`"));
            }
        }
    }
    Ok((!parts.is_empty()).then(|| plain(Role::System, Some(parts_content(parts)))))
}

/// An image source (the block at `at`) → an OpenAI-style `image_url` part (base64 → `data:`
/// URL), checked by [`input::image_url`]: an allowed media type whose bytes are of that type, or
/// an http(s) URL to a public host.
fn image_part(source: ImageSource, at: &str) -> Result<ContentPart, ApiError> {
    let url = match source {
        ImageSource::Base64 { media_type, data } => {
            if input::ImageFormat::from_media_type(&media_type).is_none() {
                return Err(invalid(
                    &format!("{at}.source.media_type"),
                    format!(
                        "Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp', not `{}`",
                        input::echo(&media_type)
                    ),
                ));
            }
            let url = format!("data:{media_type};base64,{data}");
            input::image_url(&url).map_err(|e| invalid(&format!("{at}.source.data"), e))?;
            url
        }
        ImageSource::Url { url } => {
            input::image_url(&url).map_err(|e| invalid(&format!("{at}.source.url"), e))?;
            url
        }
    };
    Ok(ContentPart::ImageUrl {
        image_url: ImageUrl { url, detail: None },
    })
}

/// A `document` block as a content part: a base64 PDF → [`ContentPart::File`] (the title as
/// its file name), a `text` source → its text, a `content` source → its text blocks' text. URL
/// sources are a 400 (the gateway does not fetch documents).
fn document_part(
    source: DocumentSource,
    title: Option<String>,
    at: &str,
) -> Result<ContentPart, ApiError> {
    match source {
        DocumentSource::Base64 { media_type, data } => {
            let file_data = format!("data:{media_type};base64,{data}");
            input::file_data(&file_data).map_err(|e| invalid(&format!("{at}.source"), e))?;
            Ok(ContentPart::File {
                file: FilePart {
                    file_id: None,
                    filename: title,
                    file_data,
                    file_url: None,
                },
            })
        }
        DocumentSource::Text { media_type, data } => {
            if media_type != "text/plain" {
                return Err(invalid(
                    &format!("{at}.source.media_type"),
                    format!(
                        "Input should be 'text/plain', not `{}`",
                        input::echo(&media_type)
                    ),
                ));
            }
            Ok(ContentPart::Text { text: data })
        }
        DocumentSource::Content { content } => {
            let at = format!("{at}.source.content");
            let mut text = Vec::new();
            for (k, b) in content_blocks(content, &at)?.into_iter().enumerate() {
                match b {
                    Block::Text { text: t, .. } => text.push(t),
                    _ => {
                        return Err(invalid(
                            &format!("{at}[{k}]"),
                            "document content may only contain text blocks in Switchyard",
                        ));
                    }
                }
            }
            Ok(ContentPart::Text {
                text: text.join("\n"),
            })
        }
        DocumentSource::File { file_id } => Ok(ContentPart::File {
            file: FilePart {
                filename: title,
                file_data: String::new(),
                file_url: None,
                file_id: Some(file_id),
            },
        }),
        DocumentSource::Url { url } => {
            input::image_url(&url).map_err(|e| invalid(&format!("{at}.source.url"), e))?;
            Ok(ContentPart::File {
                file: FilePart {
                    file_id: None,
                    filename: title,
                    file_data: String::new(),
                    file_url: Some(url),
                },
            })
        }
    }
}

/// A user turn. Blocks keep their order: each `tool_result` becomes a `role: tool` message, and
/// text/image blocks between them are gathered into `user` messages at their position.
fn user_turn(content: Value, at: &str, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let at_content = format!("{at}.content");
    let blocks = content_blocks(content, &at_content)?;
    if blocks.is_empty() {
        return Err(invalid(
            &at_content,
            "user messages must have non-empty content",
        ));
    }
    let mut pending: Vec<ContentPart> = Vec::new();
    // A breakpoint on a gathered text/image block marks the end of their user message.
    let mut pending_cache: Option<Value> = None;
    let flush =
        |pending: &mut Vec<ContentPart>, cache: &mut Option<Value>, out: &mut Vec<Message>| {
            if !pending.is_empty() {
                let parts = std::mem::take(pending);
                let mut m = plain(Role::User, Some(parts_content(parts)));
                m.cache_control = cache.take();
                out.push(m);
            }
        };
    for (j, block) in blocks.into_iter().enumerate() {
        let cache = block.cache_control().cloned();
        match block {
            Block::Text { text, .. } => {
                pending.push(ContentPart::Text { text });
                pending_cache = cache.or(pending_cache);
            }
            Block::Image { source, .. } => {
                pending.push(image_part(source, &format!("{at_content}[{j}]"))?);
                pending_cache = cache.or(pending_cache);
            }
            Block::Document { source, title, .. } => {
                pending.push(document_part(source, title, &format!("{at_content}[{j}]"))?);
                pending_cache = cache.or(pending_cache);
            }
            Block::ToolResult {
                tool_use_id,
                content,
                ..
            } => {
                flush(&mut pending, &mut pending_cache, out);
                input::tool_call_id(Some(&tool_use_id))
                    .map_err(|e| invalid(&format!("{at_content}[{j}].tool_use_id"), e))?;
                let at = format!("{at_content}[{j}].content");
                let mut m = plain(Role::Tool, Some(tool_result_content(content, &at)?));
                m.tool_call_id = Some(tool_use_id);
                m.cache_control = cache;
                out.push(m);
            }
            Block::ToolUse { .. } | Block::Thinking { .. } | Block::RedactedThinking { .. } => {
                return Err(invalid(
                    &format!("{at_content}[{j}]"),
                    "`tool_use` and thinking blocks are only allowed in assistant messages",
                ));
            }
        }
    }
    flush(&mut pending, &mut pending_cache, out);
    Ok(())
}

/// `tool_result.content`: absent → empty; a string as is; text blocks joined with `\n`; with
/// images, multi-part content.
fn tool_result_content(content: Option<Value>, at: &str) -> Result<Content, ApiError> {
    let Some(content) = content.filter(|c| !c.is_null()) else {
        return Ok(Content::Text(String::new()));
    };
    let mut parts = Vec::new();
    for (j, block) in content_blocks(content, at)?.into_iter().enumerate() {
        match block {
            Block::Text { text, .. } => parts.push(ContentPart::Text { text }),
            Block::Image { source, .. } => parts.push(image_part(source, &format!("{at}[{j}]"))?),
            Block::Document { source, title, .. } => {
                parts.push(document_part(source, title, &format!("{at}[{j}]"))?)
            }
            _ => {
                return Err(invalid(
                    &format!("{at}[{j}]"),
                    "tool results may only contain text, image and document blocks",
                ));
            }
        }
    }
    if parts.iter().all(|p| matches!(p, ContentPart::Text { .. })) {
        return Ok(Content::Text(Content::Parts(parts).text()));
    }
    Ok(Content::Parts(parts))
}

/// An assistant turn: text blocks → content, `tool_use` blocks → `tool_calls` (arguments = the
/// JSON text of `input`). A trailing assistant turn (prefill) goes through as is.
fn assistant_turn(content: Value, at: &str) -> Result<Message, ApiError> {
    let at_content = format!("{at}.content");
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut thinking = Vec::new();
    let mut cache_control = None;
    for (j, block) in content_blocks(content, &at_content)?
        .into_iter()
        .enumerate()
    {
        cache_control = block.cache_control().cloned().or(cache_control);
        match block {
            Block::Text { text, .. } => parts.push(ContentPart::Text { text }),
            Block::ToolUse {
                id,
                name,
                input,
                caller,
                ..
            } => {
                let direct = caller
                    .as_ref()
                    .is_none_or(|c| c.is_null() || c["type"] == "direct");
                if !direct {
                    return Err(invalid(
                        &format!("{at_content}[{j}].caller"),
                        "only direct tool calls are supported by Switchyard yet",
                    ));
                }
                if !input.is_object() {
                    return Err(invalid(
                        &format!("{at_content}[{j}].input"),
                        "Input should be a valid dictionary",
                    ));
                }
                input::tool_name(&name)
                    .map_err(|e| invalid(&format!("{at_content}[{j}].name"), e))?;
                input::tool_call_id(Some(&id))
                    .map_err(|e| invalid(&format!("{at_content}[{j}].id"), e))?;
                calls.push(ToolCall {
                    id,
                    kind: "function".into(),
                    function: FunctionCall {
                        name,
                        arguments: input.to_string(),
                    },
                });
            }
            Block::Thinking {
                thinking: text,
                signature,
            } => thinking.push(ThinkingBlock::Thinking {
                thinking: text,
                signature,
            }),
            Block::RedactedThinking { data } => {
                thinking.push(ThinkingBlock::RedactedThinking { data });
            }
            Block::Image { .. } | Block::Document { .. } | Block::ToolResult { .. } => {
                return Err(invalid(
                    &format!("{at_content}[{j}]"),
                    "assistant messages may only contain text, tool_use and thinking blocks",
                ));
            }
        }
    }
    let content = match (parts.is_empty(), calls.is_empty()) {
        (true, false) => None,
        (true, true) => Some(Content::Text(String::new())),
        (false, _) => Some(parts_content(parts)),
    };
    let content = match content {
        Some(Content::Text(t)) if t.is_empty() && !thinking.is_empty() => None,
        c => c,
    };
    let mut m = plain(Role::Assistant, content);
    m.tool_calls = calls;
    m.thinking_blocks = thinking;
    m.cache_control = cache_control;
    Ok(m)
}

/// `{name, description, input_schema}` → a function tool. Server tools (a `type` other than
/// `custom`, e.g. `web_search_20250305`, `bash_20250124`) have no normalised form: `None`, and
/// they reach an Anthropic upstream only, in the raw `tools` of the passthrough (dropped for
/// other providers; their result blocks are not part of the normalised answer).
fn tool(v: Value, at: &str) -> Result<Option<Tool>, ApiError> {
    match v.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "custom" => {}
        Some(Value::String(_)) => return Ok(None),
        Some(t) => {
            return Err(invalid(
                &format!("{at}.type"),
                format!("Input should be a valid string, not {t}"),
            ));
        }
    }
    let t: InTool = from_value_at(v, at)?;
    input::tool_name(&t.name).map_err(|e| invalid(&format!("{at}.name"), e))?;
    if !t.input_schema.is_object() {
        return Err(invalid(
            &format!("{at}.input_schema"),
            "Input should be a valid dictionary",
        ));
    }
    input::tool_parameters(Some(&t.input_schema))
        .map_err(|e| invalid(&format!("{at}.input_schema"), e))?;
    Ok(Some(Tool {
        kind: "function".into(),
        function: FunctionDef {
            name: t.name,
            description: t.description,
            parameters: Some(t.input_schema),
            strict: t.strict,
        },
    }))
}

/// Anthropic `tool_choice` → OpenAI-shaped `tool_choice` and `parallel_tool_calls`:
/// `auto`→`"auto"`, `any`→`"required"`, `tool`→named function, `none`→`"none"`;
/// `disable_parallel_tool_use: true` → `parallel_tool_calls: false`. Without tools, `auto` and
/// `none` mean nothing and are not sent; `any` and `tool` are a 400.
fn tool_choice(
    choice: Option<InToolChoice>,
    has_tools: bool,
) -> Result<(Option<Value>, Option<bool>), ApiError> {
    let (value, disable) = match choice {
        None => return Ok((None, None)),
        Some(InToolChoice::Auto {
            disable_parallel_tool_use,
        }) => (Value::from("auto"), disable_parallel_tool_use),
        Some(InToolChoice::Any {
            disable_parallel_tool_use,
        }) => (Value::from("required"), disable_parallel_tool_use),
        Some(InToolChoice::Tool {
            name,
            disable_parallel_tool_use,
        }) => (
            serde_json::json!({"type": "function", "function": {"name": name}}),
            disable_parallel_tool_use,
        ),
        Some(InToolChoice::NoTool {}) => (Value::from("none"), None),
    };
    if !has_tools {
        if value == "auto" || value == "none" {
            return Ok((None, None));
        }
        return Err(invalid(
            "tool_choice",
            "tool_choice requires `tools` to be provided",
        ));
    }
    let parallel = (disable == Some(true)).then_some(false);
    Ok((Some(value), parallel))
}
