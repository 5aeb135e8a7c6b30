//! Parses and validates an Anthropic `POST /v1/messages` body into the normalised request
//! ([`Inbound`], routed exactly like the OpenAI front door's).
//!
//! Reference: Anthropic API reference, "Messages" (create a Message): `model`, `max_tokens`
//! (required), `messages` (`user`/`assistant` turns, string or content-block content), top-level
//! `system` (string or text blocks), `tools` (`name`, `description`, `input_schema`), `tool_choice`
//! (`auto|any|tool|none`, `disable_parallel_tool_use`), `temperature`, `top_p`, `top_k`,
//! `stop_sequences`, `stream`, `metadata.user_id`, `thinking`. Content blocks: "Vision" (`image`
//! with a `base64` or `url` source) and "Tool use" (`tool_use` in assistant turns, `tool_result`
//! in user turns).
//!
//! Unknown fields are a 400 naming the field (Anthropic: "Extra inputs are not permitted");
//! parameters Anthropic defines that the normalised request cannot carry are a 400 saying so, never
//! a silent drop. Accepted and ignored because they change nothing about the answer:
//! `cache_control` (a prompt-caching hint, top level and on blocks and tools), `citations` on input
//! text blocks, `eager_input_streaming` on tools (a streaming-granularity hint),
//! `caller: {"type":"direct"}` on `tool_use` blocks, and `thinking: {"type":"disabled"}`.

use crate::error::ApiError;
use crate::route::Inbound;
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::{Map, Value};
use switchyard_schemas::request::{
    Content, ContentPart, FunctionCall, FunctionDef, ImageUrl, Message, Role, SamplingParams, Tool,
    ToolCall,
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
    "tools",
    "tool_choice",
    "thinking",
    "cache_control",
];

/// Fields Anthropic defines that the normalised request has no place for yet: a clear 400.
const UNSUPPORTED: &[&str] = &[
    "top_k",
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
    "output_config",
    "output_format",
    "inference_geo",
];

/// Fields Anthropic requires (the API answers "<field>: Field required").
const REQUIRED: &[&str] = &["model", "max_tokens", "messages"];

/// Content block types Switchyard translates.
const BLOCK_TYPES: &[&str] = &["text", "image", "tool_use", "tool_result"];

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
    tools: Option<Vec<Value>>,
    tool_choice: Option<InToolChoice>,
    thinking: Option<Value>,
    #[serde(default, rename = "cache_control")]
    _cache_control: Option<IgnoredAny>,
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    user_id: Option<String>,
}

/// One input content block ("Messages", `content` block types).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Block {
    Text {
        text: String,
        #[serde(default, rename = "cache_control")]
        _cache_control: Option<IgnoredAny>,
        #[serde(default, rename = "citations")]
        _citations: Option<IgnoredAny>,
    },
    Image {
        source: ImageSource,
        #[serde(default, rename = "cache_control")]
        _cache_control: Option<IgnoredAny>,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
        #[serde(default)]
        caller: Option<Value>,
        #[serde(default, rename = "cache_control")]
        _cache_control: Option<IgnoredAny>,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<Value>,
        /// No normalised equivalent: the result text (which states the failure) goes through.
        #[serde(default, rename = "is_error")]
        _is_error: Option<bool>,
        #[serde(default, rename = "cache_control")]
        _cache_control: Option<IgnoredAny>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InTool {
    name: String,
    description: Option<String>,
    input_schema: Value,
    #[serde(rename = "type")]
    _kind: Option<IgnoredAny>,
    strict: Option<bool>,
    #[serde(default, rename = "cache_control")]
    _cache_control: Option<IgnoredAny>,
    #[serde(default, rename = "eager_input_streaming")]
    _eager_input_streaming: Option<IgnoredAny>,
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
    let root: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    })?;
    let Value::Object(obj) = root else {
        return Err(ApiError::invalid(
            "The request body must be a JSON object.",
            None,
        ));
    };
    check_fields(&obj)?;
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
    if let Some(t) = &b.thinking
        && t.get("type").and_then(Value::as_str) != Some("disabled")
    {
        return Err(invalid(
            "thinking",
            "extended thinking is not supported by Switchyard yet",
        ));
    }
    let mut messages = Vec::with_capacity(b.messages.len() + 1);
    if let Some(system) = b.system {
        messages.extend(system_message(system)?);
    }
    for (i, m) in b.messages.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        match m.role {
            InRole::User => user_turn(m.content, &at, &mut messages)?,
            InRole::Assistant => messages.push(assistant_turn(m.content, &at)?),
        }
    }
    let tools = b
        .tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| tool(t, &format!("tools[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let (tool_choice, parallel_tool_calls) = tool_choice(b.tool_choice, !tools.is_empty())?;
    Ok(Inbound {
        model: b.model,
        messages,
        tools,
        tool_choice,
        params: SamplingParams {
            temperature: b.temperature,
            top_p: b.top_p,
            max_tokens: Some(b.max_tokens),
            stop: b.stop_sequences.unwrap_or_default(),
            parallel_tool_calls,
            user: b.metadata.and_then(|m| m.user_id),
            ..SamplingParams::default()
        },
        stream: b.stream.unwrap_or(false),
        include_usage: false,
    })
}

/// Unknown, unsupported and missing top-level fields, each named in the error.
fn check_fields(obj: &Map<String, Value>) -> Result<(), ApiError> {
    for key in obj.keys() {
        if UNSUPPORTED.contains(&key.as_str()) {
            return Err(invalid(
                key,
                "this parameter is not supported by Switchyard yet",
            ));
        }
        if !KNOWN.contains(&key.as_str()) {
            return Err(invalid(key, "Extra inputs are not permitted"));
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
            _cache_control: None,
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
    }
}

/// `system` (string or text blocks) → one leading `system` message (none when empty).
fn system_message(system: Value) -> Result<Option<Message>, ApiError> {
    let mut parts = Vec::new();
    for block in content_blocks(system, "system")? {
        match block {
            Block::Text { text, .. } if text.is_empty() => {}
            Block::Text { text, .. } => parts.push(ContentPart::Text { text }),
            _ => {
                return Err(invalid(
                    "system",
                    "only text blocks are allowed in `system`",
                ));
            }
        }
    }
    Ok((!parts.is_empty()).then(|| plain(Role::System, Some(parts_content(parts)))))
}

/// An image source → an OpenAI-style `image_url` part (base64 → `data:` URL).
fn image_part(source: ImageSource) -> ContentPart {
    let url = match source {
        ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        ImageSource::Url { url } => url,
    };
    ContentPart::ImageUrl {
        image_url: ImageUrl { url, detail: None },
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
    let flush = |pending: &mut Vec<ContentPart>, out: &mut Vec<Message>| {
        if !pending.is_empty() {
            let parts = std::mem::take(pending);
            out.push(plain(Role::User, Some(parts_content(parts))));
        }
    };
    for (j, block) in blocks.into_iter().enumerate() {
        match block {
            Block::Text { text, .. } => pending.push(ContentPart::Text { text }),
            Block::Image { source, .. } => pending.push(image_part(source)),
            Block::ToolResult {
                tool_use_id,
                content,
                ..
            } => {
                flush(&mut pending, out);
                let at = format!("{at_content}[{j}].content");
                let mut m = plain(Role::Tool, Some(tool_result_content(content, &at)?));
                m.tool_call_id = Some(tool_use_id);
                out.push(m);
            }
            Block::ToolUse { .. } => {
                return Err(invalid(
                    &format!("{at_content}[{j}]"),
                    "`tool_use` blocks are only allowed in assistant messages",
                ));
            }
        }
    }
    flush(&mut pending, out);
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
            Block::Image { source, .. } => parts.push(image_part(source)),
            _ => {
                return Err(invalid(
                    &format!("{at}[{j}]"),
                    "tool results may only contain text and image blocks",
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
    for (j, block) in content_blocks(content, &at_content)?
        .into_iter()
        .enumerate()
    {
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
                calls.push(ToolCall {
                    id,
                    kind: "function".into(),
                    function: FunctionCall {
                        name,
                        arguments: input.to_string(),
                    },
                });
            }
            Block::Image { .. } | Block::ToolResult { .. } => {
                return Err(invalid(
                    &format!("{at_content}[{j}]"),
                    "assistant messages may only contain text and tool_use blocks",
                ));
            }
        }
    }
    let content = match (parts.is_empty(), calls.is_empty()) {
        (true, false) => None,
        (true, true) => Some(Content::Text(String::new())),
        (false, _) => Some(parts_content(parts)),
    };
    let mut m = plain(Role::Assistant, content);
    m.tool_calls = calls;
    Ok(m)
}

/// `{name, description, input_schema}` → a function tool; server tools (any `type` other than
/// `custom`) are not supported.
fn tool(v: Value, at: &str) -> Result<Tool, ApiError> {
    match v.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "custom" => {}
        Some(t) => {
            return Err(invalid(
                &format!("{at}.type"),
                format!("tool type {t} is not supported by Switchyard yet (only custom tools)"),
            ));
        }
    }
    let t: InTool = from_value_at(v, at)?;
    Ok(Tool {
        kind: "function".into(),
        function: FunctionDef {
            name: t.name,
            description: t.description,
            parameters: Some(t.input_schema),
            strict: t.strict,
        },
    })
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
