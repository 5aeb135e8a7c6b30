//! Anthropic Messages API adapter: `POST {base_url}/messages`, with `"stream": true` for streaming
//! clients; a non-streaming client's call is not streamed and its `message` object is read whole
//! (any `application/json` answer is, see [`parse_message`]).
//!
//! Request translation follows the Anthropic API reference, "Messages": instructions go in the
//! top-level `system` field, turns strictly alternate `user`/`assistant`, tool calls and results are
//! `tool_use` / `tool_result` content blocks, `tool_choice` is `auto|any|tool|none`, `max_tokens` is
//! required. Stream translation follows "Streaming Messages": `message_start`, then per content block
//! `content_block_start` / `content_block_delta`* / `content_block_stop`, then `message_delta`
//! (stop reason, cumulative usage) and `message_stop`; `ping` may appear anywhere; an `error` event
//! (e.g. `overloaded_error`) may end the stream; unknown event types must be ignored.

use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};
use switchyard_schemas::config::{ProviderKind, TargetConfig};
use switchyard_schemas::request::{Content, Message, Passthrough, Role, ThinkingBlock, ToolCall};
use switchyard_schemas::{ChatRequest, ErrorInfo};

use crate::provider::{Call, EventStream, Provider, Upstream, send_checked};

/// Value of the `anthropic-version` header (Anthropic API reference, "Versions").
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `max_tokens` sent when the client gave none; Anthropic requires the field ("Messages").
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// Adapter for the Anthropic Messages API (`{base_url}/messages`, `x-api-key` auth,
/// `anthropic-version: 2023-06-01`). Stateless; streams upstream for streaming clients only.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnthropicProvider;

impl Provider for AnthropicProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Anthropic
    }

    fn stream_chat(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<EventStream> {
        let (http, target, base_url) = (up.http, up.target, up.base_url);
        let body = build_request(target, req).map(|body| body.to_string());
        // The synthetic JSON tool is in the request exactly when response_format asks for JSON.
        let structured = matches!(structured::json_tool(req), Ok(Some(_)));
        let builder = post(
            http,
            target,
            req,
            &format!("{}/messages", base_url.trim_end_matches('/')),
        );
        Box::pin(async move {
            let resp = send_checked(builder?.body(body?)).await?;
            let parse = if structured {
                parse_structured_message
            } else {
                parse_message
            };
            let translator = AnthropicTranslator::new(structured);
            Ok(read_answer(resp, parse, translator))
        })
    }

    /// `POST {base_url}/messages/count_tokens` (Anthropic API reference, "Count Message tokens"):
    /// the request's body reduced to the fields that endpoint takes ([`COUNT_FIELDS`]), with the
    /// same headers; the answer's `input_tokens`.
    fn count_tokens(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<u64> {
        let (http, target, base_url) = (up.http, up.target, up.base_url);
        let body = build_request(target, req).map(|mut body| {
            if let Some(o) = body.as_object_mut() {
                o.retain(|k, _| COUNT_FIELDS.contains(&k.as_str()));
            }
            body.to_string()
        });
        let url = format!("{}/messages/count_tokens", base_url.trim_end_matches('/'));
        let builder = post(http, target, req, &url);
        Box::pin(async move {
            let resp = send_checked(builder?.body(body?)).await?;
            let v: Value = resp
                .json()
                .await
                .map_err(|e| protocol(format!("unreadable count_tokens answer: {e}")))?;
            v.get("input_tokens")
                .and_then(Value::as_u64)
                .ok_or_else(|| protocol("count_tokens answer without `input_tokens`"))
        })
    }
}

/// Top-level fields `POST /v1/messages/count_tokens` accepts (Anthropic API reference, "Count
/// Message tokens"); the rest of a Messages body (`max_tokens`, sampling, `stream`, …) is not
/// sent there.
pub const COUNT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "mcp_servers",
    "context_management",
    "output_config",
    "output_format",
];

/// A JSON `POST` to `url` with Anthropic's headers: `anthropic-version`, `x-api-key` when the
/// target has a key, and the passthrough headers (`anthropic-beta`).
fn post(
    http: &reqwest::Client,
    target: &TargetConfig,
    req: &ChatRequest,
    url: &str,
) -> Result<reqwest::RequestBuilder, ErrorInfo> {
    let mut builder = http
        .post(url)
        .header("anthropic-version", ANTHROPIC_VERSION)
        .header(CONTENT_TYPE, "application/json");
    if let Some(extra) = req.passthrough.get(Passthrough::ANTHROPIC) {
        for (name, value) in &extra.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
    }
    if let Some(key) = api_key_header(target)? {
        builder = builder.header("x-api-key", key);
    }
    Ok(builder)
}

use crate::providers::shared::{
    PartCodec, api_key_header, bad_message, invalid, protocol, push_turn, read_answer,
    without_nulls,
};

mod stream;
pub mod structured;

#[cfg(test)]
use stream::Item;
pub use stream::{AnthropicTranslator, parse_message, parse_structured_message};

/// Translates a normalised request into an Anthropic Messages request body (JSON object).
///
/// Mapping (Anthropic API reference, "Messages"): `system`/`developer` messages → top-level `system`
/// joined with `"\n\n"`; `tool` messages → `tool_result` blocks in a `user` turn; consecutive turns of
/// one role merged (Anthropic requires alternation); assistant `tool_calls` → `tool_use` blocks;
/// `max_tokens` defaults to [`DEFAULT_MAX_TOKENS`]; `stop` → `stop_sequences`; `user` →
/// `metadata.user_id`; `"stream": true` when the client streams. Errors (class `invalid_request`, with `param`):
/// `n` > 1, unparsable tool-call arguments, unsupported image URLs, and the `response_format`
/// errors of [`structured::json_tool`]. `response_format` `json_schema` / `json_object` becomes
/// the synthetic [`structured::JSON_TOOL`] (see [`structured`] for the rule).
/// `seed`, `presence_penalty` and `frequency_penalty` have no Anthropic equivalent and are not sent;
/// `tool_choice` is only sent together with `tools`. `top_k` is sent as is; an assistant
/// message's `thinking_blocks` go first in its content, unchanged (signatures included); a
/// message's `cache_control` goes on its last block. Without a raw `system`, system messages are
/// joined into one string (their `cache_control` is not kept).
///
/// The [`Passthrough::ANTHROPIC`] fields the Anthropic front door carried (`thinking`,
/// `context_management`, `output_config`, `service_tier`, `metadata`, the raw `system` and
/// `tools` with their `cache_control`, …) are sent unchanged and win over the translated ones;
/// with a raw `system`, the leading system message it became is not sent twice, while later
/// system messages are appended to it as text blocks. Its headers (`anthropic-beta`) are sent too.
///
/// `reasoning_effort` (OpenAI front door) without a passthrough `thinking` becomes
/// `thinking: {"type":"enabled","budget_tokens":B}` with B = 1,024 (`low`), 4,096 (`medium`),
/// 16,384 (`high`), 32,768 (`xhigh`), capped at `max_tokens` − 1 (as in OpenAI,
/// `max_tokens` bounds reasoning and answer together; unset, `max_tokens` becomes
/// B + [`DEFAULT_MAX_TOKENS`]); `none`, `minimal`, a cap below Anthropic's minimum of 1,024, or a
/// forced tool choice (which thinking does not allow) send no `thinking`. With thinking on,
/// `temperature`, `top_p` and `top_k` are not sent (Anthropic allows no changes to them then).
pub fn build_request(target: &TargetConfig, req: &ChatRequest) -> Result<Value, ErrorInfo> {
    let p = &req.params;
    if let Some(n) = p.n.filter(|n| *n > 1) {
        return Err(invalid(
            "n",
            format!("n={n} is not supported by Anthropic (one choice only)"),
        ));
    }
    let json_tool = structured::json_tool(req)?;
    let mut system: Vec<String> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, m) in req.messages.iter().enumerate() {
        match m.role {
            Role::System | Role::Developer => {
                let text = m.content.as_ref().map(Content::text).unwrap_or_default();
                if !text.is_empty() {
                    system.push(text);
                }
            }
            Role::User => {
                let blocks = cached(PARTS.blocks(m.content.as_ref(), i)?, m);
                push_turn(&mut turns, "user", blocks);
            }
            Role::Assistant => {
                let mut blocks: Vec<Value> = m
                    .thinking_blocks
                    .iter()
                    .filter_map(thinking_block)
                    .collect();
                blocks.extend(PARTS.blocks(m.content.as_ref(), i)?);
                for call in &m.tool_calls {
                    blocks.push(tool_use_block(call, i)?);
                }
                push_turn(&mut turns, "assistant", cached(blocks, m));
            }
            Role::Tool => push_turn(
                &mut turns,
                "user",
                cached(vec![tool_result_block(m, i)?], m),
            ),
        }
    }
    let json_choice = match &json_tool {
        Some(_) if req.tools.is_empty() => Some(structured::tool_choice(None, false)),
        Some(_) => {
            let user = tool_choice(req.tool_choice.as_ref(), p.parallel_tool_calls)?;
            Some(structured::tool_choice(user, true))
        }
        None => None,
    };
    if let Some((_, true)) = json_choice {
        system.push(structured::JSON_INSTRUCTION.to_owned());
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, content)| json!({ "role": role, "content": content }))
        .collect();
    let mut body = without_nulls(json!({
        "model": target.upstream_model,
        "max_tokens": p.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "system": (!system.is_empty()).then(|| system.join("\n\n")),
        "messages": messages,
        "stream": req.stream.then_some(true),
        "temperature": p.temperature,
        "top_p": p.top_p,
        "stop_sequences": (!p.stop.is_empty()).then_some(&p.stop),
        "metadata": p.user.as_ref().map(|u| json!({ "user_id": u })),
        "top_k": p.top_k,
    }));
    if !req.tools.is_empty() || json_tool.is_some() {
        let default_schema = json!({ "type": "object", "properties": {} });
        let tools = req.tools.iter().map(|t| {
            let f = &t.function;
            without_nulls(json!({
                "name": f.name,
                "description": f.description,
                "input_schema": f.parameters.as_ref().unwrap_or(&default_schema),
            }))
        });
        let tools: Vec<Value> = tools.chain(json_tool).collect();
        let choice = match json_choice {
            Some((choice, _)) => Some(choice),
            None => tool_choice(req.tool_choice.as_ref(), p.parallel_tool_calls)?,
        };
        if let Some(obj) = body.as_object_mut() {
            obj.insert("tools".into(), Value::Array(tools));
            if let Some(choice) = choice {
                obj.insert("tool_choice".into(), choice);
            }
        }
    }
    if let Some(obj) = body.as_object_mut() {
        apply_passthrough(obj, req);
        map_reasoning_effort(obj, req);
    }
    Ok(body)
}

/// `blocks` with the message's `cache_control` breakpoint on the last one (not on a thinking
/// block, which takes none).
fn cached(mut blocks: Vec<Value>, m: &Message) -> Vec<Value> {
    if let (Some(cache), Some(last)) = (&m.cache_control, blocks.last_mut())
        && !matches!(
            last["type"].as_str(),
            Some("thinking" | "redacted_thinking")
        )
        && let Some(o) = last.as_object_mut()
    {
        o.insert("cache_control".into(), cache.clone());
    }
    blocks
}

/// A normalised thinking block as an Anthropic content block, unchanged; an OpenAI encrypted
/// `reasoning` item has none (dropped).
fn thinking_block(b: &ThinkingBlock) -> Option<Value> {
    Some(match b {
        ThinkingBlock::Thinking {
            thinking,
            signature,
        } => without_nulls(
            json!({ "type": "thinking", "thinking": thinking, "signature": signature }),
        ),
        ThinkingBlock::RedactedThinking { data } => {
            json!({ "type": "redacted_thinking", "data": data })
        }
        ThinkingBlock::Reasoning { .. } => return None,
    })
}

/// The Anthropic front door's own fields, over the translated ones (see [`build_request`]).
fn apply_passthrough(obj: &mut serde_json::Map<String, Value>, req: &ChatRequest) {
    let Some(extra) = req.passthrough.get(Passthrough::ANTHROPIC) else {
        return;
    };
    for (k, v) in &extra.body {
        if k == "system" {
            // Later system messages (Claude Code sends them mid-conversation) follow the raw ones.
            let mut blocks = match v {
                Value::String(t) => vec![json!({ "type": "text", "text": t })],
                Value::Array(a) => a.clone(),
                _ => Vec::new(),
            };
            let later = req
                .messages
                .iter()
                .filter(|m| matches!(m.role, Role::System | Role::Developer))
                .skip(1)
                .filter_map(|m| Some((m.content.as_ref()?.text(), m)))
                .filter(|(t, _)| !t.is_empty());
            blocks.extend(
                later.map(|(t, m)| cached(vec![json!({ "type": "text", "text": t })], m).remove(0)),
            );
            obj.insert("system".into(), Value::Array(blocks));
            continue;
        }
        obj.insert(k.clone(), v.clone());
    }
}

/// `reasoning_effort` → a `thinking` budget, when no `thinking` was given (see [`build_request`]).
fn map_reasoning_effort(obj: &mut serde_json::Map<String, Value>, req: &ChatRequest) {
    if obj.contains_key("thinking") {
        return;
    }
    let budget: u32 = match req.params.reasoning_effort.as_deref() {
        Some("low") => 1024,
        Some("medium") => 4096,
        Some("high") => 16_384,
        Some("xhigh") => 32_768,
        _ => return,
    };
    let forced = obj
        .get("tool_choice")
        .and_then(|c| c.get("type"))
        .is_some_and(|t| t == "any" || t == "tool");
    let (budget, max_tokens) = match req.params.max_tokens {
        Some(max) => (budget.min(max.saturating_sub(1)), max),
        None => (budget, budget + DEFAULT_MAX_TOKENS),
    };
    if forced || budget < 1024 {
        return;
    }
    obj.insert("max_tokens".into(), json!(max_tokens));
    obj.insert(
        "thinking".into(),
        json!({ "type": "enabled", "budget_tokens": budget }),
    );
    for k in ["temperature", "top_p", "top_k"] {
        obj.remove(k);
    }
}

/// Anthropic's content blocks: `{"type":"text"}`, `image` and `document`.
const PARTS: PartCodec = PartCodec {
    text: |t| json!({ "type": "text", "text": t }),
    image: image_block,
    file: document_block,
};

/// `data:<media>;base64,<data>` → a base64 image source; `http(s)://` → a URL image source
/// (`data:` syntax: [`switchyard_schemas::input::parse_data_url`]).
fn image_block(url: &str, i: usize) -> Result<Value, ErrorInfo> {
    if switchyard_schemas::input::is_data_url(url) {
        return match switchyard_schemas::input::parse_data_url(url) {
            Some(d) => Ok(json!({
                "type": "image",
                "source": { "type": "base64", "media_type": d.media_type, "data": d.data },
            })),
            None => Err(bad_message(
                i,
                "image data URLs must be data:<media type>;base64,<data>",
            )),
        };
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(json!({ "type": "image", "source": { "type": "url", "url": url } }));
    }
    Err(bad_message(i, "image URLs must be http(s) or data: URLs"))
}

/// An inline document → `{"type":"document","source":{"type":"base64","media_type","data"},
/// "title"}` (Anthropic API reference, "PDF support"; the file name as the title).
fn document_block(
    file: &switchyard_schemas::request::FilePart,
    i: usize,
) -> Result<Value, ErrorInfo> {
    // Anthropic "PDF support": a `url` source is fetched by Anthropic, not by the gateway.
    let source = match (&file.file_url, &file.file_id) {
        // Anthropic Files API (beta): the client sends the `anthropic-beta` header with it.
        (_, Some(id)) => json!({ "type": "file", "file_id": id }),
        (Some(url), None) => json!({ "type": "url", "url": url }),
        (None, None) => {
            let d =
                switchyard_schemas::input::parse_data_url(&file.file_data).ok_or_else(|| {
                    bad_message(i, "file data must be data:<media type>;base64,<data>")
                })?;
            json!({ "type": "base64", "media_type": d.media_type, "data": d.data })
        }
    };
    let mut block = json!({ "type": "document", "source": source });
    if let Some(name) = &file.filename {
        block["title"] = json!(name);
    }
    Ok(block)
}

/// An assistant tool call → `{"type":"tool_use","id","name","input"}` (input = parsed arguments).
fn tool_use_block(call: &ToolCall, i: usize) -> Result<Value, ErrorInfo> {
    let input = crate::providers::shared::tool_call_input(call, i)?;
    Ok(json!({ "type": "tool_use", "id": call.id, "name": call.function.name, "input": input }))
}

/// A `role: tool` message → `{"type":"tool_result","tool_use_id","content"}`.
fn tool_result_block(m: &Message, i: usize) -> Result<Value, ErrorInfo> {
    let id = m.tool_call_id.as_deref().filter(|id| !id.is_empty());
    let id = id.ok_or_else(|| bad_message(i, "role `tool` needs tool_call_id"))?;
    let mut block = json!({ "type": "tool_result", "tool_use_id": id });
    let content = match &m.content {
        Some(Content::Text(t)) if !t.is_empty() => Some(json!(t)),
        Some(parts @ Content::Parts(_)) => {
            Some(Value::Array(PARTS.blocks(Some(parts), i)?)).filter(|v| v != &json!([]))
        }
        _ => None,
    };
    if let (Some(content), Some(obj)) = (content, block.as_object_mut()) {
        obj.insert("content".into(), content);
    }
    Ok(block)
}

/// OpenAI `tool_choice` (+ `parallel_tool_calls`) → Anthropic `tool_choice`:
/// `auto`→`{"type":"auto"}`, `none`→`{"type":"none"}`, `required`→`{"type":"any"}`,
/// `{"type":"function","function":{"name"}}`→`{"type":"tool","name"}`;
/// `parallel_tool_calls: false` adds `disable_parallel_tool_use: true` (not on `none`).
fn tool_choice(choice: Option<&Value>, parallel: Option<bool>) -> Result<Option<Value>, ErrorInfo> {
    let bad = || {
        invalid(
            "tool_choice",
            "tool_choice must be auto, none, required or a named function",
        )
    };
    let mut out = match choice {
        None if parallel == Some(false) => json!({ "type": "auto" }),
        None => return Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => json!({ "type": "auto" }),
            "none" => json!({ "type": "none" }),
            "required" => json!({ "type": "any" }),
            _ => return Err(bad()),
        },
        Some(v @ Value::Object(_)) => {
            let name = v.pointer("/function/name").and_then(Value::as_str);
            let name = name.ok_or_else(bad)?;
            json!({ "type": "tool", "name": name })
        }
        Some(_) => return Err(bad()),
    };
    if let Some(obj) = out.as_object_mut().filter(|o| o["type"] != "none")
        && parallel == Some(false)
    {
        obj.insert("disable_parallel_tool_use".into(), json!(true));
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests;
