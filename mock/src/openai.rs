//! OpenAI Chat Completions wire format: `chat.completion`, `chat.completion.chunk`, errors.

use serde_json::{Value, json};

use super::behaviour::{
    Generation, Output, RequestInfo, Usage, messages_words, model_and_stream, names_at,
};
use super::wire::{Item, Script, SseFormat};

/// `system_fingerprint` reported by every response.
const FINGERPRINT: &str = "fp_mock";

/// Reads the fields the mock needs from a chat completions request.
/// Longest `user` OpenAI accepts, characters.
const MAX_USER_CHARS: usize = 64;

pub(crate) fn request_info(body: &Value) -> Result<RequestInfo, String> {
    if !body.get("messages").is_some_and(Value::is_array) {
        return Err("Missing required parameter: 'messages'.".to_string());
    }
    // OpenAI's limit on `user` (Claude Code's `metadata.user_id` is a ~150-character JSON text).
    if let Some(user) = body.get("user").and_then(Value::as_str)
        && user.chars().count() > MAX_USER_CHARS
    {
        return Err(format!(
            "Invalid 'user': string too long. Expected a string with maximum length {MAX_USER_CHARS}, but got a string with length {} instead.",
            user.chars().count()
        ));
    }
    let max_tokens = body
        .get("max_completion_tokens")
        .and_then(Value::as_u64)
        .or_else(|| body.get("max_tokens").and_then(Value::as_u64));
    let mut tool_names = names_at(body.get("tools"), "/function/name");
    if tool_names.is_empty() {
        // Legacy `functions` parameter.
        tool_names = names_at(body.get("functions"), "/name");
    }
    let (model, stream) = model_and_stream(body);
    Ok(RequestInfo {
        model,
        stream,
        include_usage: body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        max_tokens,
        tool_names,
        prompt_words: messages_words(body),
        n: 1,
        ..RequestInfo::default()
    })
}

/// `(type, code, default message)` of an OpenAI error for an HTTP status.
fn error_kind(status: u16) -> (&'static str, Option<&'static str>, &'static str) {
    match status {
        401 => (
            "invalid_request_error",
            Some("invalid_api_key"),
            "Incorrect API key provided (mock).",
        ),
        403 => (
            "permission_error",
            Some("permission_denied"),
            "You are not allowed to access this resource (mock).",
        ),
        404 => (
            "invalid_request_error",
            Some("model_not_found"),
            "The model does not exist or you do not have access to it (mock).",
        ),
        429 => (
            "rate_limit_error",
            Some("rate_limit_exceeded"),
            "Rate limit reached for requests (mock).",
        ),
        400..=499 => ("invalid_request_error", None, "Invalid request (mock)."),
        503 | 529 => (
            "server_error",
            None,
            "The engine is currently overloaded, please try again later (mock).",
        ),
        _ => (
            "server_error",
            None,
            "The server had an error while processing your request. Sorry about that! (mock)",
        ),
    }
}

/// `{"error":{"message","type","param","code"}}` for an HTTP status.
pub(crate) fn error_body(status: u16, message: Option<&str>) -> Value {
    let (kind, code, default) = error_kind(status);
    json!({
        "error": {
            "message": message.unwrap_or(default),
            "type": kind,
            "param": null,
            "code": code,
        }
    })
}

fn usage(u: Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt,
        "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": { "cached_tokens": u.cached },
        "completion_tokens_details": { "reasoning_tokens": 0 },
    })
}

fn finish_reason(generation: &Generation) -> &str {
    generation.finish_word("length", "stop", "tool_calls")
}

/// Tool call id of the `i`-th call.
fn call_id(key: &str) -> String {
    format!("call_mock_{key}")
}

/// `logprobs.content` entries of text `pieces` (see [`RequestInfo::logprobs`] and
/// [`RequestInfo::top_logprobs`]).
fn logprob_entries(pieces: &[String], top: usize) -> Value {
    let entries: Vec<Value> = pieces
        .iter()
        .map(|p| {
            let alternatives: Vec<Value> = (0..top)
                .map(|j| {
                    let token = if j == 0 { p.clone() } else { format!("alt{j}") };
                    json!({ "token": token, "logprob": -0.5 - j as f64, "bytes": token.as_bytes() })
                })
                .collect();
            json!({ "token": p, "logprob": -0.5, "bytes": p.as_bytes(), "top_logprobs": alternatives })
        })
        .collect();
    json!({ "content": entries, "refusal": null })
}

/// The usage of all `choices`: the prompt once, the completions summed (as OpenAI counts `n`).
fn choices_usage(choices: &[Generation]) -> Usage {
    let first = choices.first().map(|g| g.usage);
    Usage {
        prompt: first.map_or(0, |u| u.prompt),
        cached: first.map_or(0, |u| u.cached),
        completion: choices.iter().map(|g| g.usage.completion).sum(),
    }
}

/// The `message` of one choice.
fn message(g: &Generation) -> Value {
    match &g.output {
        Output::Text { chunks, .. } => json!({
            "role": "assistant",
            "content": chunks.concat(),
            "refusal": null,
            "annotations": [],
        }),
        Output::Tools(calls) => {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    json!({
                        "id": call_id(&c.key(i)),
                        "type": "function",
                        "function": { "name": c.name, "arguments": c.arguments },
                    })
                })
                .collect();
            json!({
                "role": "assistant",
                "content": null,
                "tool_calls": calls,
                "refusal": null,
                "annotations": [],
            })
        }
    }
}

/// The non-streaming `chat.completion` object: one entry of `choices` per generation.
pub(crate) fn completion(
    id: &str,
    created: u64,
    info: &RequestInfo,
    choices: &[Generation],
) -> Value {
    let entries: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(index, g)| {
            json!({
                "index": index,
                "message": message(g),
                "logprobs": match &g.output {
                    Output::Text { chunks, .. } if info.logprobs => logprob_entries(chunks, info.top_logprobs),
                    _ => Value::Null,
                },
                "finish_reason": finish_reason(g),
            })
        })
        .collect();
    let first = choices.first();
    let raw_usage = first.and_then(|g| g.raw_usage.clone());
    let mut body = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": info.model,
        "choices": entries,
        "usage": raw_usage.unwrap_or_else(|| usage(choices_usage(choices))),
        "system_fingerprint": FINGERPRINT,
    });
    if let Some(tier) = first.and_then(|g| g.service_tier.as_ref()) {
        body["service_tier"] = json!(tier);
    }
    body
}

struct Chunker<'a> {
    id: &'a str,
    created: u64,
    info: &'a RequestInfo,
    fmt: SseFormat,
}

impl Chunker<'_> {
    fn base(&self, choices: Value) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.info.model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        });
        if self.info.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn chunk(&self, index: usize, delta: Value, finish_reason: Option<&str>) -> bytes::Bytes {
        let logprobs = match delta.get("content").and_then(Value::as_str) {
            Some(piece) if self.info.logprobs && !piece.is_empty() => {
                logprob_entries(&[piece.to_owned()], self.info.top_logprobs)
            }
            _ => Value::Null,
        };
        let choices = json!([{
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }]);
        self.fmt.data(&self.base(choices).to_string())
    }

    /// The events of choice `index`: its role chunk, its content, its finish chunk.
    fn choice(&self, index: usize, g: &Generation) -> Vec<Item> {
        let mut items = Vec::new();
        match &g.output {
            Output::Text { chunks, .. } => {
                items.push(Item::Frame(self.chunk(
                    index,
                    json!({ "role": "assistant", "content": "" }),
                    None,
                )));
                for piece in chunks {
                    items.push(Item::Content(self.chunk(
                        index,
                        json!({ "content": piece }),
                        None,
                    )));
                }
            }
            Output::Tools(calls) => {
                items.push(Item::Frame(self.chunk(
                    index,
                    json!({ "role": "assistant", "content": null }),
                    None,
                )));
                for (i, call) in calls.iter().enumerate() {
                    let header = json!({ "tool_calls": [{
                        "index": i,
                        "id": call_id(&call.key(i)),
                        "type": "function",
                        "function": { "name": call.name, "arguments": "" },
                    }]});
                    items.push(Item::Frame(self.chunk(index, header, None)));
                    for piece in &call.pieces {
                        let delta = json!({ "tool_calls": [{
                            "index": i,
                            "function": { "arguments": piece },
                        }]});
                        items.push(Item::Content(self.chunk(index, delta, None)));
                    }
                }
            }
        }
        items.push(Item::Frame(self.chunk(
            index,
            json!({}),
            Some(finish_reason(g)),
        )));
        items
    }
}

/// The SSE events of a streamed answer. With several choices (`n > 1`) they interleave as in
/// OpenAI's stream: one choice per chunk, round robin (every role chunk first), each choice's
/// `finish_reason` chunk right after its last content, then one usage chunk for all.
pub(crate) fn stream_script(
    id: &str,
    created: u64,
    info: &RequestInfo,
    choices: &[Generation],
    fmt: SseFormat,
) -> Script {
    let c = Chunker {
        id,
        created,
        info,
        fmt,
    };
    let mut lists: Vec<std::collections::VecDeque<Item>> = choices
        .iter()
        .enumerate()
        .map(|(i, g)| c.choice(i, g).into())
        .collect();
    let mut body = Vec::new();
    let mut trailer = Vec::new();
    if let [only] = lists.as_mut_slice() {
        // One choice: the finish chunk is the trailer's first event (after `error_after`).
        if let Some(Item::Frame(finish)) = only.pop_back() {
            trailer.push(finish);
        }
    }
    while lists.iter().any(|l| !l.is_empty()) {
        for list in &mut lists {
            if let Some(item) = list.pop_front() {
                body.push(item);
            }
        }
    }
    if info.include_usage {
        let mut last = c.base(json!([]));
        let first = choices.first();
        last["usage"] = first
            .and_then(|g| g.raw_usage.clone())
            .unwrap_or_else(|| usage(choices_usage(choices)));
        if let Some(tier) = first.and_then(|g| g.service_tier.as_ref()) {
            last["service_tier"] = json!(tier);
        }
        trailer.push(fmt.data(&last.to_string()));
    }
    trailer.push(fmt.data("[DONE]"));
    Script {
        prelude: Vec::new(),
        body,
        trailer,
        error: fmt.data(&error_body(500, None).to_string()),
    }
}

/// Azure OpenAI's `prompt_filter_results`: every category passed (Azure OpenAI REST API
/// reference, `promptFilterResults` / `contentFilterPromptResults`).
pub(crate) fn azure_prompt_filter_results() -> Value {
    let safe = json!({ "filtered": false, "severity": "safe" });
    json!([{
        "prompt_index": 0,
        "content_filter_results": {
            "hate": safe, "self_harm": safe, "sexual": safe, "violence": safe,
        },
    }])
}

/// The annotation chunk Azure OpenAI streams first: `choices: []` plus `prompt_filter_results`,
/// with empty `id`/`model`/`object` (clients must skip chunks without choices).
pub(crate) fn azure_prompt_filter_chunk(fmt: SseFormat) -> bytes::Bytes {
    let chunk = json!({
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": azure_prompt_filter_results(),
    });
    fmt.data(&chunk.to_string())
}

/// Azure OpenAI error bodies: gateway-level failures (auth, rate limit, unknown route) are
/// `{"error":{"code":"<status>","message"}}`; model-level ones keep the OpenAI shape.
pub(crate) fn azure_error_body(status: u16, message: Option<&str>) -> Value {
    let default = match status {
        401 => "Access denied due to invalid subscription key or wrong API endpoint. (mock)",
        404 => "Resource not found",
        429 => {
            "Requests to the ChatCompletions_Create Operation have exceeded the rate limit of your current pricing tier. (mock)"
        }
        _ => return error_body(status, message),
    };
    json!({ "error": { "code": status.to_string(), "message": message.unwrap_or(default) } })
}
