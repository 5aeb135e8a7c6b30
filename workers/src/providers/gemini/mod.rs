//! Google Gemini API adapter: `POST {base_url}/models/{model}:streamGenerateContent?alt=sse`
//! (`:generateContent` for non-streaming clients; any `application/json` answer is read whole) with
//! the key in `x-goog-api-key` (Gemini API reference, "API reference" → authentication), e.g.
//! `base_url: https://generativelanguage.googleapis.com/v1beta`.
//!
//! Request translation follows the Gemini API reference, "Generating content"
//! (`GenerateContentRequest`: `contents[]` of `{role: user|model, parts[]}`, `systemInstruction`,
//! `tools[].functionDeclarations[]`, `toolConfig.functionCallingConfig`, `generationConfig`) and
//! the "Function calling" guide (`functionCall` / `functionResponse` parts). Stream translation:
//! with `alt=sse` every SSE `data:` is one `GenerateContentResponse`; text and whole function calls
//! arrive as `candidates[0].content.parts[]`, `finishReason` marks the last chunk, `usageMetadata`
//! is cumulative (the last one wins), and there is no `[DONE]`: the stream simply ends.

use std::collections::VecDeque;

use reqwest::header::ACCEPT;
use serde_json::Value;
use switchyard_schemas::config::ProviderKind;
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage};

use crate::provider::{
    Answer, Call, EventStream, Provider, SseTranslator, Upstream, accept_for, send_checked,
};
use crate::sse::SseEvent;

/// MIME type assumed for an `http(s)` image URL whose extension says nothing (`fileData.mimeType`
/// is required; Gemini API reference, "Content" → `FileData`).
pub const DEFAULT_IMAGE_MIME: &str = "image/jpeg";

/// `thoughtSignature` sent on the first `functionCall` part of each replayed model turn. Gemini 3
/// models reject function-call history without signatures (400); OpenAI-shaped history cannot
/// carry the real ones, and the Gemini API "Thought signatures" FAQ documents this value for
/// history that did not come from the same model.
pub const THOUGHT_SIGNATURE_SKIP: &str = "skip_thought_signature_validator";

/// Adapter for the Google Gemini API (`{base_url}/models/{model}:streamGenerateContent?alt=sse`
/// for streaming clients, `:generateContent` for the others; `x-goog-api-key` auth). Stateless.
#[derive(Debug, Clone, Copy, Default)]
pub struct GeminiProvider;

impl Provider for GeminiProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Gemini
    }

    fn stream_chat(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<EventStream> {
        let body = build_request(req).map(|body| body.to_string());
        let structured = matches!(json_tool(req), Ok(Some(_)));
        let url = if req.stream {
            stream_url(up.base_url, &up.target.upstream_model)
        } else {
            generate_url(up.base_url, &up.target.upstream_model)
        };
        let mut builder = up.post_json(&url).header(ACCEPT, accept_for(req.stream));
        let key = api_key_header(up.target);
        Box::pin(async move {
            let body = body?;
            if let Some(key) = key? {
                builder = builder.header("x-goog-api-key", key);
            }
            let resp = send_checked(builder.body(body)).await?;
            let parse = if structured {
                parse_structured_response
            } else {
                parse_response
            };
            let translator = GeminiTranslator {
                structured,
                ..GeminiTranslator::default()
            };
            Ok(read_answer(resp, None, parse, translator))
        })
    }
}

/// `{base_url}/models/{model}:streamGenerateContent?alt=sse` (Gemini API reference, "Generating
/// content" → `models.streamGenerateContent`); a `models/` prefix on the model id (the resource
/// name form `models.list` returns) is accepted.
pub fn stream_url(base_url: &str, upstream_model: &str) -> String {
    let model = upstream_model.trim_start_matches("models/");
    let base = base_url.trim_end_matches('/');
    format!("{base}/models/{model}:streamGenerateContent?alt=sse")
}

/// `{base_url}/models/{model}:generateContent` (Gemini API reference, `models.generateContent`),
/// for non-streaming clients.
pub fn generate_url(base_url: &str, upstream_model: &str) -> String {
    let model = upstream_model.trim_start_matches("models/");
    format!(
        "{}/models/{model}:generateContent",
        base_url.trim_end_matches('/')
    )
}

/// Reads a whole `GenerateContentResponse` — the shape of one stream chunk — with the stream
/// translator, then collects it ([`Answer::from_frames`]). A JSON array of chunks (the stream
/// without `alt=sse`) is read the same way.
fn parse_response(v: &Value) -> Result<Answer, ErrorInfo> {
    parse_with(v, GeminiTranslator::default())
}

/// [`parse_response`] for a request that declared [`JSON_TOOL`].
fn parse_structured_response(v: &Value) -> Result<Answer, ErrorInfo> {
    let t = GeminiTranslator {
        structured: true,
        ..GeminiTranslator::default()
    };
    parse_with(v, t)
}

fn parse_with(v: &Value, mut t: GeminiTranslator) -> Result<Answer, ErrorInfo> {
    let mut out = VecDeque::new();
    match v.as_array() {
        Some(chunks) => {
            for c in chunks {
                t.chunk(c, &mut out)?;
            }
        }
        None => t.chunk(v, &mut out)?,
    }
    t.on_eof(&mut out);
    Answer::from_frames(out)
}

use crate::providers::shared::{JSON_TOOL, api_key_header, protocol, read_answer};

mod request;
use request::json_tool;
pub use request::{GEMINI_DROPPED_KEYWORDS, build_request, gemini_schema};

type Item = Result<FrameBody, ErrorInfo>;

/// Gemini stream → normalised events: `Text`, whole `ToolCall`s, then (at the end of the byte
/// stream, Gemini has no end marker) one `Usage` and `End`; a stream that ends without any
/// `finishReason` is a `protocol` error.
#[derive(Debug, Default)]
pub struct GeminiTranslator {
    /// From `candidates[0].finishReason`.
    finish: Option<FinishReason>,
    /// The last `usageMetadata` (cumulative).
    usage: Option<Usage>,
    /// Function calls seen so far (the next tool index).
    calls: u32,
    /// The request declared [`JSON_TOOL`]: its call is the text answer, other text is held in
    /// `held` until the end and dropped when [`JSON_TOOL`] answered (as on Anthropic).
    structured: bool,
    /// [`JSON_TOOL`] was called.
    json_answered: bool,
    /// Text written while `structured`.
    held: String,
}

impl SseTranslator for GeminiTranslator {
    fn on_event(&mut self, ev: SseEvent, out: &mut VecDeque<Item>) -> bool {
        let data = ev.data.trim();
        if data.is_empty() {
            return false;
        }
        match serde_json::from_str::<Value>(data) {
            Ok(v) => match self.chunk(&v, out) {
                Ok(()) => false,
                Err(e) => {
                    out.push_back(Err(e));
                    true
                }
            },
            Err(e) => {
                out.push_back(Err(protocol(format!(
                    "upstream sent an unparsable stream chunk: {e}"
                ))));
                true
            }
        }
    }

    fn on_eof(&mut self, out: &mut VecDeque<Item>) {
        let Some(finish) = self.finish else {
            out.push_back(Err(protocol(
                "upstream stream ended before any finishReason",
            )));
            return;
        };
        if !self.json_answered && !self.held.is_empty() {
            let text = std::mem::take(&mut self.held);
            out.push_back(Ok(FrameBody::Text { text }));
        }
        if let Some(usage) = self.usage {
            out.push_back(Ok(FrameBody::Usage { usage }));
        }
        // Gemini says STOP after function calls; OpenAI's vocabulary says tool_calls.
        let finish_reason = match finish {
            FinishReason::Stop if self.calls > 0 => FinishReason::ToolCalls,
            other => other,
        };
        out.push_back(Ok(FrameBody::End { finish_reason }));
    }
}

impl GeminiTranslator {
    /// Handles one `GenerateContentResponse` (or an in-stream `{"error":…}`).
    fn chunk(&mut self, v: &Value, out: &mut VecDeque<Item>) -> Result<(), ErrorInfo> {
        if v.get("error").is_some() {
            return Err(crate::providers::classify::stream_error(v));
        }
        if let Some(reason) = v
            .pointer("/promptFeedback/blockReason")
            .and_then(Value::as_str)
        {
            return Err(ErrorInfo::new(
                ErrorClass::InvalidRequest,
                format!("the prompt was blocked by Gemini (blockReason {reason})"),
            ));
        }
        if let Some(u) = v.get("usageMetadata").filter(|u| u.is_object()) {
            self.usage = Some(parse_usage(u));
        }
        let candidates = v.get("candidates").and_then(Value::as_array);
        // One choice only: the candidate with index 0 (the field is omitted when 0).
        let Some(candidate) = candidates
            .into_iter()
            .flatten()
            .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        else {
            return Ok(());
        };
        let parts = candidate
            .pointer("/content/parts")
            .and_then(Value::as_array);
        for part in parts.into_iter().flatten() {
            // Thought summaries (`thought: true`) are not part of the answer.
            if part.get("thought").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            if let Some(text) = part.get("text").and_then(Value::as_str)
                && !text.is_empty()
            {
                if self.structured {
                    self.held.push_str(text);
                } else {
                    out.push_back(Ok(FrameBody::Text {
                        text: text.to_owned(),
                    }));
                }
            }
            if let Some(call) = part.get("functionCall") {
                if self.structured && call.get("name").and_then(Value::as_str) == Some(JSON_TOOL) {
                    self.json_answered = true;
                    let text = match call.get("args") {
                        Some(args @ Value::Object(_)) => args.to_string(),
                        _ => "{}".to_owned(),
                    };
                    out.push_back(Ok(FrameBody::Text { text }));
                } else {
                    out.push_back(Ok(self.tool_call(call)?));
                }
            }
        }
        if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str)
            && let Some(f) = finish_reason(reason)
        {
            self.finish = Some(f);
        }
        Ok(())
    }

    /// A whole `functionCall{id?,name,args}` → one `ToolCall` piece. Gemini API calls usually
    /// carry no id, so `call_<n>` is generated (n = the call's index in this response).
    fn tool_call(&mut self, call: &Value) -> Result<FrameBody, ErrorInfo> {
        let name = call.get("name").and_then(Value::as_str);
        let name = name.ok_or_else(|| protocol("functionCall without a name"))?;
        let index = self.calls;
        self.calls += 1;
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map_or_else(|| format!("call_{index}"), str::to_owned);
        let arguments = match call.get("args") {
            Some(args @ Value::Object(_)) => args.to_string(),
            _ => "{}".to_owned(),
        };
        Ok(FrameBody::ToolCall {
            index,
            id: Some(id),
            name: Some(name.to_owned()),
            arguments,
        })
    }
}

/// Gemini `usageMetadata` → normalised usage: `promptTokenCount` already includes
/// `cachedContentTokenCount`; Gemini counts thinking separately (`thoughtsTokenCount`), while our
/// `completion_tokens` includes reasoning, so it is `candidatesTokenCount + thoughtsTokenCount`.
fn parse_usage(u: &Value) -> Usage {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let thoughts = n("thoughtsTokenCount");
    Usage {
        prompt_tokens: n("promptTokenCount"),
        cached_tokens: n("cachedContentTokenCount"),
        cache_write_tokens: 0,
        completion_tokens: n("candidatesTokenCount").saturating_add(thoughts),
        reasoning_tokens: thoughts,
        ..Default::default()
    }
}

/// Gemini `finishReason` → OpenAI `finish_reason` (Gemini API reference, `Candidate.FinishReason`);
/// `None` for `FINISH_REASON_UNSPECIFIED`. Blocked output (`SAFETY`, `RECITATION`, `BLOCKLIST`,
/// `PROHIBITED_CONTENT`, `SPII`, `IMAGE_SAFETY`, …) is `content_filter`; `LANGUAGE`, `OTHER`,
/// `MALFORMED_FUNCTION_CALL` and unknown reasons end the answer as `stop`.
fn finish_reason(reason: &str) -> Option<FinishReason> {
    Some(match reason {
        "FINISH_REASON_UNSPECIFIED" => return None,
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" => {
            FinishReason::ContentFilter
        }
        r if r.starts_with("IMAGE_") => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    })
}

#[cfg(test)]
mod tests;
