//! The `response` object (OpenAI API reference, "The response object"): output items, status,
//! `incomplete_details`, usage, and the echoed request parameters.
//!
//! Output items: one `message` (`output_text` part) when the model wrote text or called nothing,
//! then one `function_call` item per tool call. Item ids derive from the response id, so the
//! stream's item events and the final object agree: `msg_<hex>`, `fc_<hex>_<index>`.
//! `finish_reason` `length` → status `incomplete` with `incomplete_details.reason`
//! `max_output_tokens`, `content_filter` → `incomplete` / `content_filter`.

use crate::error::ApiError;
use crate::route::{Aggregate, ToolCallAcc};
use serde_json::{Map, Value, json};
use switchyard_schemas::request::{Content, FunctionCall, Message, Role, ToolCall};
use switchyard_schemas::{FinishReason, Usage};

/// Identity of one response.
#[derive(Debug, Clone)]
pub struct Ident {
    /// `resp_<request id hex>`.
    pub id: String,
    /// The hex part, for item ids.
    pub hex: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The `model` the client sent.
    pub model: String,
    /// Function name → `namespace` of the tool group it was sent in.
    pub namespaces: std::sync::Arc<std::collections::HashMap<String, String>>,
    /// The target that served (`None` for a cache hit): the pin of a stored conversation that
    /// holds encrypted reasoning.
    pub target: Option<String>,
}

impl Ident {
    /// The id of the message output item.
    pub fn message_id(&self) -> String {
        format!("msg_{}", self.hex)
    }

    /// The id of function-call output item `index`.
    pub fn call_id(&self, index: usize) -> String {
        format!("fc_{}_{index}", self.hex)
    }
}

/// The answer so far: text, tool calls, and how it ended.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// All text.
    pub text: String,
    /// Tool calls by index.
    pub calls: Vec<ToolCallAcc>,
    /// How it stopped (`None` while running or after an error).
    pub finish: Option<FinishReason>,
    /// Upstream usage.
    pub usage: Option<Usage>,
    /// The failure, for `status: failed`.
    pub error: Option<ApiError>,
}

impl From<&Aggregate> for Answer {
    fn from(a: &Aggregate) -> Self {
        Self {
            text: a.text.clone(),
            calls: a.tool_calls.clone(),
            finish: Some(a.finish),
            usage: a.usage,
            error: None,
        }
    }
}

/// `status` and `incomplete_details` of a response.
pub fn status(a: &Answer) -> (&'static str, Value) {
    match (a.error.is_some(), a.finish) {
        (true, _) => ("failed", Value::Null),
        (false, Some(FinishReason::Length)) => {
            ("incomplete", json!({"reason": "max_output_tokens"}))
        }
        (false, Some(FinishReason::ContentFilter)) => {
            ("incomplete", json!({"reason": "content_filter"}))
        }
        (false, Some(_)) => ("completed", Value::Null),
        (false, None) => ("in_progress", Value::Null),
    }
}

/// The item status for a finished item of a response with `status`.
fn item_status(status: &str) -> &'static str {
    match status {
        "incomplete" | "failed" => "incomplete",
        "in_progress" => "in_progress",
        _ => "completed",
    }
}

/// An `output_text` content part.
pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
}

/// A `message` output item.
pub fn message_item(ident: &Ident, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(text_part).into_iter().collect();
    json!({"id": ident.message_id(), "type": "message", "status": status, "role": "assistant",
        "content": content})
}

/// A `function_call` output item.
pub fn call_item(ident: &Ident, index: usize, call: &ToolCallAcc, status: &str) -> Value {
    let mut item = json!({"id": ident.call_id(index), "type": "function_call", "status": status,
        "arguments": call.arguments, "call_id": call.id, "name": call.name});
    if let Some(ns) = ident.namespaces.get(&call.name) {
        item["namespace"] = json!(ns);
    }
    item
}

/// Whether the answer has a message item: text, or nothing at all to show.
pub fn has_message(a: &Answer) -> bool {
    !a.text.is_empty() || a.calls.is_empty()
}

/// The `output` array of a finished answer.
pub fn output(ident: &Ident, a: &Answer) -> Vec<Value> {
    let (st, _) = status(a);
    let st = item_status(st);
    let mut out = Vec::with_capacity(a.calls.len() + 1);
    if has_message(a) && (a.error.is_none() || !a.text.is_empty()) {
        out.push(message_item(ident, Some(&a.text), st));
    }
    for (i, c) in a.calls.iter().enumerate() {
        out.push(call_item(ident, i, c, st));
    }
    out
}

/// The Responses usage object (`input_tokens` include cached ones, `output_tokens` reasoning).
pub fn usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": u.cache_write_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total_tokens(),
    })
}

/// The `response` object: `output` given (the stream passes `[]` before the end), the
/// request's `echo` parameters merged in.
pub fn object(ident: &Ident, echo: &Map<String, Value>, a: &Answer, output: Vec<Value>) -> Value {
    let (st, incomplete) = status(a);
    let mut o = Map::new();
    o.insert("id".into(), json!(ident.id));
    o.insert("object".into(), json!("response"));
    o.insert("created_at".into(), json!(ident.created_at));
    o.insert("status".into(), json!(st));
    let completed_at = (st == "completed").then(|| switchyard_schemas::now_ms() / 1000);
    o.insert("completed_at".into(), json!(completed_at));
    o.insert(
        "error".into(),
        a.error.as_ref().map_or(
            Value::Null,
            |e| json!({"code": failure_code(e), "message": e.message}),
        ),
    );
    o.insert("incomplete_details".into(), incomplete);
    o.insert("model".into(), json!(ident.model));
    o.insert("output".into(), Value::Array(output));
    for (k, v) in echo {
        o.insert(k.clone(), v.clone());
    }
    o.insert("usage".into(), a.usage.map_or(Value::Null, usage));
    Value::Object(o)
}

/// `error.code` of a failed response: the documented codes are `server_error` and
/// `rate_limit_exceeded` (plus prompt and image ones that do not apply here).
fn failure_code(e: &ApiError) -> &'static str {
    if e.status.as_u16() == 429 {
        "rate_limit_exceeded"
    } else {
        "server_error"
    }
}

/// The answer as the assistant turn of the stored conversation.
pub fn as_message(a: &Answer) -> Message {
    Message {
        role: Role::Assistant,
        content: (!a.text.is_empty() || a.calls.is_empty()).then(|| Content::Text(a.text.clone())),
        name: None,
        tool_calls: a
            .calls
            .iter()
            .map(|c| ToolCall {
                id: c.id.clone(),
                kind: "function".into(),
                function: FunctionCall {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                },
            })
            .collect(),
        tool_call_id: None,
        cache_control: None,
        thinking_blocks: Vec::new(),
    }
}
