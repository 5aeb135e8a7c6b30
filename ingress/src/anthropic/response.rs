//! Writes Anthropic wire responses: the `Message` object (Anthropic API reference, "Messages") and
//! the SSE event sequence of "Streaming Messages":
//!
//! `message_start` → `ping` → per content block `content_block_start` / `content_block_delta`*
//! (`text_delta` or `input_json_delta`) / `content_block_stop` → `message_delta` (stop reason and
//! usage) → `message_stop`; after a failure mid-stream, one `error` event ends the stream instead.
//!
//! Usage: our frames report usage only at the end, so `message_start` carries zero counts and
//! `message_delta.usage` carries the real `input_tokens`, `cache_creation_input_tokens`,
//! `cache_read_input_tokens` and `output_tokens`. "Streaming Messages" documents the
//! `message_delta` usage counts as cumulative, with the input and cache fields optional; the
//! official SDKs overwrite their snapshot's counts with them (Python SDK `accumulate_event`).

use crate::error::ApiError;
use crate::route::Aggregate;
use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::VecDeque;
use switchyard_schemas::request::ThinkingBlock;
use switchyard_schemas::{ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage};

/// Identity of one response: the `id` and `model` of the `Message`.
#[derive(Debug, Clone)]
pub struct MessageMeta {
    /// `msg_<request id, simple form>`.
    pub id: String,
    /// The model the client asked for (never the upstream id).
    pub model: String,
}

/// Normalised finish reason → Anthropic `stop_reason` ("Messages", `stop_reason`):
/// `stop`→`end_turn`, `length`→`max_tokens`, `tool_calls`→`tool_use`,
/// `content_filter`→`refusal`. Our frames do not say whether a stop sequence matched, so
/// `stop_sequence` is never produced (and `stop_sequence` is always `null`).
pub fn stop_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::ContentFilter => "refusal",
    }
}

/// Anthropic `usage` ("Messages", `usage`): `input_tokens` excludes cache reads and writes, which
/// are reported apart; our [`Usage::prompt_tokens`] includes them, so they are subtracted. With
/// cache writes, the `cache_creation` object splits them by TTL
/// (`ephemeral_5m_input_tokens` / `ephemeral_1h_input_tokens`, Anthropic docs "Prompt caching"),
/// in Anthropic's key order, so an upstream Anthropic usage reaches the client unchanged.
pub fn usage(u: Usage) -> Value {
    let input = u
        .prompt_tokens
        .saturating_sub(u.cached_tokens)
        .saturating_sub(u.cache_write_tokens);
    let mut v = json!({
        "input_tokens": input,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cached_tokens,
    });
    if u.cache_write_tokens > 0
        && let Some(o) = v.as_object_mut()
    {
        let h1 = u.cache_write_1h_tokens.min(u.cache_write_tokens);
        o.insert(
            "cache_creation".into(),
            json!({
                "ephemeral_5m_input_tokens": u.cache_write_tokens - h1,
                "ephemeral_1h_input_tokens": h1,
            }),
        );
    }
    if let Some(o) = v.as_object_mut() {
        o.insert("output_tokens".into(), json!(u.completion_tokens));
    }
    v
}

/// A `Message` object with the given `content`, `stop_reason` and `usage`.
fn message_object(meta: &MessageMeta, content: Value, stop: Value, usage: Value) -> Value {
    json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage,
    })
}

/// Tool-call arguments as the `input` object of a `tool_use` block (empty arguments → `{}`).
/// Arguments that are not a JSON object are an upstream protocol error: Anthropic's `input` is
/// always an object.
fn tool_input(name: &str, arguments: &str) -> Result<Value, ErrorInfo> {
    if arguments.trim().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v) if v.is_object() => Ok(v),
        _ => Err(ErrorInfo::new(
            ErrorClass::Protocol,
            format!("the upstream's arguments for tool `{name}` are not a JSON object"),
        )),
    }
}

/// A thinking block as Anthropic writes it: `{"type":"thinking","thinking","signature"}` (the
/// signature is always present, empty when the upstream sent none) or
/// `{"type":"redacted_thinking","data"}`.
pub fn thinking_block(block: &ThinkingBlock) -> Value {
    match block {
        ThinkingBlock::Thinking {
            thinking,
            signature,
        } => json!({"type": "thinking", "thinking": thinking,
            "signature": signature.as_deref().unwrap_or("")}),
        ThinkingBlock::RedactedThinking { data } => {
            json!({"type": "redacted_thinking", "data": data})
        }
        // Never produced by an answer (an input-only OpenAI item); shown as redacted.
        ThinkingBlock::Reasoning {
            encrypted_content, ..
        } => json!({"type": "redacted_thinking", "data": encrypted_content}),
    }
}

/// The non-streaming `Message`: thinking blocks, a `text` block (when there is text), then one `tool_use` block
/// per tool call with its arguments parsed into `input`.
pub fn message(meta: &MessageMeta, agg: &Aggregate) -> Result<Value, ApiError> {
    let mut content = Vec::with_capacity(agg.tool_calls.len() + agg.thinking.len() + 1);
    for block in &agg.thinking {
        content.push(thinking_block(block));
    }
    if !agg.text.is_empty() {
        content.push(json!({"type": "text", "text": agg.text}));
    }
    for call in &agg.tool_calls {
        let input = tool_input(&call.name, &call.arguments)?;
        content.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
    }
    Ok(message_object(
        meta,
        Value::Array(content),
        json!(stop_reason(agg.finish)),
        usage(agg.usage.unwrap_or_default()),
    ))
}

/// One SSE event: `event: <name>` and `data: <json>` lines.
pub fn event(name: &str, data: &Value) -> Bytes {
    let mut buf = Vec::with_capacity(128);
    buf.extend_from_slice(b"event: ");
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(b"\ndata: ");
    // Serialising a `Value` to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut buf, data);
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

/// The `error` event that ends a failed stream: `{"type":"error","error":{"type","message"}}`.
pub fn error_event(err: &ApiError) -> Bytes {
    event("error", &err.anthropic_body())
}

/// The content block currently open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// A `text` block at this block index.
    Text(u32),
    /// A `tool_use` block at this block index.
    Tool(u32),
    /// A `thinking` block at this block index (closed by its signature or the next block).
    Thinking(u32),
}

impl crate::front_door::StreamEncode for StreamEncoder {
    fn start(&mut self, out: &mut VecDeque<Bytes>) {
        StreamEncoder::start(self, out);
    }

    fn frame(&mut self, frame: FrameBody, out: &mut VecDeque<Bytes>) {
        StreamEncoder::frame(self, frame, out);
    }
}

/// Turns the normalised frame stream into Anthropic stream events. Text and tool calls become
/// content blocks numbered from 0 in order of appearance; a block is closed before the next one
/// opens, and each tool-call index gets its own `tool_use` block.
#[derive(Debug)]
pub struct StreamEncoder {
    meta: MessageMeta,
    open: Option<Open>,
    next_block: u32,
    /// Tool-call index → its block index.
    tool_blocks: Vec<Option<u32>>,
    usage: Usage,
}

impl StreamEncoder {
    /// An encoder for the message `meta`.
    pub fn new(meta: MessageMeta) -> Self {
        Self {
            meta,
            open: None,
            next_block: 0,
            tool_blocks: Vec::new(),
            usage: Usage::default(),
        }
    }

    /// The opening events: `message_start` (empty content, zero usage) and one `ping`.
    pub fn start(&self, out: &mut VecDeque<Bytes>) {
        let message = message_object(&self.meta, json!([]), Value::Null, usage(Usage::default()));
        out.push_back(event(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        ));
        out.push_back(event("ping", &json!({"type": "ping"})));
    }

    /// Encodes one frame into zero or more events.
    pub fn frame(&mut self, frame: FrameBody, out: &mut VecDeque<Bytes>) {
        match frame {
            FrameBody::Text { text } => self.text(&text, out),
            FrameBody::ToolCall {
                index,
                id,
                name,
                arguments,
            } => self.tool_call(index, id, name, &arguments, out),
            FrameBody::Reasoning { text } => self.thinking(&text, out),
            FrameBody::ReasoningSignature { signature } => {
                let index = self.thinking_index(out);
                let delta = json!({"type": "signature_delta", "signature": signature});
                Self::delta(index, delta, out);
                self.close(out);
            }
            FrameBody::RedactedReasoning { data } => {
                let block = json!({"type": "redacted_thinking", "data": data});
                self.open_block(block, out);
                self.close(out);
            }
            FrameBody::Usage { usage } => self.usage = usage,
            FrameBody::End { finish_reason } => {
                self.close(out);
                let delta = json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason(finish_reason), "stop_sequence": null},
                    "usage": usage(self.usage),
                });
                out.push_back(event("message_delta", &delta));
                out.push_back(event("message_stop", &json!({"type": "message_stop"})));
            }
            FrameBody::Error { error, .. } => out.push_back(error_event(&error.into())),
            // Anthropic has no log probabilities.
            // One choice on this door (no `n`).
            FrameBody::Start { .. }
            | FrameBody::Heartbeat
            | FrameBody::Logprobs { .. }
            | FrameBody::UpstreamHeaders { .. }
            | FrameBody::Choice { .. }
            | FrameBody::ChoiceEnd { .. } => {}
        }
    }

    /// Closes the open block, if any.
    fn close(&mut self, out: &mut VecDeque<Bytes>) {
        if let Some(Open::Text(i) | Open::Tool(i) | Open::Thinking(i)) = self.open.take() {
            out.push_back(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": i}),
            ));
        }
    }

    /// Closes the open block and starts `block` at the next index, which it returns.
    fn open_block(&mut self, block: Value, out: &mut VecDeque<Bytes>) -> u32 {
        self.close(out);
        let index = self.next_block;
        self.next_block += 1;
        let start = json!({"type": "content_block_start", "index": index, "content_block": block});
        out.push_back(event("content_block_start", &start));
        index
    }

    fn delta(index: u32, delta: Value, out: &mut VecDeque<Bytes>) {
        let data = json!({"type": "content_block_delta", "index": index, "delta": delta});
        out.push_back(event("content_block_delta", &data));
    }

    /// The open thinking block's index, opening one (`{"type":"thinking","thinking":""}`, as
    /// "Extended thinking" → streaming shows it) when none is.
    fn thinking_index(&mut self, out: &mut VecDeque<Bytes>) -> u32 {
        match self.open {
            Some(Open::Thinking(i)) => i,
            _ => {
                let i = self.open_block(json!({"type": "thinking", "thinking": ""}), out);
                self.open = Some(Open::Thinking(i));
                i
            }
        }
    }

    fn thinking(&mut self, text: &str, out: &mut VecDeque<Bytes>) {
        if text.is_empty() {
            return;
        }
        let index = self.thinking_index(out);
        Self::delta(
            index,
            json!({"type": "thinking_delta", "thinking": text}),
            out,
        );
    }

    fn text(&mut self, text: &str, out: &mut VecDeque<Bytes>) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some(Open::Text(i)) => i,
            _ => {
                let i = self.open_block(json!({"type": "text", "text": ""}), out);
                self.open = Some(Open::Text(i));
                i
            }
        };
        Self::delta(index, json!({"type": "text_delta", "text": text}), out);
    }

    fn tool_call(
        &mut self,
        call: u32,
        id: Option<String>,
        name: Option<String>,
        arguments: &str,
        out: &mut VecDeque<Bytes>,
    ) {
        let slot = call as usize;
        if self.tool_blocks.len() <= slot {
            self.tool_blocks.resize(slot + 1, None);
        }
        let index = match self.tool_blocks[slot] {
            Some(i) => i,
            None => {
                // The worker sends id and name on a call's first piece; a stable id otherwise.
                let id = id.unwrap_or_else(|| format!("toolu_{}_{call}", self.meta.id));
                let block = json!({"type": "tool_use", "id": id, "name": name.unwrap_or_default(), "input": {}});
                let i = self.open_block(block, out);
                self.open = Some(Open::Tool(i));
                self.tool_blocks[slot] = Some(i);
                i
            }
        };
        // The worker's `{}` for a call without arguments (FC-38) may come after the block closed:
        // its `content_block_start` already says `"input": {}`, and no delta may follow a stop.
        let closed_empty = arguments == "{}" && self.open != Some(Open::Tool(index));
        if !arguments.is_empty() && !closed_empty {
            let delta = json!({"type": "input_json_delta", "partial_json": arguments});
            Self::delta(index, delta, out);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::route::ToolCallAcc;

    fn meta() -> MessageMeta {
        MessageMeta {
            id: "msg_1".into(),
            model: "demo/mock".into(),
        }
    }

    /// The event names of `encode`'s output, in order.
    /// The event names, space-separated.
    fn names_of(events: &[(String, Value)]) -> String {
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        names.join(" ")
    }

    fn encode(frames: Vec<FrameBody>) -> Vec<(String, Value)> {
        let mut enc = StreamEncoder::new(meta());
        let mut out = VecDeque::new();
        enc.start(&mut out);
        for f in frames {
            enc.frame(f, &mut out);
        }
        out.iter()
            .map(|b| {
                let s = std::str::from_utf8(b).unwrap();
                let (head, data) = s.trim_end().split_once('\n').unwrap();
                let name = head.strip_prefix("event: ").unwrap().to_owned();
                (
                    name,
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
                )
            })
            .collect()
    }

    fn tool(index: u32, id: Option<&str>, arguments: &str) -> FrameBody {
        FrameBody::ToolCall {
            index,
            id: id.map(str::to_owned),
            name: id.map(|_| "w".to_owned()),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn text_then_tools_get_separate_blocks() {
        let usage = Usage {
            prompt_tokens: 10,
            cached_tokens: 3,
            cache_write_tokens: 2,
            completion_tokens: 7,
            reasoning_tokens: 0,
            ..Default::default()
        };
        let events = encode(vec![
            FrameBody::Text { text: "Hi".into() },
            tool(0, Some("c0"), ""),
            tool(0, None, "{\"a\":"),
            tool(1, Some("c1"), "{}"),
            tool(0, None, "1}"),
            FrameBody::Usage { usage },
            FrameBody::End {
                finish_reason: FinishReason::ToolCalls,
            },
        ]);
        assert_eq!(
            names_of(&events),
            "message_start ping content_block_start content_block_delta \
             content_block_stop content_block_start content_block_delta \
             content_block_stop content_block_start content_block_delta \
             content_block_delta content_block_stop message_delta message_stop"
        );
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 0);
        assert_eq!(events[5].1["content_block"]["id"], "c0");
        assert_eq!(events[5].1["index"], 1);
        assert_eq!(events[8].1["index"], 2);
        // A late piece of call 0 goes to call 0's block.
        assert_eq!(events[10].1["index"], 1);
        assert_eq!(events[10].1["delta"]["partial_json"], "1}");
        let d = &events[12].1;
        assert_eq!(d["delta"]["stop_reason"], "tool_use");
        assert_eq!(
            d["usage"],
            json!({"input_tokens": 5, "cache_creation_input_tokens": 2,
                "cache_read_input_tokens": 3,
                "cache_creation": {"ephemeral_5m_input_tokens": 2, "ephemeral_1h_input_tokens": 0},
                "output_tokens": 7})
        );
    }

    /// FC-34: the Anthropic usage object comes back byte for byte (keys in Anthropic's order).
    #[test]
    fn fc34_usage_round_trips_with_its_ttl_split() {
        let u = Usage {
            prompt_tokens: 9640,
            cache_write_tokens: 9628,
            cache_write_1h_tokens: 9628,
            completion_tokens: 20,
            ..Default::default()
        };
        assert_eq!(
            usage(u).to_string(),
            r#"{"input_tokens":12,"cache_creation_input_tokens":9628,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":9628},"output_tokens":20}"#
        );
    }

    /// FC-38: the `{}` of an argument-less call that arrives after its block closed adds no
    /// delta after that block's stop.
    #[test]
    fn late_empty_arguments_after_the_block_closed() {
        let events = encode(vec![
            tool(0, Some("c0"), ""),
            tool(1, Some("c1"), "{\"a\":1}"),
            tool(1, None, ""),
            tool(0, None, "{}"),
            FrameBody::End {
                finish_reason: FinishReason::ToolCalls,
            },
        ]);
        assert_eq!(
            names_of(&events),
            "message_start ping content_block_start content_block_stop \
             content_block_start content_block_delta content_block_stop \
             message_delta message_stop"
        );
        assert_eq!(events[2].1["content_block"]["input"], json!({}));
    }

    #[test]
    fn error_ends_without_message_stop() {
        let error = ErrorInfo::new(ErrorClass::Overloaded, "busy");
        let events = encode(vec![
            FrameBody::Text { text: "a".into() },
            FrameBody::Error {
                error,
                content_sent: true,
            },
        ]);
        let (name, data) = events.last().unwrap();
        assert_eq!(name, "error");
        assert_eq!(
            data,
            &json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
        );
        assert!(events.iter().all(|(n, _)| n != "message_stop"));
    }

    #[test]
    fn message_object_and_bad_arguments() {
        let mut agg = Aggregate {
            more_choices: Vec::new(),
            text: String::new(),
            tool_calls: vec![ToolCallAcc {
                id: "c".into(),
                name: "w".into(),
                arguments: "{\"x\":1}".into(),
            }],
            finish: FinishReason::ToolCalls,
            usage: None,
            thinking: Vec::new(),
            logprobs: Vec::new(),
        };
        let m = message(&meta(), &agg).unwrap();
        assert_eq!(
            m["content"],
            json!([{"type": "tool_use", "id": "c", "name": "w", "input": {"x": 1}}])
        );
        assert_eq!(m["stop_reason"], "tool_use");
        agg.tool_calls[0].arguments = "[1]".into();
        assert_eq!(message(&meta(), &agg).unwrap_err().status.as_u16(), 502);
    }
}
