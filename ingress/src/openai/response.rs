//! Writes OpenAI wire responses: `chat.completion.chunk` SSE events and the aggregated
//! `chat.completion` object. Reference: OpenAI API reference, "The chat completion object" and
//! "The chat completion chunk object" (usage chunk with `choices: []` when
//! `stream_options.include_usage` is true; every other chunk then carries `"usage": null`).

use crate::error::ApiError;
use bytes::Bytes;
use serde::Serialize;
use switchyard_schemas::{FinishReason, Usage};

/// Identity of one response: the same `id`, `created` and `model` on every chunk.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// `chatcmpl-<request-id>`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model the client asked for (never the upstream id).
    pub model: String,
    /// Whether chunks carry `"usage": null` and a final usage chunk follows.
    pub include_usage: bool,
    /// The request used legacy `functions`: the call is answered as `function_call` (one call,
    /// finish reason `function_call`; OpenAI API reference, deprecated function calling).
    pub legacy_functions: bool,
    /// The choice (`choices[0].index`) the next chunks belong to: 0 unless the request asked
    /// for several (`n > 1`; OpenAI streams one choice per chunk).
    pub choice: u32,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: Option<&'a str>,
    choices: &'a [ChunkChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageOut>>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<serde_json::Value>,
    finish_reason: Option<&'static str>,
}

/// A chunk's `delta`: only the fields it has.
#[serde_with::skip_serializing_none]
#[derive(Serialize, Default)]
pub struct Delta<'a> {
    role: Option<&'static str>,
    content: Option<&'a str>,
    tool_calls: Option<[ToolCallDelta<'a>; 1]>,
    /// Legacy `function_call` delta (requests that sent `functions`).
    function_call: Option<FunctionDelta<'a>>,
    /// Reasoning text (DeepSeek's and LiteLLM's name, read by the OpenAI SDKs as an extra field).
    reasoning_content: Option<&'a str>,
    /// A signature or redacted block closing a thinking block (LiteLLM's `thinking_blocks`).
    thinking_blocks: Option<[serde_json::Value; 1]>,
}

#[serde_with::skip_serializing_none]
#[derive(Serialize)]
struct ToolCallDelta<'a> {
    index: u32,
    id: Option<&'a str>,
    #[serde(rename = "type")]
    kind: Option<&'static str>,
    function: FunctionDelta<'a>,
}

#[derive(Serialize)]
struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// OpenAI's usage object.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct UsageOut {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: PromptDetails,
    completion_tokens_details: CompletionDetails,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
struct PromptDetails {
    cached_tokens: u64,
    /// Audio input tokens, when any (OpenAI `prompt_tokens_details.audio_tokens`).
    #[serde(skip_serializing_if = "is_zero")]
    audio_tokens: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Serialize, Debug, Clone, PartialEq)]
struct CompletionDetails {
    reasoning_tokens: u64,
    /// Audio output tokens, when any (OpenAI `completion_tokens_details.audio_tokens`).
    #[serde(skip_serializing_if = "is_zero")]
    audio_tokens: u64,
}

impl UsageOut {
    /// `u` as OpenAI's usage object; an error (500) if encoding fails, never `usage: null`.
    pub fn json(u: Usage) -> Result<serde_json::Value, ApiError> {
        serde_json::to_value(Self::from(u)).map_err(|e| ApiError::encoding("usage", &e))
    }
}

impl From<Usage> for UsageOut {
    fn from(u: Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.total_tokens(),
            prompt_tokens_details: PromptDetails {
                cached_tokens: u.cached_tokens,
                audio_tokens: u.audio_input_tokens,
            },
            completion_tokens_details: CompletionDetails {
                reasoning_tokens: u.reasoning_tokens,
                audio_tokens: u.audio_output_tokens,
            },
        }
    }
}

fn sse(value: &impl Serialize) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"data: ");
    // These plain structs serialise; should one ever not, the client gets an error event, never
    // a half-written one.
    if let Err(e) = serde_json::to_writer(&mut buf, value) {
        tracing::error!(error = %e, "encoding an SSE event failed");
        buf.truncate(b"data: ".len());
        buf.extend_from_slice(
            br#"{"error":{"message":"the gateway could not encode this event","type":"server_error","param":null,"code":null}}"#,
        );
    }
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

impl ResponseMeta {
    /// One `chat.completion.chunk` SSE event of this response with `choices` and `usage`
    /// (outer `None`: no `usage` field; `Some(None)`: `usage: null`).
    fn event(&self, choices: &[ChunkChoice<'_>], usage: Option<Option<UsageOut>>) -> Bytes {
        sse(&Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: None,
            choices,
            usage,
        })
    }

    fn chunk(&self, delta: Delta<'_>, finish: Option<FinishReason>) -> Bytes {
        self.chunk_with(delta, None, finish)
    }

    /// One `chat.completion.chunk` SSE event of this choice: `delta`, `logprobs` and the
    /// finish reason as given (`usage: null` when the client asked for usage).
    fn chunk_with(
        &self,
        delta: Delta<'_>,
        logprobs: Option<serde_json::Value>,
        finish: Option<FinishReason>,
    ) -> Bytes {
        let choices = [ChunkChoice {
            index: self.choice,
            delta,
            logprobs,
            finish_reason: finish.map(|f| self.finish_name(f)),
        }];
        self.event(&choices, self.include_usage.then_some(None))
    }

    /// The first chunk: `{"role":"assistant","content":""}`.
    pub fn role_chunk(&self) -> Bytes {
        self.chunk(
            Delta {
                role: Some("assistant"),
                content: Some(""),
                ..Delta::default()
            },
            None,
        )
    }

    /// A text delta.
    pub fn text_chunk(&self, text: &str) -> Bytes {
        self.chunk(
            Delta {
                content: Some(text),
                ..Delta::default()
            },
            None,
        )
    }

    /// A content chunk carrying the upstream's `logprobs.content` entries for that text, when
    /// given (OpenAI API reference, "The chat completion chunk object": `choices[].logprobs`).
    pub fn text_chunk_with(&self, text: &str, logprobs: Option<Vec<serde_json::Value>>) -> Bytes {
        match logprobs {
            None => self.text_chunk(text),
            Some(content) => self.logprobs_chunk_of(Some(text), content),
        }
    }

    /// A chunk with an empty delta carrying `logprobs.content` entries no text followed (the
    /// SDKs accumulate either way).
    pub fn logprobs_chunk(&self, content: Vec<serde_json::Value>) -> Bytes {
        self.logprobs_chunk_of(None, content)
    }

    fn logprobs_chunk_of(&self, text: Option<&str>, content: Vec<serde_json::Value>) -> Bytes {
        self.chunk_with(
            Delta {
                content: text,
                ..Delta::default()
            },
            Some(serde_json::json!({"content": content, "refusal": null})),
            None,
        )
    }

    /// A reasoning delta: `{"reasoning_content": text}`.
    pub fn reasoning_chunk(&self, text: &str) -> Bytes {
        self.chunk(
            Delta {
                reasoning_content: Some(text),
                ..Delta::default()
            },
            None,
        )
    }

    /// The end of a thinking block: `{"thinking_blocks":[{"type":"thinking","thinking":"",
    /// "signature"}]}`, or a whole `redacted_thinking` block, so a client can replay it.
    pub fn thinking_block_chunk(&self, block: serde_json::Value) -> Bytes {
        self.chunk(
            Delta {
                thinking_blocks: Some([block]),
                ..Delta::default()
            },
            None,
        )
    }

    /// A tool-call delta; `id` and `name` only on the first piece of each index.
    pub fn tool_chunk(
        &self,
        index: u32,
        id: Option<&str>,
        name: Option<&str>,
        arguments: &str,
    ) -> Bytes {
        if self.legacy_functions {
            // One function call per answer in the legacy shape; further calls are not shown.
            if index != 0 {
                return Bytes::new();
            }
            return self.chunk(
                Delta {
                    function_call: Some(FunctionDelta { name, arguments }),
                    ..Delta::default()
                },
                None,
            );
        }
        let call = ToolCallDelta {
            index,
            id,
            kind: id.map(|_| "function"),
            function: FunctionDelta { name, arguments },
        };
        self.chunk(
            Delta {
                tool_calls: Some([call]),
                ..Delta::default()
            },
            None,
        )
    }

    /// `finish_reason` as sent: `function_call` instead of `tool_calls` for legacy requests.
    fn finish_name(&self, f: FinishReason) -> &'static str {
        if self.legacy_functions && f == FinishReason::ToolCalls {
            "function_call"
        } else {
            f.as_str()
        }
    }

    /// The chunk carrying `finish_reason` with an empty delta.
    pub fn finish_chunk(&self, finish: FinishReason) -> Bytes {
        self.chunk(Delta::default(), Some(finish))
    }

    /// The final usage chunk (`choices: []`), only sent when the client asked for it.
    pub fn usage_chunk(&self, usage: Usage) -> Bytes {
        self.event(&[], Some(Some(usage.into())))
    }
}

/// The stream terminator.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// An in-stream error event after content was sent (the OpenAI SDKs raise on a chunk with `error`).
pub fn error_event(err: &crate::error::ApiError) -> Bytes {
    sse(&err.body())
}

/// The aggregated `chat.completion` object: `choices` 0..n-1 (choice 0 is `agg` itself, the
/// others [`Aggregate::more_choices`]), each with its own `message`, `logprobs` and
/// `finish_reason`; one `usage` for all.
///
/// [`Aggregate::more_choices`]: crate::route::Aggregate::more_choices
/// Fails (500) only if a part cannot be encoded as JSON.
pub fn completion(
    meta: &ResponseMeta,
    agg: &crate::route::Aggregate,
) -> Result<serde_json::Value, ApiError> {
    let choices = std::iter::once(agg)
        .chain(&agg.more_choices)
        .enumerate()
        .map(|(index, c)| choice(meta, index, c))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(serde_json::json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": null,
        "choices": choices,
        "usage": UsageOut::json(agg.usage.unwrap_or_default())?,
    }))
}

/// One entry of a `chat.completion`'s `choices`.
fn choice(
    meta: &ResponseMeta,
    index: usize,
    agg: &crate::route::Aggregate,
) -> Result<serde_json::Value, ApiError> {
    let calls: Vec<serde_json::Value> = agg
        .tool_calls
        .iter()
        .map(|c| {
            serde_json::json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    let content = if agg.text.is_empty() && !calls.is_empty() {
        None
    } else {
        Some(agg.text.as_str())
    };
    let mut message = serde_json::json!({"role": "assistant", "content": content, "refusal": null});
    if meta.legacy_functions {
        if let Some(c) = agg.tool_calls.first() {
            message["function_call"] =
                serde_json::json!({"name": c.name, "arguments": c.arguments});
        }
    } else if !calls.is_empty() {
        message["tool_calls"] = serde_json::Value::Array(calls);
    }
    if !agg.thinking.is_empty() {
        let text: String = agg.thinking.iter().map(|b| b.text()).collect();
        message["reasoning_content"] = serde_json::Value::String(text);
        message["thinking_blocks"] = serde_json::to_value(&agg.thinking)
            .map_err(|e| ApiError::encoding("thinking blocks", &e))?;
    }
    let logprobs = (!agg.logprobs.is_empty())
        .then(|| serde_json::json!({"content": agg.logprobs, "refusal": null}));
    Ok(
        serde_json::json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": meta.finish_name(agg.finish)}),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn meta(include_usage: bool) -> ResponseMeta {
        ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "demo/mock".into(),
            include_usage,
            legacy_functions: false,
            choice: 0,
        }
    }

    #[test]
    fn chunk_wire_format() {
        let b = meta(false).text_chunk("Hi");
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"demo/mock\",\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        );
        let b = meta(true).finish_chunk(FinishReason::Stop);
        assert!(
            std::str::from_utf8(&b)
                .unwrap()
                .ends_with("\"finish_reason\":\"stop\"}],\"usage\":null}\n\n")
        );
        let u = Usage {
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: 2,
            ..Usage::default()
        };
        let b = meta(true).usage_chunk(u);
        assert!(std::str::from_utf8(&b).unwrap().contains("\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":2}"));
    }
}
