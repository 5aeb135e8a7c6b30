//! The OpenAI front door, `POST /v1/chat/completions` (OpenAI API reference, "Create chat
//! completion"): parse into the normalised request, then the shared pipeline
//! ([`crate::front_door::serve`]) answers as `chat.completion.chunk` SSE events or one aggregated
//! `chat.completion`, with errors in OpenAI's shape.

use crate::AppState;
use crate::error::ApiError;
use crate::front_door::{self, FrontDoor, ReplyMeta, StreamEncode};
use crate::openai::request;
use crate::openai::response::{self, DONE, ResponseMeta};
use crate::route::{Aggregate, Inbound};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use switchyard_schemas::{FrameBody, Usage, now_ms};

pub use crate::front_door::sse_response;

/// The handler.
pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    ctx: crate::context::Ctx,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    front_door::serve(OpenAiChat::default(), app, &ctx, &headers, &body).await
}

/// The OpenAI Chat Completions protocol, for one request: [`FrontDoor::parse`] records whether
/// the body used the legacy `functions`, so the answer comes back in that shape.
#[derive(Debug, Default)]
pub struct OpenAiChat {
    legacy_functions: std::sync::atomic::AtomicBool,
}

impl OpenAiChat {
    fn meta(&self, m: &ReplyMeta) -> ResponseMeta {
        ResponseMeta {
            id: format!("chatcmpl-{}", m.request_id.simple()),
            created: now_ms() / 1000,
            model: m.model.clone(),
            include_usage: m.include_usage,
            legacy_functions: self
                .legacy_functions
                .load(std::sync::atomic::Ordering::Relaxed),
            choice: 0,
        }
    }
}

impl FrontDoor for OpenAiChat {
    type Stream = OpenAiStream;

    fn parse(&self, body: &[u8]) -> Result<Inbound, ApiError> {
        let p = request::parse(body)?;
        self.legacy_functions
            .store(p.legacy_functions, std::sync::atomic::Ordering::Relaxed);
        Ok(p.into_inbound())
    }

    fn stream(&self, m: &ReplyMeta) -> OpenAiStream {
        OpenAiStream {
            meta: self.meta(m),
            usage: None,
            logprobs: None,
            started: vec![true],
            choices_ended: false,
        }
    }

    fn aggregate(&self, m: &ReplyMeta, agg: &Aggregate) -> Result<serde_json::Value, ApiError> {
        response::completion(&self.meta(m), agg)
    }

    fn error(&self, e: ApiError) -> Response {
        e.into_response()
    }
}

/// `chat.completion.chunk` events of one response.
pub struct OpenAiStream {
    meta: ResponseMeta,
    /// The usage frame, sent after the finish chunk when the client asked for it.
    usage: Option<Usage>,
    /// Logprobs of the next text chunk (workers send them just before it), so they ride on that
    /// chunk as in OpenAI's own stream.
    logprobs: Option<Vec<serde_json::Value>>,
    /// Per choice: whether its role chunk went out (choice 0's at the start).
    started: Vec<bool>,
    /// Choices ended with their own finish chunks (`n > 1`): `end` adds none.
    choices_ended: bool,
}

impl OpenAiStream {
    /// Switches to choice `index`; its first chunk is a role chunk, as OpenAI sends for every
    /// choice.
    fn switch(&mut self, index: u32, out: &mut VecDeque<Bytes>) {
        self.meta.choice = index;
        let i = index as usize;
        if self.started.len() <= i {
            self.started.resize(i + 1, false);
        }
        if let Some(started) = self.started.get_mut(i)
            && !*started
        {
            *started = true;
            out.push_back(self.meta.role_chunk());
        }
    }
}

impl StreamEncode for OpenAiStream {
    fn start(&mut self, out: &mut VecDeque<Bytes>) {
        out.push_back(self.meta.role_chunk());
    }

    fn frame(&mut self, frame: FrameBody, out: &mut VecDeque<Bytes>) {
        if let FrameBody::Text { text } = &frame {
            let logprobs = self.logprobs.take();
            out.push_back(self.meta.text_chunk_with(text, logprobs));
            return;
        }
        // Logprobs no text followed (e.g. of a tool-call chunk): a chunk of their own.
        if let Some(content) = self.logprobs.take() {
            out.push_back(self.meta.logprobs_chunk(content));
        }
        match frame {
            FrameBody::Text { .. } => {}
            FrameBody::ToolCall {
                index,
                id,
                name,
                arguments,
            } => out.push_back(self.meta.tool_chunk(
                index,
                id.as_deref(),
                name.as_deref(),
                &arguments,
            )),
            FrameBody::Reasoning { text } => out.push_back(self.meta.reasoning_chunk(&text)),
            FrameBody::ReasoningSignature { signature } => {
                let block =
                    serde_json::json!({"type": "thinking", "thinking": "", "signature": signature});
                out.push_back(self.meta.thinking_block_chunk(block));
            }
            FrameBody::RedactedReasoning { data } => {
                let block = serde_json::json!({"type": "redacted_thinking", "data": data});
                out.push_back(self.meta.thinking_block_chunk(block));
            }
            FrameBody::Logprobs { content } => self.logprobs = Some(content),
            FrameBody::Usage { usage } => self.usage = Some(usage),
            FrameBody::Choice { index } => self.switch(index, out),
            FrameBody::ChoiceEnd {
                index,
                finish_reason,
            } => {
                self.switch(index, out);
                self.choices_ended = true;
                out.push_back(self.meta.finish_chunk(finish_reason));
            }
            FrameBody::End { finish_reason } => {
                if !self.choices_ended {
                    out.push_back(self.meta.finish_chunk(finish_reason));
                }
                if self.meta.include_usage {
                    out.push_back(self.meta.usage_chunk(self.usage.unwrap_or_default()));
                }
                out.push_back(Bytes::from_static(DONE));
            }
            FrameBody::Error { error, .. } => {
                out.push_back(response::error_event(&error.into()));
            }
            FrameBody::Start { .. } | FrameBody::Heartbeat | FrameBody::UpstreamHeaders { .. } => {}
        }
    }
}
