//! Anthropic Messages wire format: `Message` objects, stream events, errors.

use bytes::Bytes;
use serde_json::{Value, json};

use super::behaviour::{
    Generation, Output, RequestInfo, Usage, content_words, messages_words, model_and_stream,
    names_at,
};
use super::wire::{Item, Script, SseFormat};

/// Reads the fields the mock needs from a messages request.
pub(crate) fn request_info(body: &Value) -> Result<RequestInfo, String> {
    if !body.get("messages").is_some_and(Value::is_array) {
        return Err("messages: Field required".to_string());
    }
    let Some(max_tokens) = body.get("max_tokens").and_then(Value::as_u64) else {
        return Err("max_tokens: Field required".to_string());
    };
    let tool_names = names_at(body.get("tools"), "/name");
    let system_words = body.get("system").map_or(0, content_words);
    let (model, stream) = model_and_stream(body);
    Ok(RequestInfo {
        model,
        stream,
        include_usage: true,
        max_tokens: Some(max_tokens),
        tool_names: tool_names.clone(),
        prompt_words: messages_words(body) + system_words,
        n: 1,
        forced_tool: body
            .get("tool_choice")
            .filter(|c| c.get("type").and_then(Value::as_str) == Some("tool"))
            .and_then(|c| c.get("name"))
            .and_then(Value::as_str)
            .filter(|name| tool_names.iter().any(|t| t == name))
            .map(str::to_string),
        ..RequestInfo::default()
    })
}

/// `(type, default message)` of an Anthropic error for an HTTP status.
fn error_kind(status: u16) -> (&'static str, &'static str) {
    match status {
        401 => ("authentication_error", "invalid x-api-key (mock)"),
        402 => ("billing_error", "Your credit balance is too low (mock)."),
        403 => (
            "permission_error",
            "Your API key does not have permission to use the specified resource (mock).",
        ),
        404 => (
            "not_found_error",
            "The requested resource was not found (mock).",
        ),
        413 => (
            "request_too_large",
            "Request exceeds the maximum allowed size (mock).",
        ),
        429 => (
            "rate_limit_error",
            "Number of requests has exceeded your rate limit (mock).",
        ),
        400..=499 => ("invalid_request_error", "Invalid request (mock)."),
        504 => ("timeout_error", "Request timed out (mock)."),
        529 => ("overloaded_error", "Overloaded"),
        _ => ("api_error", "Internal server error (mock)"),
    }
}

/// `{"type":"error","error":{"type","message"}}` for an HTTP status.
pub(crate) fn error_body(status: u16, message: Option<&str>) -> Value {
    let (kind, default) = error_kind(status);
    error_object(kind, message.unwrap_or(default))
}

fn error_object(kind: &str, message: &str) -> Value {
    json!({ "type": "error", "error": { "type": kind, "message": message } })
}

/// Anthropic usage: `input_tokens` excludes cache reads.
fn usage(u: Usage, output_tokens: u64) -> Value {
    json!({
        "input_tokens": u.prompt.saturating_sub(u.cached),
        "output_tokens": output_tokens,
        "cache_read_input_tokens": u.cached,
        "cache_creation_input_tokens": 0,
    })
}

fn stop_reason(g: &Generation) -> &str {
    g.finish_word("max_tokens", "end_turn", "tool_use")
}

/// Tool use id of the `i`-th call.
fn tool_id(key: &str) -> String {
    format!("toolu_mock_{key}")
}

fn message_object(
    id: &str,
    info: &RequestInfo,
    content: Value,
    stop: Value,
    usage: Value,
) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": info.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage,
    })
}

/// The non-streaming `Message` object.
pub(crate) fn message(id: &str, info: &RequestInfo, g: &Generation) -> Value {
    let content = match &g.output {
        Output::Text { chunks, .. } => json!([{ "type": "text", "text": chunks.concat() }]),
        Output::Tools(calls) => Value::Array(
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let input: Value =
                        serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
                    json!({ "type": "tool_use", "id": tool_id(&c.key(i)), "name": c.name, "input": input })
                })
                .collect(),
        ),
    };
    message_object(
        id,
        info,
        content,
        json!(stop_reason(g)),
        g.raw_usage
            .clone()
            .unwrap_or_else(|| usage(g.usage, g.usage.completion)),
    )
}

fn event(fmt: SseFormat, value: &Value) -> Bytes {
    let name = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    fmt.event(name, &value.to_string())
}

/// The SSE events of a streamed answer.
pub(crate) fn stream_script(
    id: &str,
    info: &RequestInfo,
    g: &Generation,
    fmt: SseFormat,
) -> Script {
    // A given usage object: `message_start` carries it with at most 1 output token (as
    // Anthropic does), `message_delta` carries it whole (its counts are cumulative).
    let start_usage = match &g.raw_usage {
        Some(raw) => {
            let mut u = raw.clone();
            let out = raw
                .get("output_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            u["output_tokens"] = json!(out.min(1));
            u
        }
        None => usage(g.usage, g.usage.completion.min(1)),
    };
    let start = json!({
        "type": "message_start",
        "message": message_object(id, info, json!([]), Value::Null, start_usage),
    });
    let ping = event(fmt, &json!({ "type": "ping" }));
    let mut body = Vec::new();
    let block_stop = |index: usize| {
        Item::Frame(event(
            fmt,
            &json!({ "type": "content_block_stop", "index": index }),
        ))
    };
    match &g.output {
        Output::Text { chunks, .. } => {
            let block = json!({ "type": "text", "text": "" });
            body.push(Item::Frame(event(
                fmt,
                &json!({ "type": "content_block_start", "index": 0, "content_block": block }),
            )));
            body.push(Item::Frame(ping));
            for piece in chunks {
                let delta = json!({ "type": "text_delta", "text": piece });
                body.push(Item::Content(event(
                    fmt,
                    &json!({ "type": "content_block_delta", "index": 0, "delta": delta }),
                )));
            }
            body.push(block_stop(0));
        }
        Output::Tools(calls) => {
            for (i, call) in calls.iter().enumerate() {
                let block = json!({ "type": "tool_use", "id": tool_id(&call.key(i)), "name": call.name, "input": {} });
                body.push(Item::Frame(event(
                    fmt,
                    &json!({ "type": "content_block_start", "index": i, "content_block": block }),
                )));
                if i == 0 {
                    body.push(Item::Frame(ping.clone()));
                }
                for piece in &call.pieces {
                    let delta = json!({ "type": "input_json_delta", "partial_json": piece });
                    body.push(Item::Content(event(
                        fmt,
                        &json!({ "type": "content_block_delta", "index": i, "delta": delta }),
                    )));
                }
                body.push(block_stop(i));
            }
        }
    }
    let delta = json!({
        "type": "message_delta",
        "delta": { "stop_reason": stop_reason(g), "stop_sequence": null },
        "usage": g.raw_usage.clone().unwrap_or_else(|| json!({ "output_tokens": g.usage.completion })),
    });
    Script {
        prelude: vec![event(fmt, &start)],
        body,
        trailer: vec![
            event(fmt, &delta),
            event(fmt, &json!({ "type": "message_stop" })),
        ],
        error: event(fmt, &error_object("overloaded_error", "Overloaded")),
    }
}
