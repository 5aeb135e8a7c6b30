//! OpenAI Responses wire format (`POST /v1/responses`; OpenAI API reference, "Responses" and
//! "Streaming events"): the `response` object and the typed `event:` / `data:` SSE events with
//! `sequence_number`. Directives and word counts read the request as a chat view
//! ([`chat_view`]): `instructions` as a system message, `input` items as messages
//! (`function_call_output` as `role: tool`).

use serde_json::{Value, json};

use super::behaviour::{
    Generation, Output, RequestInfo, Usage, messages_words, model_and_stream, names_at,
};
use super::wire::{Item, Script, SseFormat};

/// The request as `{"messages": [...]}` in Chat Completions roles.
pub(crate) fn chat_view(body: &Value) -> Value {
    let mut messages = Vec::new();
    if let Some(i) = body.get("instructions").and_then(Value::as_str) {
        messages.push(json!({"role": "system", "content": i}));
    }
    match body.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for item in items {
                match item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message")
                {
                    "message" => {
                        let content = match item.get("content") {
                            Some(Value::Array(parts)) => Value::Array(
                                parts
                                    .iter()
                                    .filter_map(|p| p.get("text"))
                                    .map(|t| json!({"type": "text", "text": t}))
                                    .collect(),
                            ),
                            Some(other) => other.clone(),
                            None => Value::Null,
                        };
                        messages.push(json!({"role": item["role"], "content": content}));
                    }
                    "function_call_output" => {
                        messages.push(json!({"role": "tool", "content": item["output"]}));
                    }
                    "function_call" => messages.push(json!({"role": "assistant"})),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    json!({ "messages": messages })
}

/// Reads the fields the mock needs from a Responses request.
pub(crate) fn request_info(body: &Value) -> Result<RequestInfo, String> {
    if body.get("input").is_none_or(Value::is_null) {
        return Err("Missing required parameter: 'input'.".to_string());
    }
    let tool_names = names_at(body.get("tools"), "/name");
    let (model, stream) = model_and_stream(body);
    Ok(RequestInfo {
        model,
        stream,
        include_usage: true,
        max_tokens: body.get("max_output_tokens").and_then(Value::as_u64),
        tool_names,
        prompt_words: messages_words(&chat_view(body)),
        n: 1,
        ..RequestInfo::default()
    })
}

fn usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt,
        "input_tokens_details": { "cached_tokens": u.cached },
        "output_tokens": u.completion,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": u.prompt + u.completion,
    })
}

fn truncated(g: &Generation) -> bool {
    matches!(
        g.output,
        Output::Text {
            truncated: true,
            ..
        }
    )
}

fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text
        .map(|t| json!({"type": "output_text", "text": t, "annotations": [], "logprobs": []}))
        .into_iter()
        .collect();
    json!({"id": format!("msg_{id}"), "type": "message", "status": status, "role": "assistant",
        "content": content})
}

fn call_item(id: &str, i: usize, name: &str, arguments: &str, status: &str) -> Value {
    json!({"id": format!("fc_{id}_{i}"), "type": "function_call", "status": status,
        "arguments": arguments, "call_id": format!("call_mock_{i}"), "name": name})
}

fn output(id: &str, g: &Generation) -> Vec<Value> {
    let status = if truncated(g) {
        "incomplete"
    } else {
        "completed"
    };
    match &g.output {
        Output::Text { chunks, .. } => vec![message_item(id, Some(&chunks.concat()), status)],
        Output::Tools(calls) => calls
            .iter()
            .enumerate()
            .map(|(i, c)| call_item(id, i, &c.name, &c.arguments, status))
            .collect(),
    }
}

fn object(id: &str, created: u64, info: &RequestInfo, status: &str, out: Value, u: Value) -> Value {
    let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
    json!({
        "id": id, "object": "response", "created_at": created, "status": status,
        "error": null, "incomplete_details": incomplete, "instructions": null,
        "max_output_tokens": info.max_tokens, "model": info.model, "output": out,
        "parallel_tool_calls": true, "previous_response_id": null, "store": false,
        "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
        "tools": [], "top_p": 1.0, "truncation": "disabled", "usage": u, "metadata": {},
    })
}

/// The `response` object of a finished generation `g` (`completed` or `incomplete`): its output
/// and usage.
fn finished_object(
    id: &str,
    created: u64,
    info: &RequestInfo,
    status: &str,
    g: &Generation,
) -> Value {
    object(
        id,
        created,
        info,
        status,
        Value::Array(output(id, g)),
        usage(g.usage),
    )
}

/// The non-streaming `response` object.
pub(crate) fn response_object(id: &str, created: u64, info: &RequestInfo, g: &Generation) -> Value {
    let status = if truncated(g) {
        "incomplete"
    } else {
        "completed"
    };
    finished_object(id, created, info, status, g)
}

struct Events {
    fmt: SseFormat,
    seq: u64,
}

impl Events {
    fn ev(&mut self, kind: &str, mut data: Value) -> bytes::Bytes {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.fmt.event(kind, &data.to_string())
    }
}

/// The SSE events of a streamed answer.
pub(crate) fn stream_script(
    id: &str,
    created: u64,
    info: &RequestInfo,
    g: &Generation,
    fmt: SseFormat,
) -> Script {
    let mut e = Events { fmt, seq: 0 };
    let pending = object(id, created, info, "in_progress", json!([]), Value::Null);
    let mut body = vec![
        Item::Frame(e.ev("response.created", json!({"response": pending}))),
        Item::Frame(e.ev("response.in_progress", json!({"response": pending}))),
    ];
    let status = if truncated(g) {
        "incomplete"
    } else {
        "completed"
    };
    match &g.output {
        Output::Text { chunks, .. } => {
            let item_id = format!("msg_{id}");
            let part = |t: &str| json!({"type": "output_text", "text": t, "annotations": [], "logprobs": []});
            body.push(Item::Frame(e.ev(
                "response.output_item.added",
                json!({"output_index": 0, "item": message_item(id, None, "in_progress")}),
            )));
            body.push(Item::Frame(e.ev(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part("")}),
            )));
            for piece in chunks {
                body.push(Item::Content(e.ev(
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                        "delta": piece, "logprobs": []}),
                )));
            }
            let text = chunks.concat();
            body.push(Item::Frame(e.ev(
                "response.output_text.done",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                    "text": text, "logprobs": []}),
            )));
            body.push(Item::Frame(e.ev(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part(&text)}),
            )));
            body.push(Item::Frame(e.ev(
                "response.output_item.done",
                json!({"output_index": 0, "item": message_item(id, Some(&text), status)}),
            )));
        }
        Output::Tools(calls) => {
            for (i, c) in calls.iter().enumerate() {
                let item_id = format!("fc_{id}_{i}");
                body.push(Item::Frame(e.ev(
                    "response.output_item.added",
                    json!({"output_index": i, "item": call_item(id, i, &c.name, "", "in_progress")}),
                )));
                for piece in &c.pieces {
                    body.push(Item::Content(e.ev(
                        "response.function_call_arguments.delta",
                        json!({"item_id": item_id, "output_index": i, "delta": piece}),
                    )));
                }
                body.push(Item::Frame(e.ev(
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": i, "arguments": c.arguments,
                        "name": c.name}),
                )));
                body.push(Item::Frame(e.ev(
                    "response.output_item.done",
                    json!({"output_index": i,
                        "item": call_item(id, i, &c.name, &c.arguments, "completed")}),
                )));
            }
        }
    }
    let done = finished_object(id, created, info, status, g);
    let kind = if status == "completed" {
        "response.completed"
    } else {
        "response.incomplete"
    };
    let trailer = vec![e.ev(kind, json!({"response": done}))];
    let error = fmt.event(
        "error",
        &json!({"type": "error", "code": "server_error", "param": null, "sequence_number": e.seq,
            "message": "The server had an error while processing your request. Sorry about that! (mock)"})
        .to_string(),
    );
    Script {
        prelude: Vec::new(),
        body,
        trailer,
        error,
    }
}
