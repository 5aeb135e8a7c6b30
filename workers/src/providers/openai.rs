//! OpenAI Chat Completions, and every OpenAI-compatible server (vLLM, Ollama, llama.cpp, Groq, …).
//! A target with `api: responses` is served by [`crate::providers::openai_responses`] instead.
//!
//! Wire reference: OpenAI API reference, "Create chat completion", "The chat completion object"
//! and "The chat completion chunk object". A streaming client's request is sent with
//! `stream: true` and `stream_options.include_usage: true`, so usage arrives in a final chunk with
//! `choices: []`; a non-streaming client's without `stream` (default false), answered by one
//! `chat.completion` object. Either answer is read by its `Content-Type`: a server that answers
//! `application/json` to a stream request is read as a complete answer.
//!
//! FC-12 variant: servers that do not know `stream_options` (older Azure api-versions:
//! "Unrecognized request argument supplied: stream_options"; some compatible servers) answer 400
//! naming it. The call is then repeated once without it (usage is then estimated by the worker
//! and marked `estimated`), and the target is remembered in this process so later requests skip
//! the failing first call.

use crate::provider::{
    Answer, Call, Embeddings, EventStream, Provider, SseTranslator, Upstream, send_checked,
};
use crate::sse::SseEvent;
use futures::FutureExt;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use std::collections::{HashSet, VecDeque};
use std::sync::LazyLock;
use switchyard_schemas::config::{OpenAiApi, ProviderKind};
use switchyard_schemas::embed::EmbedRequest;
use switchyard_schemas::request::{Passthrough, Role};
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage};

/// Adapter for [`ProviderKind::Openai`] and [`ProviderKind::OpenaiCompatible`].
#[derive(Debug, Clone, Copy)]
pub struct OpenAiProvider {
    kind: ProviderKind,
}

impl OpenAiProvider {
    /// OpenAI itself.
    pub fn openai() -> Self {
        Self {
            kind: ProviderKind::Openai,
        }
    }
    /// A generic OpenAI-compatible server.
    pub fn compatible() -> Self {
        Self {
            kind: ProviderKind::OpenaiCompatible,
        }
    }
}

impl Provider for OpenAiProvider {
    fn kind(&self) -> ProviderKind {
        self.kind
    }

    fn stream_chat(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<EventStream> {
        let (http, target, base_url) = (up.http, up.target, up.base_url);
        if target.api == OpenAiApi::Responses {
            return crate::providers::openai_responses::stream_chat(http, target, base_url, req);
        }
        let body = build_object(self.kind, &target.upstream_model, req);
        let url = format!("{}/chat/completions", base_url.trim_end_matches('/'));
        let (http, key, id) = (http.clone(), target.api_key.clone(), req.id);
        let make = move |body: &Map<String, Value>| {
            let mut rb = http
                .post(&url)
                .header("content-type", "application/json")
                .header("accept", accept(body))
                // Lets providers that support it deduplicate our retries of the same request.
                .header("idempotency-key", id.to_string())
                // `json` fails the send (no request) if encoding fails: never an empty body.
                .json(body);
            if !key.is_empty() {
                rb = rb.bearer_auth(key.expose());
            }
            rb
        };
        let memo = format!("{}|{base_url}", target.id);
        let translator = OpenAiTranslator::for_request(req);
        async move {
            let resp = send_chat(body, &memo, make).await?;
            Ok(read_answer(resp, translator))
        }
        .boxed()
    }

    fn embed(&self, up: Upstream<'_>, req: &EmbedRequest) -> Call<Embeddings> {
        let (http, target, base_url) = (up.http, up.target, up.base_url);
        let url = format!("{}/embeddings", base_url.trim_end_matches('/'));
        let mut rb = http
            .post(url)
            .json(&embed_body(&target.upstream_model, req));
        if !target.api_key.is_empty() {
            rb = rb.bearer_auth(target.api_key.expose());
        }
        async move {
            let resp = send_checked(rb).await?;
            let body: Value = resp.json().await.map_err(|e| {
                ErrorInfo::new(
                    ErrorClass::Protocol,
                    format!("upstream embeddings body: {e}"),
                )
            })?;
            parse_embeddings(&body)
        }
        .boxed()
    }
}

/// The upstream body of an embeddings call: floats on the wire, whatever the client asked.
pub fn embed_body(upstream_model: &str, req: &EmbedRequest) -> Value {
    let mut o = json!({"model": upstream_model, "input": req.input, "encoding_format": "float"});
    if let Some(d) = req.dimensions {
        o["dimensions"] = Value::from(d);
    }
    if let Some(u) = &req.user {
        o["user"] = Value::from(u.clone());
    }
    o
}

/// Reads an OpenAI `list` of `embedding` objects (ordered by their `index`) and its usage.
pub fn parse_embeddings(body: &Value) -> Result<Embeddings, ErrorInfo> {
    let bad =
        |what: &str| ErrorInfo::new(ErrorClass::Protocol, format!("upstream embeddings: {what}"));
    let data = body
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no `data` array"))?;
    let mut indexed: Vec<(u64, Vec<f32>)> = Vec::with_capacity(data.len());
    for (i, item) in data.iter().enumerate() {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(i as u64);
        let vector = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("an item has no float `embedding`"))?
            .iter()
            .map(|x| x.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| bad("a non-number in `embedding`"))?;
        indexed.push((index, vector));
    }
    indexed.sort_by_key(|(i, _)| *i);
    let prompt = body
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Ok(Embeddings {
        vectors: indexed.into_iter().map(|(_, v)| v).collect(),
        usage: Usage {
            prompt_tokens: prompt,
            ..Usage::default()
        },
    })
}

/// Builds the upstream JSON body (fails only if JSON encoding does). Public for tests and
/// benchmarks.
pub fn build_body(
    kind: ProviderKind,
    upstream_model: &str,
    req: &ChatRequest,
) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&Value::Object(build_object(kind, upstream_model, req)))
}

/// The upstream JSON body as an object, for adapters that speak a dialect of this wire format
/// (Azure OpenAI adjusts a few keys) — see [`build_body`].
///
/// Beyond the normalised fields: `logprobs` / `top_logprobs` go to every OpenAI-style upstream
/// (the answer's `logprobs.content` entries come back as `logprobs` frames); `reasoning_effort` and the [`Passthrough::OPENAI`] fields (`service_tier`,
/// `prediction`, `logit_bias`, …) only to OpenAI and Azure OpenAI (`kind` `openai`), since
/// compatible servers commonly reject unknown fields. `thinking_blocks` are never sent; `top_k`
/// and the Anthropic passthrough are not either.
pub fn build_object(
    kind: ProviderKind,
    upstream_model: &str,
    req: &ChatRequest,
) -> Map<String, Value> {
    let mut o = Map::new();
    o.insert("model".into(), Value::String(upstream_model.to_owned()));
    let messages: Vec<Value> = req
        .messages
        .iter()
        .map(|m| {
            let mut v = serde_json::to_value(m).unwrap_or(Value::Null);
            // Signed thinking blocks are Anthropic's: OpenAI-style servers do not take them back.
            // Nor Anthropic's cache breakpoints.
            if let Some(o) = v.as_object_mut() {
                o.remove("thinking_blocks");
                o.remove("cache_control");
            }
            // Many compatible servers predate the `developer` role.
            if kind == ProviderKind::OpenaiCompatible && m.role == Role::Developer {
                v["role"] = Value::String("system".into());
            }
            v
        })
        .collect();
    o.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        o.insert(
            "tools".into(),
            serde_json::to_value(&req.tools).unwrap_or(Value::Null),
        );
    }
    if let Some(tc) = &req.tool_choice {
        o.insert("tool_choice".into(), tc.clone());
    }
    let p = &req.params;
    let mut put = |k: &str, v| crate::providers::shared::put_some(&mut o, k, v);
    put("temperature", p.temperature.map(Value::from));
    put("top_p", p.top_p.map(Value::from));
    // OpenAI deprecated `max_tokens` for `max_completion_tokens`; compatible servers mostly know the old name.
    let max_key = if kind == ProviderKind::Openai {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    put(max_key, p.max_tokens.map(Value::from));
    put("stop", (!p.stop.is_empty()).then(|| json!(p.stop)));
    put("n", p.n.map(Value::from));
    put("seed", p.seed.map(Value::from));
    put("presence_penalty", p.presence_penalty.map(Value::from));
    put("frequency_penalty", p.frequency_penalty.map(Value::from));
    put("response_format", p.response_format.clone());
    put(
        "parallel_tool_calls",
        p.parallel_tool_calls.map(Value::from),
    );
    put("user", p.user.as_deref().map(user_field).map(Value::from));
    put("logprobs", p.logprobs.map(Value::from));
    put("top_logprobs", p.top_logprobs.map(Value::from));
    // OpenAI's reasoning models take `reasoning_effort`; compatible servers mostly reject it.
    if kind == ProviderKind::Openai {
        put(
            "reasoning_effort",
            p.reasoning_effort.clone().map(Value::from),
        );
        if let Some(extra) = req.passthrough.get(Passthrough::OPENAI) {
            for (k, v) in &extra.body {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    if req.stream {
        o.insert("stream".into(), Value::Bool(true));
        o.insert("stream_options".into(), json!({"include_usage": true}));
    }
    o
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

/// The `Accept` header for `body`: SSE for a stream request, JSON otherwise.
pub fn accept(body: &Map<String, Value>) -> &'static str {
    if body.contains_key("stream") {
        "text/event-stream"
    } else {
        "application/json"
    }
}

/// Targets (`<target id>|<base URL>`) that rejected `stream_options` in this process. Bounded by
/// the number of configured targets.
static REJECTS_STREAM_OPTIONS: LazyLock<Mutex<HashSet<String>>> =
    LazyLock::new(|| Mutex::new(HashSet::new()));

/// Whether an upstream failure is a 400/422 naming `stream_options` (FC-12 variant).
pub fn rejects_stream_options(e: &ErrorInfo) -> bool {
    matches!(e.upstream_status, Some(400 | 422)) && e.message.contains("stream_options")
}

/// Sends a chat body built by [`build_object`] with `make`; a 400 that names `stream_options`
/// is answered by one more call without it, and `memo` (the target) is remembered so later calls
/// leave it out from the start. Shared by the OpenAI, compatible and Azure adapters.
pub async fn send_chat(
    mut body: Map<String, Value>,
    memo: &str,
    make: impl Fn(&Map<String, Value>) -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, ErrorInfo> {
    let known = REJECTS_STREAM_OPTIONS.lock().contains(memo);
    if known {
        body.remove("stream_options");
    }
    match send_checked(make(&body)).await {
        Err(e) if !known && body.contains_key("stream_options") && rejects_stream_options(&e) => {
            tracing::info!(target = memo, error = %e, "upstream rejects stream_options: calling again without");
            REJECTS_STREAM_OPTIONS.lock().insert(memo.to_owned());
            body.remove("stream_options");
            send_checked(make(&body)).await
        }
        r => r,
    }
}

/// Reads a successful chat answer by its `Content-Type`: one `chat.completion` JSON object
/// ([`parse_completion`]) or a chunk stream through `translator`.
pub fn read_answer<T: SseTranslator>(resp: reqwest::Response, translator: T) -> EventStream {
    crate::providers::shared::read_answer(resp, parse_completion, translator)
}

/// Reads a `chat.completion` object (OpenAI API reference, "The chat completion object"): each
/// choice's `message.content` (a string, or text parts), `message.tool_calls`, `finish_reason`
/// and `logprobs.content`, ordered by `index` (choice 0 in the answer itself, the others, for
/// `n > 1`, in [`Answer::more_choices`]), and the one `usage`.
pub fn parse_completion(v: &Value) -> Result<Answer, ErrorInfo> {
    let mut choices: Vec<&Value> = v
        .get("choices")
        .and_then(Value::as_array)
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    if choices.is_empty() {
        return Err(ErrorInfo::new(
            ErrorClass::Protocol,
            "upstream JSON answer has no `choices`",
        ));
    }
    choices.sort_by_key(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0));
    let mut answers = choices.into_iter().map(parse_choice);
    let mut first = answers.next().unwrap_or_default();
    first.more_choices = answers.collect();
    first.usage = v
        .get("usage")
        .and_then(parse_usage)
        .map(|u| with_service_tier(u, v));
    Ok(first)
}

/// One choice of a `chat.completion` object, without usage.
fn parse_choice(choice: &Value) -> Answer {
    let message = choice.get("message").unwrap_or(&Value::Null);
    let text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    };
    let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let tool_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let f = c.get("function").unwrap_or(&Value::Null);
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(other) if !other.is_null() => other.to_string(),
                _ => String::new(),
            };
            (str_of(c, "id"), str_of(f, "name"), arguments)
        })
        .collect();
    let thinking = message
        .get("reasoning_content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(|t| switchyard_schemas::request::ThinkingBlock::Thinking {
            thinking: t.to_owned(),
            signature: None,
        })
        .into_iter()
        .collect();
    Answer {
        logprobs: logprob_content(choice).unwrap_or_default(),
        thinking,
        text,
        tool_calls,
        usage: None,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map_or(FinishReason::Stop, map_finish),
        more_choices: Vec::new(),
    }
}

/// A choice's non-empty `logprobs.content` entries.
fn logprob_content(choice: &Value) -> Option<Vec<Value>> {
    choice
        .pointer("/logprobs/content")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
        .cloned()
}

/// Translates `chat.completion.chunk` events. Every chunk's choices are read, each by its
/// `index`: a change of index becomes a [`FrameBody::Choice`] frame, and with `n > 1` each
/// choice's `finish_reason` a [`FrameBody::ChoiceEnd`] (OpenAI streams one choice per chunk,
/// interleaved, each ending with its own `finish_reason` chunk, then one usage chunk).
#[derive(Debug, Default)]
pub struct OpenAiTranslator {
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    /// The request asked for several choices (`n > 1`).
    multi: bool,
    /// The choice the last content frame belonged to.
    current: u32,
}

impl OpenAiTranslator {
    /// The translator of `req`'s answer (several choices when `params.n > 1`).
    pub fn for_request(req: &ChatRequest) -> Self {
        Self {
            multi: req.params.n.is_some_and(|n| n > 1),
            ..Self::default()
        }
    }

    fn switch_to(&mut self, index: u32, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) {
        if index != self.current {
            self.current = index;
            out.push_back(Ok(FrameBody::Choice { index }));
        }
    }
}

fn map_finish(s: &str) -> FinishReason {
    match s {
        "length" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    }
}

/// Reads OpenAI's usage object into the normalised struct (parts are subsets, see [`Usage`]):
/// `prompt_tokens_details.cached_tokens` and `.audio_tokens`,
/// `completion_tokens_details.reasoning_tokens` and `.audio_tokens` (OpenAI API reference, "The
/// chat completion object", `usage`). `accepted_prediction_tokens` and
/// `rejected_prediction_tokens` (Predicted Outputs) are already inside `completion_tokens` and
/// billed as output, so they are not kept apart. The response's top-level `service_tier` is
/// read by the caller ([`with_service_tier`]).
pub fn parse_usage(u: &Value) -> Option<Usage> {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    if !u.is_object() {
        return None;
    }
    Some(Usage {
        prompt_tokens: n(u.get("prompt_tokens")),
        cached_tokens: n(u.pointer("/prompt_tokens_details/cached_tokens")),
        cache_write_tokens: 0,
        completion_tokens: n(u.get("completion_tokens")),
        reasoning_tokens: n(u.pointer("/completion_tokens_details/reasoning_tokens")),
        audio_input_tokens: n(u.pointer("/prompt_tokens_details/audio_tokens")),
        audio_output_tokens: n(u.pointer("/completion_tokens_details/audio_tokens")),
        ..Usage::default()
    })
}

/// `usage` with the service tier of `response` (a chat completion or chunk): OpenAI reports the
/// tier that served the request in the top-level `service_tier` (`default`, `flex`,
/// `priority`, …; API reference, "The chat completion object").
pub fn with_service_tier(mut usage: Usage, response: &Value) -> Usage {
    if let Some(t) = response.get("service_tier").and_then(Value::as_str) {
        usage.service_tier = switchyard_schemas::usage::ServiceTier::from_provider(t);
    }
    usage
}

impl OpenAiTranslator {
    /// The content of one choice of a chunk: its `logprobs.content`, then `delta`'s reasoning,
    /// text and tool-call pieces.
    fn on_choice(&mut self, choice: &Value, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) {
        // Before the chunk's text: the OpenAI door puts them on that text's chunk, as OpenAI does.
        if let Some(content) = logprob_content(choice) {
            out.push_back(Ok(FrameBody::Logprobs { content }));
        }
        let Some(delta) = choice.get("delta") else {
            return;
        };
        // Reasoning text of compatible servers (DeepSeek, vLLM: `reasoning_content`;
        // OpenRouter, Ollama: `reasoning`).
        let reasoning = delta
            .get("reasoning_content")
            .or_else(|| delta.get("reasoning"))
            .and_then(Value::as_str);
        if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
            out.push_back(Ok(FrameBody::Reasoning {
                text: text.to_owned(),
            }));
        }
        if let Some(text) = delta.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            out.push_back(Ok(FrameBody::Text {
                text: text.to_owned(),
            }));
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (i, c) in calls.iter().enumerate() {
                let f = c.get("function");
                out.push_back(Ok(FrameBody::ToolCall {
                    index: c.get("index").and_then(Value::as_u64).unwrap_or(i as u64) as u32,
                    id: c.get("id").and_then(Value::as_str).map(str::to_owned),
                    name: f
                        .and_then(|f| f.get("name"))
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    arguments: f
                        .and_then(|f| f.get("arguments"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                }));
            }
        }
    }

    fn finish(&mut self, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) {
        if let Some(usage) = self.usage {
            out.push_back(Ok(FrameBody::Usage { usage }));
        }
        let finish_reason = self.finish.unwrap_or(FinishReason::Stop);
        out.push_back(Ok(FrameBody::End { finish_reason }));
    }
}

impl SseTranslator for OpenAiTranslator {
    fn on_event(&mut self, ev: SseEvent, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) -> bool {
        let data = ev.data.trim();
        if data == "[DONE]" {
            self.finish(out);
            return true;
        }
        if data.is_empty() {
            return false;
        }
        let Some(v) = crate::providers::shared::parse_event(data, "chunk", out) else {
            return true;
        };
        // Errors can arrive inside an HTTP 200 stream, also in vLLM's top-level shape.
        if v.get("error").is_some() || v.get("object").and_then(Value::as_str) == Some("error") {
            out.push_back(Err(crate::providers::classify::stream_error(&v)));
            return true;
        }
        if let Some(u) = v
            .get("usage")
            .and_then(parse_usage)
            .map(|u| with_service_tier(u, &v))
        {
            // Some servers repeat cumulative usage on every chunk: keep the last, never sum.
            self.usage = Some(u);
            // The `choices: []` usage chunk is the last one before `[DONE]` (OpenAI "Streaming"
            // docs). Finish here: an upstream that then only sends keep-alives and never
            // `[DONE]` (FC-08) must not hold the client.
            let usage_only = v
                .get("choices")
                .and_then(Value::as_array)
                .is_some_and(Vec::is_empty);
            if usage_only && self.finish.is_some() {
                self.finish(out);
                return true;
            }
        }
        let choices = v.get("choices").and_then(Value::as_array);
        for (i, choice) in choices.into_iter().flatten().enumerate() {
            let index = choice
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(i as u64) as u32;
            self.switch_to(index, out);
            self.on_choice(choice, out);
            if let Some(fr) = choice.get("finish_reason").and_then(Value::as_str) {
                let finish_reason = map_finish(fr);
                if self.multi {
                    out.push_back(Ok(FrameBody::ChoiceEnd {
                        index,
                        finish_reason,
                    }));
                }
                // `end` carries choice 0's reason.
                if index == 0 || self.finish.is_none() {
                    self.finish = Some(finish_reason);
                }
            }
        }
        false
    }

    fn on_eof(&mut self, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) {
        // Lenient: some compatible servers omit `[DONE]` but did send a finish_reason.
        if self.finish.is_some() {
            self.finish(out);
        } else {
            out.push_back(Err(ErrorInfo::new(
                ErrorClass::Protocol,
                "upstream stream ended before [DONE] or a finish_reason",
            )));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A rich request: every message role and part kind, Anthropic-only fields (thinking
    /// blocks, cache breakpoints, `top_k`, the Anthropic passthrough), every OpenAI parameter
    /// and the OpenAI passthrough.
    pub(crate) fn rich_request() -> ChatRequest {
        let messages = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
            {"role": "user", "name": "ann", "cache_control": {"type": "ephemeral"}, "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url",
                    "image_url": {"url": "https://e.com/a.png", "detail": "high"}},
                {"type": "file", "file": {"filename": "r.pdf",
                    "file_data": "data:application/pdf;base64,JVBE"}}]},
            {"role": "assistant", "content": "Let me check.", "thinking_blocks": [
                {"type": "thinking", "thinking": "t", "signature": "sig"}],
                "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "user", "content": "Thanks"}
        ]);
        let extra = json!({
            "tools": [{"type": "function", "function": {"name": "weather", "description": "w",
                "parameters": {"type": "object"}, "strict": true}}],
            "tool_choice": "auto",
            "params": {"max_tokens": 300, "temperature": 0.5, "top_p": 0.9, "stop": ["END"],
                "n": 2, "seed": 7, "presence_penalty": 0.5, "frequency_penalty": -0.5,
                "response_format": {"type": "json_object"}, "parallel_tool_calls": false,
                "user": "u-1", "logprobs": true, "top_logprobs": 2, "reasoning_effort": "low",
                "top_k": 3},
            "passthrough": {
                "openai": {"body": {"service_tier": "flex", "logit_bias": {"1": 2}}},
                "anthropic": {"body": {"thinking": {"type": "adaptive"}}}}});
        let target = ("t", "openai", "gpt-test");
        crate::providers::test_support::request("m", target, messages, extra)
    }

    /// [`rich_request`]'s body for `kind` (`max_key` and `developer` as that dialect sends
    /// them, `openai_only` the fields only OpenAI itself gets).
    pub(crate) fn rich_body(max_key: &str, developer: &str, openai_only: bool) -> Value {
        let mut body = json!({
            "model": "up",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": developer, "content": [{"type": "text", "text": "Use French."}]},
                {"role": "user", "name": "ann", "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url",
                        "image_url": {"url": "https://e.com/a.png", "detail": "high"}},
                    {"type": "file", "file": {"filename": "r.pdf",
                        "file_data": "data:application/pdf;base64,JVBE"}}]},
                {"role": "assistant", "content": "Let me check.",
                    "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "user", "content": "Thanks"}
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "description": "w",
                "parameters": {"type": "object"}, "strict": true}}],
            "tool_choice": "auto",
            "temperature": 0.5,
            "top_p": 0.9,
            max_key: 300,
            "stop": ["END"],
            "n": 2,
            "seed": 7,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "response_format": {"type": "json_object"},
            "parallel_tool_calls": false,
            "user": "u-1",
            "logprobs": true,
            "top_logprobs": 2,
            "stream": true,
            "stream_options": {"include_usage": true}
        });
        if openai_only {
            let o = body.as_object_mut().unwrap();
            o.insert("reasoning_effort".into(), json!("low"));
            o.insert("service_tier".into(), json!("flex"));
            o.insert("logit_bias".into(), json!({"1": 2}));
        }
        body
    }

    /// The whole body for OpenAI and for a compatible server; a minimal request's body.
    #[test]
    fn whole_bodies() {
        let req = rich_request();
        let openai = Value::Object(build_object(ProviderKind::Openai, "up", &req));
        assert_eq!(
            openai,
            rich_body("max_completion_tokens", "developer", true)
        );
        let compatible = Value::Object(build_object(ProviderKind::OpenaiCompatible, "up", &req));
        assert_eq!(compatible, rich_body("max_tokens", "system", false));
        let user = json!([{"role": "user", "content": "x"}]);
        let target = ("t", "openai", "gpt-test");
        let extra = json!({"stream": false});
        let req = crate::providers::test_support::request("m", target, user, extra);
        assert_eq!(
            Value::Object(build_object(ProviderKind::Openai, "up", &req)),
            json!({"model": "up", "messages": [{"role": "user", "content": "x"}]})
        );
        let mut req = rich_request();
        req.params.user = Some("u".repeat(65));
        let o = build_object(ProviderKind::Openai, "up", &req);
        assert_eq!(o["user"], json!(user_field(&"u".repeat(65))));
    }

    /// The embeddings body: floats, with `dimensions` and `user` when given.
    #[test]
    fn embed_bodies() {
        let req: EmbedRequest = serde_json::from_value(json!({
            "id": "01900000-0000-7000-8000-000000000000", "model": "m",
            "target": {"id": "t", "provider": "openai", "upstream_model": "e"},
            "input": ["a", "b"], "dimensions": 8, "user": "u-1", "deadline_ms": 0}))
        .unwrap();
        assert_eq!(
            embed_body("up", &req),
            json!({"model": "up", "input": ["a", "b"], "encoding_format": "float",
                "dimensions": 8, "user": "u-1"})
        );
    }
}
