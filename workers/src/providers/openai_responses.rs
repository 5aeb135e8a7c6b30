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

use crate::provider::{
    Answer, EventStream, SseTranslator, Upstream, accept_for, post_json, send_checked,
};
use crate::providers::classify::stream_error;
use crate::providers::shared::{empty_object_schema, read_answer, secret_header, to_json_object};
use crate::sse::SseEvent;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::collections::{HashMap, VecDeque};
use switchyard_schemas::request::{Content, ContentPart, Role, ThinkingBlock};
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage};

/// Starts a Responses call for `req` on an OpenAI (or compatible) target:
/// `{base_url}/responses` with bearer auth.
pub fn stream_chat(
    up: Upstream<'_>,
    req: &ChatRequest,
) -> BoxFuture<'static, Result<EventStream, ErrorInfo>> {
    let target = up.target;
    let url = up.url("/responses");
    let auth = (!target.api_key.is_empty()).then(|| {
        (
            "authorization",
            format!("Bearer {}", target.api_key.expose()),
        )
    });
    call(up.http, url, auth, &target.upstream_model, req)
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
    let mut rb = post_json(http, &url)
        .header("accept", accept_for(req.stream))
        .header("idempotency-key", req.id.to_string());
    let auth = auth.map(|(name, value)| (name, secret_header(&value)));
    async move {
        rb = rb.json(&body?);
        if let Some((name, value)) = auth {
            rb = rb.header(name, value?);
        }
        let resp = send_checked(rb).await?;
        Ok(read_answer(
            resp,
            None,
            parse_response,
            ResponsesTranslator::default(),
        ))
    }
    .boxed()
}

/// A Responses request body (OpenAI API reference, "Create a model response" → request body,
/// <https://platform.openai.com/docs/api-reference/responses/create>); unset optional parameters
/// are left out.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
struct ResponsesRequest<'a> {
    model: &'a str,
    input: Vec<InputItem<'a>>,
    /// Always `false` (see the module docs).
    store: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool<'a>>,
    tool_choice: Option<ToolChoice<'a>>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_output_tokens: Option<u32>,
    parallel_tool_calls: Option<bool>,
    user: Option<&'a str>,
    text: Option<TextConfig>,
    /// `true` for a streaming client, else absent.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

/// One `input` item: a message without a `type` (the "easy input message" form), a typed item,
/// or an encrypted `reasoning` item replayed as the client gave it.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum InputItem<'a> {
    Message {
        role: &'static str,
        content: MessageContent<'a>,
    },
    Item(TypedItem<'a>),
    Reasoning(&'a ThinkingBlock),
}

/// A message's `content`: a string or input parts.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum MessageContent<'a> {
    Text(String),
    Parts(Vec<InputPart<'a>>),
}

/// The `input` items with a `type` that Switchyard sends.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum TypedItem<'a> {
    /// An assistant's tool call, `arguments` the JSON string as given.
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    /// A tool's result; `call_id` empty when the message had none.
    FunctionCallOutput { call_id: &'a str, output: String },
}

/// A message content part, by its `type` (`input_text`, `input_image`, `input_file`).
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
enum InputPart<'a> {
    #[serde(rename = "input_text")]
    Text { text: &'a str },
    /// `detail` defaults to `auto`.
    #[serde(rename = "input_image")]
    Image { image_url: &'a str, detail: &'a str },
    #[serde(rename = "input_file")]
    File {
        #[serde(skip_serializing_if = "Option::is_none")]
        filename: Option<&'a str>,
        #[serde(flatten)]
        source: FileSource<'a>,
    },
}

/// Where an `input_file` comes from: one of `file_id`, `file_url`, `file_data`.
#[derive(Debug, Serialize)]
enum FileSource<'a> {
    #[serde(rename = "file_id")]
    Id(&'a str),
    #[serde(rename = "file_url")]
    Url(&'a str),
    /// A `data:` URL.
    #[serde(rename = "file_data")]
    Data(&'a str),
}

/// A tool declaration, by its `type`: only function tools.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Tool<'a> {
    Function {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<&'a str>,
        /// The client's JSON Schema (default [`empty_object_schema`]).
        parameters: Value,
        /// The Responses API defaults `strict` to true; the normalised default is off.
        strict: bool,
    },
}

/// `tool_choice`: a named function in the Responses form, anything else as the client gave it.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ToolChoice<'a> {
    Named(NamedToolChoice<'a>),
    AsGiven(&'a Value),
}

/// `{"type":"function","name"}`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum NamedToolChoice<'a> {
    Function { name: &'a Value },
}

/// `text`: its `format`.
#[derive(Debug, Serialize)]
struct TextConfig {
    format: TextFormat,
}

/// `text.format`, by its `type`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum TextFormat {
    /// The Chat Completions `json_schema` object's members (`name`, `schema`, `strict`, …).
    JsonSchema {
        #[serde(flatten)]
        members: Map<String, Value>,
    },
    JsonObject,
}

/// The upstream JSON body; an `internal` error only if JSON encoding fails.
pub fn build_object(
    upstream_model: &str,
    req: &ChatRequest,
) -> Result<Map<String, Value>, ErrorInfo> {
    let mut input = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let text = m.content.as_ref().map(Content::text).unwrap_or_default();
        match m.role {
            Role::Tool => input.push(InputItem::Item(TypedItem::FunctionCallOutput {
                call_id: m.tool_call_id.as_deref().unwrap_or_default(),
                output: text,
            })),
            Role::Assistant => {
                // Encrypted reasoning items go back unchanged, before the turn they led to.
                let reasoning = m.thinking_blocks.iter();
                let reasoning = reasoning.filter(|b| b.is_encrypted_reasoning());
                input.extend(reasoning.map(InputItem::Reasoning));
                if !text.is_empty() || m.tool_calls.is_empty() {
                    let content = MessageContent::Text(text);
                    input.push(InputItem::Message {
                        role: "assistant",
                        content,
                    });
                }
                input.extend(m.tool_calls.iter().map(|c| {
                    InputItem::Item(TypedItem::FunctionCall {
                        call_id: &c.id,
                        name: &c.function.name,
                        arguments: &c.function.arguments,
                    })
                }));
            }
            Role::System | Role::Developer | Role::User => {
                let role = match m.role {
                    Role::System => "system",
                    Role::Developer => "developer",
                    _ => "user",
                };
                let content = match &m.content {
                    Some(Content::Parts(parts)) => {
                        MessageContent::Parts(parts.iter().map(input_part).collect())
                    }
                    _ => MessageContent::Text(text),
                };
                input.push(InputItem::Message { role, content });
            }
        }
    }
    let tools = req.tools.iter().map(|t| Tool::Function {
        name: &t.function.name,
        description: t.function.description.as_deref(),
        parameters: (t.function.parameters.clone()).unwrap_or_else(empty_object_schema),
        strict: t.function.strict.unwrap_or(false),
    });
    let tool_choice = req
        .tool_choice
        .as_ref()
        .map(|tc| match tc.pointer("/function/name") {
            Some(name) => ToolChoice::Named(NamedToolChoice::Function { name }),
            None => ToolChoice::AsGiven(tc),
        });
    let p = &req.params;
    let body = ResponsesRequest {
        model: upstream_model,
        input,
        store: false,
        tools: tools.collect(),
        tool_choice,
        temperature: p.temperature,
        top_p: p.top_p,
        max_output_tokens: p.max_tokens,
        parallel_tool_calls: p.parallel_tool_calls,
        user: p.user.as_deref(),
        text: p.response_format.as_ref().and_then(text_format),
        stream: req.stream,
    };
    to_json_object(&body)
}

/// A normalised content part as a Responses input part.
fn input_part(part: &ContentPart) -> InputPart<'_> {
    match part {
        ContentPart::Text { text } => InputPart::Text { text },
        ContentPart::ImageUrl { image_url } => InputPart::Image {
            image_url: &image_url.url,
            detail: image_url.detail.as_deref().unwrap_or("auto"),
        },
        ContentPart::File { file } => InputPart::File {
            filename: file.filename.as_deref(),
            source: match (&file.file_url, &file.file_id) {
                (_, Some(id)) => FileSource::Id(id),
                (Some(url), None) => FileSource::Url(url),
                (None, None) => FileSource::Data(&file.file_data),
            },
        },
    }
}

/// Chat Completions `response_format` → Responses `text.format`: `json_schema` with the members
/// of its `json_schema` object (their own `type`, if any, replaced; none when it is absent or
/// not an object), `json_object`; `text` and unknown types send no `text`.
fn text_format(rf: &Value) -> Option<TextConfig> {
    let format = match rf.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let mut members = match rf.get("json_schema") {
                Some(Value::Object(o)) => o.clone(),
                _ => Map::new(),
            };
            members.remove("type");
            TextFormat::JsonSchema { members }
        }
        Some("json_object") => TextFormat::JsonObject,
        _ => return None,
    };
    Some(TextConfig { format })
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
    use crate::providers::test_support;
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
        let req = test_support::request("m", target, messages, extra);
        Value::Object(build_object("gpt-up", &req).unwrap())
    }

    /// A rich conversation (every message role and part kind, encrypted reasoning replayed,
    /// tool calls and results, tools, a named `tool_choice`, a `json_schema` format, the
    /// parameters the Responses API has and those it has not): the exact body.
    #[test]
    fn whole_body_of_a_rich_request() {
        let mut messages = test_support::rich_opening(json!([
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "image_url", "image_url": {"url": "https://e.com/a.png", "detail": "high"}},
            {"type": "file", "file": {"filename": "r.pdf",
                "file_data": "data:application/pdf;base64,JVBE"}},
            {"type": "file", "file": {"file_url": "https://e.com/b.pdf"}},
            {"type": "file", "file": {"filename": "c.pdf", "file_id": "file_1"}}]));
        let rest = json!([
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
        messages.extend(rest.as_array().cloned().unwrap_or_default());
        let messages = Value::Array(messages);
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
        // `json_schema` without its object (or with a non-object, which panicked before the
        // typed body), and `text`: the bare type, and nothing.
        let bare = json!({"format": {"type": "json_schema"}});
        for (rf, text) in [
            (json!({"type": "json_schema"}), Some(bare.clone())),
            (
                json!({"type": "json_schema", "json_schema": "s"}),
                Some(bare),
            ),
            (json!({"type": "text"}), None),
        ] {
            let b = body(user.clone(), json!({"params": {"response_format": rf}}));
            assert_eq!(b.get("text"), text.as_ref());
        }
    }
}
