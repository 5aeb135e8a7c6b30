//! The ordered stream a worker sends back on a request's reply subject.
//!
//! Order of a successful attempt: `start` → any number of `reasoning` / `reasoning_signature` /
//! `redacted_reasoning` / `text` / `tool_call` / `logprobs` (and `heartbeat` while the upstream is
//! silent) → `usage` (at most one, final cumulative values) → `end`. A failed attempt
//! ends with `error` instead of `end`. `seq` starts at 0 and increases by one per frame, so the reader
//! can detect a gap (a lost message) and fail the request rather than return a damaged answer.
//!
//! Several choices (OpenAI `n > 1`): content frames belong to choice 0 until a `choice` frame
//! names another; every following content frame belongs to that choice until the next `choice`
//! frame (the upstream's own interleaving is kept, one switch per change). Each choice's end is a
//! non-terminal `choice_end` frame with its own finish reason, sent where the upstream ended that
//! choice; the one `usage` covers all choices (the upstream's: prompt counted once) and the
//! terminal `end` repeats choice 0's finish reason. A one-choice answer has neither frame, so its
//! stream is what it always was.
//!
//! Flow control: ingress puts a window `W` (frames) in the request's [`WINDOW_HEADER`]. The worker
//! may send frame `seq` only while `seq < upto`, where `upto` starts at `W` and rises with every
//! [`Credit`] ingress publishes on `<prefix>.credit.<worker>` as it consumes frames (cumulative, so
//! a late or repeated grant is harmless). Every frame counts, heartbeats included, except the
//! terminal `error`, which may exceed the window by one: ingress's buffer per attempt holds `W + 1`
//! frames. A worker with no credit stops reading the upstream; after `timeouts.stall_ms` without
//! credit it cancels the call. A request without the header is not flow-controlled.

use crate::cache::CachedToolCall;
use crate::error::ErrorInfo;
pub use crate::finish::FinishReason;
use crate::request::ThinkingBlock;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// NATS header of a chat request carrying its flow-control window: frames, decimal.
pub const WINDOW_HEADER: &str = "Sy-Window";
/// Window (frames) ingress grants a streaming attempt: what it buffers for a client that does not
/// read.
pub const STREAM_WINDOW: u32 = 64;
/// Window (frames) ingress grants a non-streaming attempt: ingress aggregates at once, so a large
/// window spares the answer any wait for a grant.
pub const AGGREGATE_WINDOW: u32 = 1024;

/// A flow-control grant, JSON on `<prefix>.credit.<worker>`: attempt `attempt` of request `id` may
/// send frames with `seq < upto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credit {
    /// The request.
    pub id: Uuid,
    /// Ingress's attempt number.
    pub attempt: u32,
    /// Exclusive upper bound on `seq` the worker may send (cumulative).
    pub upto: u32,
}

/// One message on the reply subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// Position in this attempt's stream, from 0.
    pub seq: u32,
    /// What happened.
    #[serde(flatten)]
    pub body: FrameBody,
}

/// The content of a frame.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FrameBody {
    /// The worker accepted the request and is calling the upstream.
    Start {
        /// Id of the worker process (its cancel subject is `<prefix>.cancel.<worker>`).
        worker: String,
        /// Configured target id.
        target: String,
        /// Model id sent upstream.
        upstream_model: String,
    },
    /// A piece of generated text.
    Text {
        /// The text delta.
        text: String,
    },
    /// A piece of a tool call, OpenAI-delta style: `id`/`name` on the first piece of each `index`.
    ToolCall {
        /// Which tool call (0-based) within the choice.
        index: u32,
        /// Call id, first piece only.
        id: Option<String>,
        /// Function name, first piece only.
        name: Option<String>,
        /// A fragment of the JSON-encoded arguments.
        #[serde(default)]
        arguments: String,
    },
    /// A piece of model reasoning (Anthropic `thinking_delta`; OpenAI-compatible
    /// `reasoning_content`). Consecutive pieces belong to one thinking block until a
    /// [`FrameBody::ReasoningSignature`] closes it.
    Reasoning {
        /// The reasoning delta.
        text: String,
    },
    /// The signature that closes the current thinking block (Anthropic `signature_delta`).
    ReasoningSignature {
        /// Opaque signature, replayed unchanged on the next turn.
        signature: String,
    },
    /// A whole `redacted_thinking` block (Anthropic: encrypted reasoning).
    RedactedReasoning {
        /// Opaque encrypted data.
        data: String,
    },
    /// Log probabilities of the tokens just generated: OpenAI's `logprobs.content` entries
    /// (`token`, `logprob`, `bytes`, `top_logprobs`), passed through as the upstream sent them.
    /// Only OpenAI-style upstreams asked for `logprobs` send it.
    Logprobs {
        /// The entries, in token order.
        content: Vec<serde_json::Value>,
    },
    /// The content frames that follow belong to choice `index` (0-based; OpenAI
    /// `choices[].index`), until the next `choice` frame. Only answers with `n > 1` send it.
    Choice {
        /// The choice.
        index: u32,
    },
    /// Choice `index` ended (non-terminal; the attempt's `end` still follows). Only answers with
    /// `n > 1` send it, one per choice, where the upstream ended that choice.
    ChoiceEnd {
        /// The choice.
        index: u32,
        /// Why that choice stopped.
        finish_reason: FinishReason,
    },
    /// Final token usage as reported by the upstream (normalised; see [`Usage`]).
    Usage {
        /// The counts.
        usage: Usage,
    },
    /// Successful end of the stream.
    End {
        /// Why generation stopped.
        finish_reason: FinishReason,
    },
    /// The attempt failed. `content_sent` tells whether any text/tool_call frame went out before it,
    /// in which case ingress must not fall back (the client may already have seen content).
    Error {
        /// The classified failure.
        error: ErrorInfo,
        /// Whether content frames preceded this error.
        content_sent: bool,
    },
    /// The upstream's rate-limit response headers of the call now streaming (names lower-case,
    /// as received: `x-ratelimit-*`, `anthropic-ratelimit-*`), sent before its first content;
    /// ingress forwards them to the client under `x-upstream-` ([`upstream_header_name`]).
    UpstreamHeaders {
        /// `(name, value)` pairs, at most [`MAX_UPSTREAM_HEADERS`].
        headers: Vec<(String, String)>,
    },
    /// The worker is alive and waiting on a silent upstream.
    Heartbeat,
}

/// Most upstream rate-limit headers one [`FrameBody::UpstreamHeaders`] carries.
pub const MAX_UPSTREAM_HEADERS: usize = 24;

/// Whether an upstream response header is a rate-limit header that is forwarded:
/// `x-ratelimit-*` (OpenAI, Azure OpenAI and most OpenAI-compatible servers) and
/// `anthropic-ratelimit-*` (Anthropic API reference, "Rate limits" → "Response headers").
pub fn is_upstream_rate_header(name: &str) -> bool {
    name.starts_with("x-ratelimit-") || name.starts_with("anthropic-ratelimit-")
}

/// The name an upstream rate-limit header is forwarded under: `x-upstream-` + the name without
/// a leading `x-` (`x-ratelimit-remaining-requests` → `x-upstream-ratelimit-remaining-requests`,
/// `anthropic-ratelimit-requests-limit` → `x-upstream-anthropic-ratelimit-requests-limit`), so
/// the gateway's own `x-ratelimit-*` headers are never confused with the upstream's.
pub fn upstream_header_name(name: &str) -> String {
    format!("x-upstream-{}", name.strip_prefix("x-").unwrap_or(name))
}

impl FrameBody {
    /// Adds a reasoning frame to `blocks` (the finished message's thinking blocks, in order):
    /// text extends the last unsigned `thinking` block or starts one, a signature closes the last
    /// block (starting an empty one when none is open), a redacted block is appended. Returns
    /// false, leaving `blocks` alone, for any other frame.
    pub fn accumulate_thinking(&self, blocks: &mut Vec<ThinkingBlock>) -> bool {
        let open = |blocks: &mut Vec<ThinkingBlock>| -> usize {
            match blocks.last() {
                Some(ThinkingBlock::Thinking {
                    signature: None, ..
                }) => {}
                _ => blocks.push(ThinkingBlock::Thinking {
                    thinking: String::new(),
                    signature: None,
                }),
            }
            blocks.len() - 1
        };
        match self {
            Self::Reasoning { text } => {
                let i = open(blocks);
                if let Some(ThinkingBlock::Thinking { thinking, .. }) = blocks.get_mut(i) {
                    thinking.push_str(text);
                }
            }
            Self::ReasoningSignature { signature: sig } => {
                let i = open(blocks);
                if let Some(ThinkingBlock::Thinking { signature, .. }) = blocks.get_mut(i) {
                    *signature = Some(sig.clone());
                }
            }
            Self::RedactedReasoning { data } => {
                blocks.push(ThinkingBlock::RedactedThinking { data: data.clone() });
            }
            _ => return false,
        }
        true
    }

    /// Adds a tool-call piece to `calls` (the answer's calls, by index; see
    /// [`CachedToolCall::accumulate`]). Returns false, leaving `calls` alone, for any other frame.
    pub fn accumulate_tool_call(&self, calls: &mut Vec<CachedToolCall>) -> bool {
        let Self::ToolCall {
            index,
            id,
            name,
            arguments,
        } = self
        else {
            return false;
        };
        CachedToolCall::accumulate(calls, *index, id.clone(), name.clone(), arguments);
        true
    }

    /// True for frames that carry model output.
    pub fn is_content(&self) -> bool {
        matches!(
            self,
            Self::Text { .. }
                | Self::ToolCall { .. }
                | Self::Reasoning { .. }
                | Self::ReasoningSignature { .. }
                | Self::RedactedReasoning { .. }
        )
    }

    /// True for the last frame of an attempt.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::End { .. } | Self::Error { .. })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn wire_shape_is_flat_and_tagged() {
        let f = Frame {
            seq: 3,
            body: FrameBody::Text { text: "Hi".into() },
        };
        let s = serde_json::to_string(&f).unwrap();
        assert_eq!(s, r#"{"seq":3,"type":"text","text":"Hi"}"#);
        let back: Frame = serde_json::from_str(&s).unwrap();
        assert_eq!(back, f);
        let f = Frame {
            seq: 4,
            body: FrameBody::ChoiceEnd {
                index: 2,
                finish_reason: FinishReason::Length,
            },
        };
        let s = serde_json::to_string(&f).unwrap();
        assert_eq!(
            s,
            r#"{"seq":4,"type":"choice_end","index":2,"finish_reason":"length"}"#
        );
    }

    #[test]
    fn credit_round_trips() {
        let c = Credit {
            id: Uuid::nil(),
            attempt: 1,
            upto: 96,
        };
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Credit>(&s).unwrap(), c);
    }
}
