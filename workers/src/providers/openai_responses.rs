//! Targets with `api: responses`: the normalised request is sent to `{base_url}/responses`
//! (OpenAI API reference, "Create a model response"; Azure OpenAI: `{base_url}/openai/v1/responses`
//! with the deployment as `model`, Azure OpenAI "Responses API" guide) and the answer —
//! typed SSE events ("Streaming events") or one `response` object — read back into frames.
//!
//! Request mapping: system/developer/user messages → `message` input items (`input_text`,
//! `input_image` parts); an assistant message → its text as an assistant message plus one
//! `function_call` item per tool call; a `tool` message → `function_call_output`; tools →
//! `{"type":"function","name",…}`; `max_tokens` → `max_output_tokens`; `response_format` →
//! `text.format`; an assistant message's encrypted `reasoning` items
//! ([`ThinkingBlock::Reasoning`](switchyard_schemas::request::ThinkingBlock::Reasoning)) →
//! those items, unchanged, before its content. Always `store: false`: the conversation lives in
//! Switchyard (a stored upstream id would tie a follow-up to one deployment; encrypted reasoning
//! does, and the Responses door pins such a conversation to the target that accepted it). Not sent (the Responses API has no such
//! parameter): `stop`, `seed`, `presence_penalty`, `frequency_penalty`, `n`.
//!
//! Reading the stream (FC-31): content is taken from the item events, never from the terminal
//! event's `response.output`, which some upstreams send as `[]` or `null`. Text comes from
//! `response.output_text.delta`, or from `response.output_item.done` for an item that had no
//! deltas; a function call from `response.output_item.added` + argument deltas, or whole from
//! `output_item.done`. `response.completed` ends with `stop` (`tool_calls` when a call was made);
//! `response.incomplete` with `length` (`max_output_tokens`) or `content_filter`, keeping the
//! partial items; `response.failed` and `error` are classified errors. Only when no item event
//! came at all is the terminal `output` read.

use crate::provider::{Answer, EventStream, SseTranslator, send_checked};
use crate::providers::classify::stream_error;
use crate::providers::shared::{read_answer, secret_header};
use crate::sse::SseEvent;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use std::collections::{HashMap, VecDeque};
use switchyard_schemas::config::TargetConfig;
use switchyard_schemas::request::{Content, ContentPart, Role};
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage};

/// Starts a Responses call for `req` on an OpenAI (or compatible) target:
/// `{base_url}/responses` with bearer auth.
pub fn stream_chat(
    http: &reqwest::Client,
    target: &TargetConfig,
    base_url: &str,
    req: &ChatRequest,
) -> BoxFuture<'static, Result<EventStream, ErrorInfo>> {
    let url = format!("{}/responses", base_url.trim_end_matches('/'));
    let auth = (!target.api_key.is_empty()).then(|| {
        (
            "authorization",
            format!("Bearer {}", target.api_key.expose()),
        )
    });
    call(http, url, auth, &target.upstream_model, req)
}

/// Starts a Responses call for `req` at `url` with the auth header `auth` (name, value); the body
/// names `model` (for Azure: the deployment).
pub fn call(
    http: &reqwest::Client,
    url: String,
    auth: Option<(&'static str, String)>,
    model: &str,
    req: &ChatRequest,
) -> BoxFuture<'static, Result<EventStream, ErrorInfo>> {
    let body = build_object(model, req);
    let accept = if req.stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let mut rb = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", accept)
        .header("idempotency-key", req.id.to_string())
        // `json` fails the send (no request) if encoding fails: never an empty body.
        .json(&Value::Object(body));
    let auth = auth.map(|(name, value)| (name, secret_header(&value)));
    async move {
        if let Some((name, value)) = auth {
            rb = rb.header(name, value?);
        }
        let resp = send_checked(rb).await?;
        Ok(read_answer(
            resp,
            parse_response,
            ResponsesTranslator::default(),
        ))
    }
    .boxed()
}

/// The upstream JSON body.
pub fn build_object(upstream_model: &str, req: &ChatRequest) -> Map<String, Value> {
    let mut input = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let text = m.content.as_ref().map(Content::text).unwrap_or_default();
        match m.role {
            Role::Tool => input.push(json!({"type": "function_call_output",
                "call_id": m.tool_call_id.clone().unwrap_or_default(), "output": text})),
            Role::Assistant => {
                // Encrypted reasoning items go back unchanged, before the turn they led to.
                let reasoning: Vec<Value> = m
                    .thinking_blocks
                    .iter()
                    .filter(|b| b.is_encrypted_reasoning())
                    .filter_map(|b| serde_json::to_value(b).ok())
                    .collect();
                input.extend(reasoning);
                if !text.is_empty() || m.tool_calls.is_empty() {
                    input.push(json!({"role": "assistant", "content": text}));
                }
                for c in &m.tool_calls {
                    input.push(json!({"type": "function_call", "call_id": c.id,
                        "name": c.function.name, "arguments": c.function.arguments}));
                }
            }
            Role::System | Role::Developer | Role::User => {
                let role = match m.role {
                    Role::System => "system",
                    Role::Developer => "developer",
                    _ => "user",
                };
                let content = match &m.content {
                    Some(Content::Parts(parts)) => Value::Array(
                        parts
                            .iter()
                            .map(|p| match p {
                                ContentPart::Text { text } => {
                                    json!({"type": "input_text", "text": text})
                                }
                                ContentPart::ImageUrl { image_url } => {
                                    json!({"type": "input_image", "image_url": image_url.url,
                                        "detail": image_url.detail.as_deref().unwrap_or("auto")})
                                }
                                ContentPart::File { file } => {
                                    let mut part = match (&file.file_url, &file.file_id) {
                                        (_, Some(id)) => {
                                            json!({"type": "input_file", "file_id": id})
                                        }
                                        (Some(url), None) => {
                                            json!({"type": "input_file", "file_url": url})
                                        }
                                        (None, None) => json!({"type": "input_file",
                                            "file_data": file.file_data}),
                                    };
                                    if let Some(name) = &file.filename {
                                        part["filename"] = json!(name);
                                    }
                                    part
                                }
                            })
                            .collect(),
                    ),
                    _ => Value::String(text),
                };
                input.push(json!({"role": role, "content": content}));
            }
        }
    }
    let mut o = Map::new();
    o.insert("model".into(), json!(upstream_model));
    o.insert("input".into(), Value::Array(input));
    o.insert("store".into(), json!(false));
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut v = json!({"type": "function", "name": t.function.name,
                    "parameters": t.function.parameters.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}}))});
                if let Some(d) = &t.function.description {
                    v["description"] = json!(d);
                }
                // The Responses API defaults `strict` to true; the normalised default is off.
                v["strict"] = json!(t.function.strict.unwrap_or(false));
                v
            })
            .collect();
        o.insert("tools".into(), Value::Array(tools));
    }
    if let Some(tc) = &req.tool_choice {
        let mapped = match tc.pointer("/function/name") {
            Some(name) => json!({"type": "function", "name": name}),
            None => tc.clone(),
        };
        o.insert("tool_choice".into(), mapped);
    }
    let p = &req.params;
    let mut put = |k: &str, v| crate::providers::shared::put_some(&mut o, k, v);
    put("temperature", p.temperature.map(Value::from));
    put("top_p", p.top_p.map(Value::from));
    put("max_output_tokens", p.max_tokens.map(Value::from));
    put(
        "parallel_tool_calls",
        p.parallel_tool_calls.map(Value::from),
    );
    put("user", p.user.clone().map(Value::from));
    let format =
        p.response_format
            .as_ref()
            .and_then(|f| match f.get("type").and_then(Value::as_str) {
                Some("json_schema") => {
                    let mut fmt = f.get("json_schema").cloned().unwrap_or_else(|| json!({}));
                    fmt["type"] = json!("json_schema");
                    Some(fmt)
                }
                Some("json_object") => Some(json!({"type": "json_object"})),
                _ => None,
            });
    put("text", format.map(|f| json!({"format": f})));
    if req.stream {
        o.insert("stream".into(), json!(true));
    }
    o
}

/// Reads the Responses usage object (parts are subsets, see [`Usage`]).
fn parse_usage(u: &Value) -> Option<Usage> {
    if !u.is_object() {
        return None;
    }
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        prompt_tokens: n("/input_tokens"),
        cached_tokens: n("/input_tokens_details/cached_tokens"),
        cache_write_tokens: 0,
        completion_tokens: n("/output_tokens"),
        reasoning_tokens: n("/output_tokens_details/reasoning_tokens"),
        ..Default::default()
    })
}

/// The text of a `message` output item (its `output_text` and `refusal` parts).
fn item_text(item: &Value) -> String {
    item.get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("text").or_else(|| p.get("refusal")))
        .filter_map(Value::as_str)
        .collect()
}

/// `finish_reason` of a terminal `response` object.
fn finish_of(r: &Value, called: bool) -> FinishReason {
    match (
        r.get("status").and_then(Value::as_str),
        r.pointer("/incomplete_details/reason")
            .and_then(Value::as_str),
    ) {
        (Some("incomplete"), Some("content_filter")) => FinishReason::ContentFilter,
        (Some("incomplete"), _) => FinishReason::Length,
        _ if called => FinishReason::ToolCalls,
        _ => FinishReason::Stop,
    }
}

/// Reads a complete `response` object.
pub fn parse_response(v: &Value) -> Result<Answer, ErrorInfo> {
    if v.get("status").and_then(Value::as_str) == Some("failed") {
        return Err(stream_error(&json!({"error": v["error"]})));
    }
    let mut a = Answer::default();
    for item in v
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => a.text.push_str(&item_text(item)),
            Some("function_call") => a.tool_calls.push((
                item.get("call_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                item.get("name").and_then(Value::as_str).map(str::to_owned),
                item.get("arguments")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            )),
            _ => {}
        }
    }
    a.usage = v.get("usage").and_then(parse_usage);
    a.finish_reason = finish_of(v, !a.tool_calls.is_empty());
    Ok(a)
}

#[derive(Debug)]
enum ItemState {
    Message { text_seen: bool },
    Call { index: u32, args_seen: bool },
}

/// Translates Responses stream events (see the module docs).
#[derive(Debug, Default)]
pub struct ResponsesTranslator {
    items: HashMap<String, ItemState>,
    calls: u32,
}

impl ResponsesTranslator {
    fn new_call(&mut self, item: &Value, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) -> u32 {
        let index = self.calls;
        self.calls += 1;
        let arguments = item
            .get("arguments")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let id = item.get("id").and_then(Value::as_str).unwrap_or_default();
        self.items.insert(
            id.to_owned(),
            ItemState::Call {
                index,
                args_seen: !arguments.is_empty(),
            },
        );
        out.push_back(Ok(FrameBody::ToolCall {
            index,
            id: item
                .get("call_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
            name: item.get("name").and_then(Value::as_str).map(str::to_owned),
            arguments,
        }));
        index
    }

    fn item_done(&mut self, item: &Value, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) {
        let id = item.get("id").and_then(Value::as_str).unwrap_or_default();
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let seen = matches!(
                    self.items.get(id),
                    Some(ItemState::Message { text_seen: true })
                );
                if !seen {
                    let text = item_text(item);
                    if !text.is_empty() {
                        out.push_back(Ok(FrameBody::Text { text }));
                    }
                    self.items
                        .insert(id.to_owned(), ItemState::Message { text_seen: true });
                }
            }
            Some("function_call") => match self.items.get(id) {
                Some(ItemState::Call {
                    index,
                    args_seen: false,
                }) => {
                    let index = *index;
                    let arguments = item
                        .get("arguments")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    out.push_back(Ok(FrameBody::ToolCall {
                        index,
                        id: None,
                        name: None,
                        arguments,
                    }));
                    self.items.insert(
                        id.to_owned(),
                        ItemState::Call {
                            index,
                            args_seen: true,
                        },
                    );
                }
                Some(_) => {}
                None => {
                    self.new_call(item, out);
                }
            },
            _ => {}
        }
    }

    fn terminal(&mut self, r: &Value, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) {
        if self.items.is_empty() {
            // Nothing came as item events: the terminal object is all there is.
            for item in r
                .get("output")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                self.item_done(item, out);
            }
        }
        if let Some(usage) = r.get("usage").and_then(parse_usage) {
            out.push_back(Ok(FrameBody::Usage { usage }));
        }
        out.push_back(Ok(FrameBody::End {
            finish_reason: finish_of(r, self.calls > 0),
        }));
    }
}

impl SseTranslator for ResponsesTranslator {
    fn on_event(&mut self, ev: SseEvent, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) -> bool {
        let data = ev.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return false;
        }
        let Some(v) = crate::providers::shared::parse_event(data, "event", out) else {
            return true;
        };
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or_default();
        let item_id = v.get("item_id").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "response.output_item.added" => {
                let item = &v["item"];
                match item.get("type").and_then(Value::as_str) {
                    Some("function_call") => {
                        self.new_call(item, out);
                    }
                    Some("message") => {
                        let id = item.get("id").and_then(Value::as_str).unwrap_or_default();
                        self.items
                            .insert(id.to_owned(), ItemState::Message { text_seen: false });
                    }
                    _ => {}
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let delta = v.get("delta").and_then(Value::as_str).unwrap_or_default();
                self.items
                    .insert(item_id.to_owned(), ItemState::Message { text_seen: true });
                if !delta.is_empty() {
                    out.push_back(Ok(FrameBody::Text {
                        text: delta.to_owned(),
                    }));
                }
            }
            "response.function_call_arguments.delta" => {
                let delta = v.get("delta").and_then(Value::as_str).unwrap_or_default();
                if let Some(ItemState::Call { index, args_seen }) = self.items.get_mut(item_id) {
                    *args_seen = true;
                    out.push_back(Ok(FrameBody::ToolCall {
                        index: *index,
                        id: None,
                        name: None,
                        arguments: delta.to_owned(),
                    }));
                }
            }
            "response.output_item.done" => self.item_done(&v["item"], out),
            "response.completed" | "response.incomplete" => {
                self.terminal(&v["response"], out);
                return true;
            }
            "response.failed" => {
                out.push_back(Err(stream_error(&json!({"error": v["response"]["error"]}))));
                return true;
            }
            "error" => {
                out.push_back(Err(stream_error(&json!({"error": v}))));
                return true;
            }
            _ => {}
        }
        false
    }

    fn on_eof(&mut self, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) {
        out.push_back(Err(ErrorInfo::new(
            ErrorClass::Protocol,
            "upstream Responses stream ended before response.completed",
        )));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use switchyard_mock::fixtures;

    fn frames(fixture: &str) -> Vec<Result<FrameBody, ErrorInfo>> {
        let mut t = ResponsesTranslator::default();
        let mut out = VecDeque::new();
        for block in fixtures::get(fixture).unwrap().split("\n\n") {
            let Some((head, data)) = block.split_once('\n') else {
                continue;
            };
            let ev = SseEvent {
                event: head.strip_prefix("event: ").map(str::to_owned),
                data: data.strip_prefix("data: ").unwrap().to_owned(),
                id: None,
                retry: None,
            };
            if t.on_event(ev, &mut out) {
                break;
            }
        }
        out.into_iter().collect()
    }

    fn answer(fixture: &str) -> Answer {
        Answer::from_frames(frames(fixture)).unwrap()
    }

    /// FC-31: the content streamed in item events survives a terminal `output: []` / `null`.
    #[test]
    fn fc31_content_from_item_events() {
        for fixture in ["fc31_responses_empty_output", "fc31_responses_null_output"] {
            let a = answer(fixture);
            assert_eq!(a.text, "Hi! How can I help?", "{fixture}");
            assert_eq!(a.finish_reason, FinishReason::Stop);
            let u = a.usage.unwrap();
            assert_eq!(
                (u.prompt_tokens, u.completion_tokens, u.total_tokens()),
                (17, 6, 23)
            );
        }
        let a = answer("fc31_responses_incomplete");
        assert_eq!(a.text, "Hi! How");
        assert_eq!(a.finish_reason, FinishReason::Length);
        let a = answer("fc31_responses_call_in_done");
        assert_eq!(
            a.tool_calls,
            vec![(
                Some("call_fc31".into()),
                Some("get_weather".into()),
                "{\"city\":\"Paris\"}".into()
            )]
        );
        assert_eq!(a.finish_reason, FinishReason::ToolCalls);
    }

    fn body(messages: Value, extra: Value) -> Value {
        let target = ("t", "openai", "gpt-test");
        let req = crate::providers::test_support::request("m", target, messages, extra);
        Value::Object(build_object("gpt-up", &req))
    }

    /// A rich conversation (every message role and part kind, encrypted reasoning replayed,
    /// tool calls and results, tools, a named `tool_choice`, a `json_schema` format, the
    /// parameters the Responses API has and those it has not): the exact body.
    #[test]
    fn whole_body_of_a_rich_request() {
        let messages = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
            {"role": "user", "cache_control": {"type": "ephemeral"}, "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image_url",
                    "image_url": {"url": "https://e.com/a.png", "detail": "high"}},
                {"type": "file", "file": {"filename": "r.pdf",
                    "file_data": "data:application/pdf;base64,JVBE"}},
                {"type": "file", "file": {"file_url": "https://e.com/b.pdf"}},
                {"type": "file", "file": {"filename": "c.pdf", "file_id": "file_1"}}]},
            {"role": "assistant", "content": "Let me check.", "thinking_blocks": [
                {"type": "thinking", "thinking": "t", "signature": "sig"},
                {"type": "reasoning", "id": "rs_1", "encrypted_content": "enc",
                    "summary": [{"type": "summary_text", "text": "s"}]}],
                "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "tool_calls": [{"id": "c2", "type": "function",
                "function": {"name": "clock", "arguments": ""}}]},
            {"role": "tool", "content": [{"type": "text", "text": "12:00"}]},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "Thanks"}
        ]);
        let extra = json!({
            "tools": [
                {"type": "function", "function": {"name": "weather", "description": "w",
                    "parameters": {"type": "object"}, "strict": true}},
                {"type": "function", "function": {"name": "clock"}}],
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
            "params": {"max_tokens": 300, "temperature": 0.5, "top_p": 0.9, "stop": ["END"],
                "seed": 7, "n": 1, "presence_penalty": 0.5, "parallel_tool_calls": false,
                "user": "u-1", "top_k": 3,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s",
                    "type": "ignored", "schema": {"type": "object"}, "strict": true}}}});
        assert_eq!(
            body(messages, extra),
            json!({
                "model": "gpt-up",
                "store": false,
                "stream": true,
                "input": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "developer", "content": [{"type": "input_text", "text": "Use French."}]},
                    {"role": "user", "content": [
                        {"type": "input_text", "text": "Look:"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAAA",
                            "detail": "auto"},
                        {"type": "input_image", "image_url": "https://e.com/a.png",
                            "detail": "high"},
                        {"type": "input_file", "filename": "r.pdf",
                            "file_data": "data:application/pdf;base64,JVBE"},
                        {"type": "input_file", "file_url": "https://e.com/b.pdf"},
                        {"type": "input_file", "filename": "c.pdf", "file_id": "file_1"}]},
                    {"type": "reasoning", "id": "rs_1", "encrypted_content": "enc",
                        "summary": [{"type": "summary_text", "text": "s"}]},
                    {"role": "assistant", "content": "Let me check."},
                    {"type": "function_call", "call_id": "c1", "name": "weather",
                        "arguments": "{\"city\":\"Paris\"}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                    {"type": "function_call", "call_id": "c2", "name": "clock", "arguments": ""},
                    {"type": "function_call_output", "call_id": "", "output": "12:00"},
                    {"role": "assistant", "content": ""},
                    {"role": "user", "content": "Thanks"}
                ],
                "tools": [
                    {"type": "function", "name": "weather", "description": "w",
                        "parameters": {"type": "object"}, "strict": true},
                    {"type": "function", "name": "clock",
                        "parameters": {"type": "object", "properties": {}}, "strict": false}],
                "tool_choice": {"type": "function", "name": "weather"},
                "temperature": 0.5,
                "top_p": 0.9,
                "max_output_tokens": 300,
                "parallel_tool_calls": false,
                "user": "u-1",
                "text": {"format": {"type": "json_schema", "name": "s",
                    "schema": {"type": "object"}, "strict": true}}
            })
        );
        // A string `tool_choice` as given; `json_object`; not streamed; no tools.
        let user = json!([{"role": "user", "content": "x"}]);
        let extra = json!({"stream": false, "tool_choice": "required",
            "params": {"response_format": {"type": "json_object"}}});
        assert_eq!(
            body(user.clone(), extra),
            json!({"model": "gpt-up", "store": false,
                "input": [{"role": "user", "content": "x"}],
                "tool_choice": "required",
                "text": {"format": {"type": "json_object"}}})
        );
        // `json_schema` without its object, and `text`: the bare type, and nothing.
        for (rf, text) in [
            (
                json!({"type": "json_schema"}),
                Some(json!({"format": {"type": "json_schema"}})),
            ),
            (json!({"type": "text"}), None),
        ] {
            let b = body(user.clone(), json!({"params": {"response_format": rf}}));
            assert_eq!(b.get("text"), text.as_ref());
        }
    }
}
