//! Responses streaming events (OpenAI API reference, "Streaming events"), each
//! `event: <type>\ndata: <json>\n\n` with a `sequence_number` from 0, in the documented order:
//!
//! `response.created`, `response.in_progress`, then per output item `response.output_item.added`,
//! for a message `response.content_part.added`, `response.output_text.delta`…,
//! `response.output_text.done`, `response.content_part.done`; for a function call
//! `response.function_call_arguments.delta`…, `response.function_call_arguments.done`; then
//! `response.output_item.done`; finally `response.completed` (or `response.incomplete` when the
//! output was cut by `max_output_tokens` or a filter), whose `response.output` holds every item.
//! A failure after the stream began sends `error` and then `response.failed` (partial output kept).
//!
//! An item is closed when the next one starts (tool calls arrive one after another from every
//! adapter); a late piece of an already closed call still reaches the final object.

use super::response::{self, Answer, Ident};
use crate::error::ApiError;
use crate::front_door::StreamEncode;
use crate::route::ToolCallAcc;
use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use std::collections::VecDeque;
use std::sync::Arc;
use switchyard_schemas::FrameBody;

/// What the stream persists when it ends (see [`super::Persist`]).
pub trait Finish: Send + Sync + 'static {
    /// The work to await before the final event is sent, given the final `response` object,
    /// the answer it was built from and the target that served (`None`: a cache hit).
    fn finish(
        &self,
        response: Value,
        answer: &Answer,
        target: Option<String>,
    ) -> Option<BoxFuture<'static, ()>>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Message,
    Call(usize),
}

/// The encoder of one streamed response.
pub struct ResponsesStream {
    ident: Ident,
    echo: Arc<Map<String, Value>>,
    seq: u64,
    answer: Answer,
    open: Open,
    /// `output_index` of the message item, once opened.
    message_index: Option<usize>,
    /// `output_index` of each call by tool-call index, once opened.
    call_index: Vec<Option<usize>>,
    next_output: usize,
    finish: Option<Arc<dyn Finish>>,
    final_response: Option<Value>,
}

impl ResponsesStream {
    /// A new stream; `finish` stores the final response.
    pub fn new(
        ident: Ident,
        echo: Arc<Map<String, Value>>,
        finish: Option<Arc<dyn Finish>>,
    ) -> Self {
        Self {
            ident,
            echo,
            seq: 0,
            answer: Answer::default(),
            open: Open::None,
            message_index: None,
            call_index: Vec::new(),
            next_output: 0,
            finish,
            final_response: None,
        }
    }

    fn event(&mut self, kind: &str, mut data: Value, out: &mut VecDeque<Bytes>) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(b"event: ");
        buf.extend_from_slice(kind.as_bytes());
        buf.extend_from_slice(b"\ndata: ");
        let _ = serde_json::to_writer(&mut buf, &data);
        buf.extend_from_slice(b"\n\n");
        out.push_back(Bytes::from(buf));
    }

    fn snapshot(&self, output: Vec<Value>) -> Value {
        response::object(&self.ident, &self.echo, &self.answer, output)
    }

    fn open_message(&mut self, out: &mut VecDeque<Bytes>) {
        self.close(out, "completed");
        let index = match self.message_index {
            Some(i) => i,
            None => {
                let i = self.next_output;
                self.next_output += 1;
                self.message_index = Some(i);
                let item = response::message_item(&self.ident, None, "in_progress");
                self.event(
                    "response.output_item.added",
                    json!({"output_index": i, "item": item}),
                    out,
                );
                self.event(
                    "response.content_part.added",
                    json!({"item_id": self.ident.message_id(), "output_index": i,
                        "content_index": 0, "part": response::text_part("")}),
                    out,
                );
                i
            }
        };
        let _ = index;
        self.open = Open::Message;
    }

    fn open_call(&mut self, index: usize, out: &mut VecDeque<Bytes>) -> usize {
        if self.call_index.len() <= index {
            self.call_index.resize(index + 1, None);
        }
        if let Some(i) = self.call_index[index] {
            return i;
        }
        self.close(out, "completed");
        let i = self.next_output;
        self.next_output += 1;
        self.call_index[index] = Some(i);
        let call = &self.answer.calls[index];
        let item = response::call_item(
            &self.ident,
            index,
            &ToolCallAcc {
                arguments: String::new(),
                ..call.clone()
            },
            "in_progress",
        );
        self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
            out,
        );
        self.open = Open::Call(index);
        i
    }

    /// Closes the open item with item status `status`.
    fn close(&mut self, out: &mut VecDeque<Bytes>, status: &str) {
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => {}
            Open::Message => {
                let i = self.message_index.unwrap_or_default();
                let id = self.ident.message_id();
                let text = self.answer.text.clone();
                self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0,
                        "text": text, "logprobs": []}),
                    out,
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0,
                        "part": response::text_part(&text)}),
                    out,
                );
                let item = response::message_item(&self.ident, Some(&text), status);
                self.event(
                    "response.output_item.done",
                    json!({"output_index": i, "item": item}),
                    out,
                );
            }
            Open::Call(index) => {
                let i = self
                    .call_index
                    .get(index)
                    .copied()
                    .flatten()
                    .unwrap_or_default();
                let call = self.answer.calls[index].clone();
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": self.ident.call_id(index), "output_index": i,
                        "arguments": call.arguments, "name": call.name}),
                    out,
                );
                let item = response::call_item(&self.ident, index, &call, status);
                self.event(
                    "response.output_item.done",
                    json!({"output_index": i, "item": item}),
                    out,
                );
            }
        }
    }

    /// The final output in stream order (message first when it came first).
    fn final_output(&self) -> Vec<Value> {
        let (st, _) = response::status(&self.answer);
        let item_status = if st == "completed" {
            "completed"
        } else {
            "incomplete"
        };
        let mut items: Vec<(usize, Value)> = Vec::new();
        if let Some(i) = self.message_index {
            items.push((
                i,
                response::message_item(&self.ident, Some(&self.answer.text), item_status),
            ));
        }
        for (index, call) in self.answer.calls.iter().enumerate() {
            let i = self
                .call_index
                .get(index)
                .copied()
                .flatten()
                .unwrap_or(usize::MAX);
            items.push((
                i,
                response::call_item(&self.ident, index, call, item_status),
            ));
        }
        items.sort_by_key(|(i, _)| *i);
        items.into_iter().map(|(_, v)| v).collect()
    }
}

impl StreamEncode for ResponsesStream {
    fn start(&mut self, out: &mut VecDeque<Bytes>) {
        let r = self.snapshot(Vec::new());
        self.event("response.created", json!({"response": r}), out);
        self.event("response.in_progress", json!({"response": r}), out);
    }

    fn frame(&mut self, frame: FrameBody, out: &mut VecDeque<Bytes>) {
        match frame {
            FrameBody::Text { text } => {
                if text.is_empty() {
                    return;
                }
                if self.open != Open::Message {
                    self.open_message(out);
                }
                self.answer.text.push_str(&text);
                let i = self.message_index.unwrap_or_default();
                self.event(
                    "response.output_text.delta",
                    json!({"item_id": self.ident.message_id(), "output_index": i,
                        "content_index": 0, "delta": text, "logprobs": []}),
                    out,
                );
            }
            FrameBody::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                // The arguments may go in before the item opens: its `added` event shows none.
                ToolCallAcc::accumulate(&mut self.answer.calls, index, id, name, &arguments);
                let index = index as usize;
                let i = self.open_call(index, out);
                if !arguments.is_empty() {
                    self.event(
                        "response.function_call_arguments.delta",
                        json!({"item_id": self.ident.call_id(index), "output_index": i,
                            "delta": arguments}),
                        out,
                    );
                }
            }
            FrameBody::Usage { usage } => self.answer.usage = Some(usage),
            // Reasoning output items and logprobs are not produced on this door yet (README).
            FrameBody::Reasoning { .. }
            | FrameBody::ReasoningSignature { .. }
            | FrameBody::RedactedReasoning { .. }
            | FrameBody::Logprobs { .. } => {}
            FrameBody::End { finish_reason } => {
                self.answer.finish = Some(finish_reason);
                let (st, _) = response::status(&self.answer);
                let item_status = if st == "completed" {
                    "completed"
                } else {
                    "incomplete"
                };
                if self.next_output == 0 {
                    // Nothing was generated: still one (empty) message, as the object shows.
                    self.open_message(out);
                }
                self.close(out, item_status);
                let r = self.snapshot(self.final_output());
                let kind = if st == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                self.event(kind, json!({"response": r}), out);
                self.final_response = Some(r);
            }
            FrameBody::Error { error, .. } => {
                let e = ApiError::from(error);
                self.close(out, "incomplete");
                self.event(
                    "error",
                    json!({"code": e.code, "message": e.message, "param": e.param}),
                    out,
                );
                self.answer.error = Some(e);
                let r = self.snapshot(self.final_output());
                self.event("response.failed", json!({"response": r}), out);
            }
            // One choice on this door (the Responses API has no `n`).
            FrameBody::Start { .. }
            | FrameBody::Heartbeat
            | FrameBody::UpstreamHeaders { .. }
            | FrameBody::Choice { .. }
            | FrameBody::ChoiceEnd { .. } => {}
        }
    }

    fn finish(&mut self) -> Option<BoxFuture<'static, ()>> {
        let r = self.final_response.take()?;
        self.finish
            .as_ref()?
            .finish(r, &self.answer, self.ident.target.clone())
    }
}
