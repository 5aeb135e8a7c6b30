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
    Answer, Call, Embeddings, EventStream, Provider, SseTranslator, Upstream, accept_for,
    post_json, send_checked,
};
use crate::sse::SseEvent;
use futures::FutureExt;

mod chunk;
mod completion;
mod request;
use parking_lot::Mutex;
pub use request::{
    ChatDialect, EmbeddingsBody, MAX_USER_CHARS, build_body, build_object, embed_body, user_field,
};
use serde_json::{Map, Value};
use std::collections::{HashSet, VecDeque};
use std::sync::LazyLock;
use switchyard_schemas::config::{OpenAiApi, ProviderKind};
use switchyard_schemas::embed::EmbedRequest;
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
        let target = up.target;
        if target.api == OpenAiApi::Responses {
            return crate::providers::openai_responses::stream_chat(up, req);
        }
        let body = build_object(ChatDialect::of(self.kind), &target.upstream_model, req);
        let url = up.url("/chat/completions");
        let (http, key, id) = (up.http.clone(), target.api_key.clone(), req.id);
        let make = move |body: &Map<String, Value>| {
            let mut rb = post_json(&http, &url)
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
        let memo = format!("{}|{}", target.id, up.base_url);
        let translator = OpenAiTranslator::for_request(req);
        async move {
            let resp = send_chat(body?, &memo, make).await?;
            Ok(read_answer(resp, translator))
        }
        .boxed()
    }

    fn embed(&self, up: Upstream<'_>, req: &EmbedRequest) -> Call<Embeddings> {
        let target = up.target;
        let mut rb = up
            .http
            .post(up.url("/embeddings"))
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

/// The `Accept` header for `body`: SSE for a stream request, JSON otherwise.
pub fn accept(body: &Map<String, Value>) -> &'static str {
    accept_for(body.contains_key("stream"))
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
    crate::providers::shared::read_answer(
        resp,
        Some(completion::parse),
        parse_completion,
        translator,
    )
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
pub fn with_service_tier(usage: Usage, response: &Value) -> Usage {
    with_tier(usage, response.get("service_tier").and_then(Value::as_str))
}

/// The text pieces of a delta as frames: reasoning (compatible servers: DeepSeek and vLLM send
/// `reasoning_content`, OpenRouter and Ollama `reasoning`), then content; empty pieces are
/// skipped.
fn on_text(
    reasoning: Option<&str>,
    content: Option<&str>,
    out: &mut VecDeque<Result<FrameBody, ErrorInfo>>,
) {
    if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
        out.push_back(Ok(FrameBody::Reasoning {
            text: text.to_owned(),
        }));
    }
    if let Some(text) = content.filter(|t| !t.is_empty()) {
        out.push_back(Ok(FrameBody::Text {
            text: text.to_owned(),
        }));
    }
}

fn with_tier(mut usage: Usage, tier: Option<&str>) -> Usage {
    if let Some(t) = tier {
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
        let text = |k: &str| delta.get(k).and_then(Value::as_str);
        on_text(
            text("reasoning_content").or_else(|| text("reasoning")),
            text("content"),
            out,
        );
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (i, c) in calls.iter().enumerate() {
                let f = |k: &str| {
                    c.get("function")
                        .and_then(|f| f.get(k))
                        .and_then(Value::as_str)
                };
                out.push_back(Ok(FrameBody::ToolCall {
                    index: c.get("index").and_then(Value::as_u64).unwrap_or(i as u64) as u32,
                    id: c.get("id").and_then(Value::as_str).map(str::to_owned),
                    name: f("name").map(str::to_owned),
                    arguments: f("arguments").unwrap_or("").to_owned(),
                }));
            }
        }
    }

    /// [`SseTranslator::on_event`] for a [`chunk::Chunk`]: what [`Self::on_value`] does for the
    /// same chunk read as a `Value`.
    fn on_chunk(
        &mut self,
        chunk: chunk::Chunk<'_>,
        out: &mut VecDeque<Result<FrameBody, ErrorInfo>>,
    ) -> bool {
        if let Some(u) = chunk.usage.as_ref().and_then(parse_usage) {
            let usage_only = chunk.choices.as_ref().is_some_and(Vec::is_empty);
            if self.on_usage(with_tier(u, chunk.service_tier.as_deref()), usage_only, out) {
                return true;
            }
        }
        for (i, choice) in chunk.choices.into_iter().flatten().enumerate() {
            let index = choice.index.unwrap_or(i as u64) as u32;
            self.switch_to(index, out);
            if let Some(d) = &choice.delta {
                let reasoning = d.reasoning_content.as_deref().or(d.reasoning.as_deref());
                on_text(reasoning, d.content.as_deref(), out);
                for (j, c) in d.tool_calls.iter().flatten().enumerate() {
                    let f = c.function.as_ref();
                    out.push_back(Ok(FrameBody::ToolCall {
                        index: c.index.unwrap_or(j as u64) as u32,
                        id: c.id.as_deref().map(str::to_owned),
                        name: f.and_then(|f| f.name.as_deref()).map(str::to_owned),
                        arguments: f
                            .and_then(|f| f.arguments.as_deref())
                            .unwrap_or("")
                            .to_owned(),
                    }));
                }
            }
            if let Some(fr) = choice.finish_reason.as_deref() {
                self.on_finish_reason(index, fr, out);
            }
        }
        false
    }

    /// [`SseTranslator::on_event`] for a chunk read as a `Value`: any shape, errors included.
    fn on_value(&mut self, v: &Value, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) -> bool {
        // Errors can arrive inside an HTTP 200 stream, also in vLLM's top-level shape.
        if v.get("error").is_some() || v.get("object").and_then(Value::as_str) == Some("error") {
            out.push_back(Err(crate::providers::classify::stream_error(v)));
            return true;
        }
        if let Some(u) = v
            .get("usage")
            .and_then(parse_usage)
            .map(|u| with_service_tier(u, v))
        {
            let usage_only = v
                .get("choices")
                .and_then(Value::as_array)
                .is_some_and(Vec::is_empty);
            if self.on_usage(u, usage_only, out) {
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
                self.on_finish_reason(index, fr, out);
            }
        }
        false
    }

    /// A chunk's usage. Some servers repeat cumulative usage on every chunk: keep the last, never
    /// sum. True when it ends the stream.
    fn on_usage(
        &mut self,
        usage: Usage,
        usage_only: bool,
        out: &mut VecDeque<Result<FrameBody, ErrorInfo>>,
    ) -> bool {
        self.usage = Some(usage);
        // The `choices: []` usage chunk is the last one before `[DONE]` (OpenAI "Streaming"
        // docs). Finish here: an upstream that then only sends keep-alives and never `[DONE]`
        // (FC-08) must not hold the client.
        if usage_only && self.finish.is_some() {
            self.finish(out);
            return true;
        }
        false
    }

    fn on_finish_reason(
        &mut self,
        index: u32,
        reason: &str,
        out: &mut VecDeque<Result<FrameBody, ErrorInfo>>,
    ) {
        let finish_reason = map_finish(reason);
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
        if let Some(chunk) = chunk::parse(data) {
            return self.on_chunk(chunk, out);
        }
        match crate::providers::shared::parse_event(data, "chunk", out) {
            Some(v) => self.on_value(&v, out),
            None => true,
        }
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
pub(crate) mod tests;
