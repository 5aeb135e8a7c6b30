//! Anthropic answers → normalised events: the typed wire shapes of a Messages stream and of a
//! non-streamed `message` object (Anthropic API reference, "Streaming Messages" and "Messages" →
//! response), the stream translator and the whole-answer parser.
//!
//! The wire types take only the fields Switchyard reads; unknown fields are ignored and unknown
//! `type`s of events, content blocks and deltas are `Other` (Anthropic's versioning policy lets
//! new ones appear). Token counts are read leniently: a count that is not a non-negative integer
//! counts as absent, so an odd usage field never fails a stream that carried content.

use std::collections::{HashMap, VecDeque};

use serde::Deserialize;
use serde_json::Value;
use switchyard_schemas::request::ThinkingBlock;
use switchyard_schemas::{ErrorInfo, FinishReason, FrameBody, Usage};

use super::structured;
use crate::provider::{Answer, SseTranslator};
use crate::providers::shared::protocol;
use crate::sse::SseEvent;

pub(super) type Item = Result<FrameBody, ErrorInfo>;

/// One event of a Messages stream, by its `type` ("Streaming Messages" → "Event types").
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    MessageStart {
        #[serde(default)]
        message: MessageStart,
    },
    ContentBlockStart {
        index: Option<u64>,
        #[serde(default)]
        content_block: BlockStart,
    },
    ContentBlockDelta {
        index: Option<u64>,
        #[serde(default)]
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: Option<u64>,
    },
    MessageDelta {
        #[serde(default)]
        delta: MessageDelta,
        usage: Option<WireUsage>,
    },
    MessageStop,
    /// `{"type":"error","error":{"type","message"}}`: classified from the raw event.
    Error,
    /// `ping` and event types added later: ignored.
    #[serde(other)]
    Other,
}

/// `message_start.message`: only its usage (input counts) is read.
#[derive(Debug, Default, Deserialize)]
struct MessageStart {
    usage: Option<WireUsage>,
}

/// `content_block_start.content_block`.
#[derive(Debug, Default, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockStart {
    ToolUse {
        id: Option<String>,
        name: Option<String>,
    },
    Text {
        text: Option<String>,
    },
    Thinking {
        thinking: Option<String>,
    },
    RedactedThinking {
        data: Option<String>,
    },
    /// Server tool blocks and later types: not forwarded.
    #[default]
    #[serde(other)]
    Other,
}

/// `content_block_delta.delta`.
#[derive(Debug, Default, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: Option<String>,
    },
    InputJsonDelta {
        partial_json: Option<String>,
    },
    ThinkingDelta {
        thinking: Option<String>,
    },
    SignatureDelta {
        signature: Option<String>,
    },
    /// `citations_delta`, …: not forwarded.
    #[default]
    #[serde(other)]
    Other,
}

/// `message_delta.delta`.
#[derive(Debug, Default, Deserialize)]
struct MessageDelta {
    stop_reason: Option<String>,
}

/// An Anthropic usage object ("Messages" → `usage`; cumulative in a stream). Every count is
/// [`Count`]: read leniently.
#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    cache_read_input_tokens: Count,
    #[serde(default)]
    cache_creation_input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
    /// The cache writes split by TTL ("Prompt caching" → "Tracking cache performance").
    cache_creation: Option<CacheCreation>,
    /// `standard`, `priority`, `batch`; anything else (or not a string) is ignored.
    #[serde(default)]
    service_tier: Option<Value>,
}

impl WireUsage {
    /// The usage object at `v` (a `message` object's `usage`); an unreadable one counts as absent.
    fn from_value(v: Option<&Value>) -> Option<Self> {
        v.and_then(|v| Self::deserialize(v).ok())
    }
}

/// `usage.cache_creation`.
#[derive(Debug, Default, Deserialize)]
struct CacheCreation {
    #[serde(default)]
    ephemeral_5m_input_tokens: Count,
    #[serde(default)]
    ephemeral_1h_input_tokens: Count,
}

/// A token count as the upstream wrote it: `Some` only for a non-negative integer.
#[derive(Debug, Default, Clone, Copy)]
struct Count(Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(Value::deserialize(d)?.as_u64()))
    }
}

/// Anthropic stream → normalised events: a provisional `Usage` at `message_start` (input counts,
/// when it reports any), `Text`, `ToolCall`, the final `Usage` right before `End` (at
/// `message_stop`), or an error; the byte stream ending before `message_stop` is a `protocol` error.
#[derive(Debug, Default)]
pub struct AnthropicTranslator {
    /// `usage.input_tokens` (excludes cache reads and writes).
    input: u64,
    /// `usage.cache_read_input_tokens`.
    cache_read: u64,
    /// `usage.cache_creation_input_tokens` (all cache writes).
    cache_creation: u64,
    /// `usage.cache_creation.ephemeral_1h_input_tokens`: the 1-hour writes among them (the
    /// rest, `ephemeral_5m_input_tokens`, are 5-minute writes; no `cache_creation` object: all
    /// 5-minute). Anthropic docs, "Prompt caching" → "Tracking cache performance".
    cache_creation_1h: u64,
    /// `usage.service_tier` (`standard`, `priority`, `batch`).
    service_tier: Option<switchyard_schemas::usage::ServiceTier>,
    /// `usage.output_tokens` (cumulative).
    output: u64,
    /// From `message_delta.delta.stop_reason`.
    finish: Option<FinishReason>,
    /// Content block index → (tool index, whether any argument piece was sent).
    tools: HashMap<u64, (u32, bool)>,
    /// Next tool index (counts only `tool_use` blocks, from 0).
    next_tool: u32,
    /// The request carried [`structured::JSON_TOOL`]: its `tool_use` is the text answer, and
    /// text blocks are held in `held` until the end (see [`structured`]).
    structured: bool,
    /// Block index of the [`structured::JSON_TOOL`] call, and whether any of its input was sent.
    json_block: Option<(u64, bool)>,
    /// Text written while `structured`, sent at `message_stop` unless the JSON tool answered.
    held: String,
}

impl SseTranslator for AnthropicTranslator {
    fn on_event(&mut self, event: SseEvent, out: &mut VecDeque<Item>) -> bool {
        self.event(&event, out)
    }

    fn on_eof(&mut self, out: &mut VecDeque<Item>) {
        out.push_back(Err(protocol("upstream stream ended before message_stop")));
    }
}

/// Decodes one event's data. Without a `type` field the SSE event name stands in for it.
fn decode(ev: &SseEvent) -> Result<StreamEvent, ErrorInfo> {
    let name = ev.event.as_deref().unwrap_or("message");
    let unparsable =
        |e: serde_json::Error| protocol(format!("unparsable JSON in `{name}` event: {e}"));
    match serde_json::from_str::<StreamEvent>(&ev.data) {
        Ok(event) => Ok(event),
        Err(e) => {
            let mut v: Value = serde_json::from_str(&ev.data).map_err(unparsable)?;
            match v.as_object_mut() {
                Some(o) if !o.contains_key("type") => {
                    o.insert("type".into(), Value::String(name.to_owned()));
                    StreamEvent::deserialize(&v).map_err(unparsable)
                }
                _ => Err(unparsable(e)),
            }
        }
    }
}

impl AnthropicTranslator {
    /// A translator for one call; `structured`: the request carried [`structured::JSON_TOOL`].
    pub fn new(structured: bool) -> Self {
        Self {
            structured,
            ..Self::default()
        }
    }

    /// Handles one SSE event; returns true when the stream is finished (stop or error).
    fn event(&mut self, ev: &SseEvent, out: &mut VecDeque<Item>) -> bool {
        let result = decode(ev).and_then(|event| self.handle(event, ev, out));
        result.unwrap_or_else(|e| {
            out.push_back(Err(e));
            true
        })
    }

    fn handle(
        &mut self,
        event: StreamEvent,
        raw: &SseEvent,
        out: &mut VecDeque<Item>,
    ) -> Result<bool, ErrorInfo> {
        match event {
            StreamEvent::MessageStart { message } => {
                self.merge_usage(message.usage.as_ref());
                // The input counts are known now ("Streaming Messages": `message_start` carries
                // them): a provisional `Usage`, replaced by the final one at `message_stop`, lets
                // the worker bill a call the client abandons mid-stream from the upstream's
                // report instead of a byte estimate.
                let u = self.usage();
                if u.prompt_tokens > 0 {
                    out.push_back(Ok(FrameBody::Usage { usage: u }));
                }
            }
            StreamEvent::ContentBlockStart {
                index,
                content_block,
            } => self.block_start(index, content_block, out)?,
            StreamEvent::ContentBlockDelta { index, delta } => {
                self.block_delta(index, delta, out)?
            }
            StreamEvent::ContentBlockStop { index } => {
                if let Some((json_at, sent @ false)) = &mut self.json_block
                    && Some(*json_at) == index
                {
                    *sent = true;
                    push_text(out, Some("{}"));
                }
                // A tool called without arguments still needs valid JSON arguments.
                if let Some((tool, sent @ false)) = index.and_then(|at| self.tools.get_mut(&at)) {
                    *sent = true;
                    out.push_back(tool_frame(*tool, None, None, "{}".into()));
                }
            }
            StreamEvent::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.stop_reason.as_deref() {
                    let json_only = self.json_block.is_some() && self.next_tool == 0;
                    self.finish = Some(match finish_reason(reason) {
                        FinishReason::ToolCalls if json_only => FinishReason::Stop,
                        other => other,
                    });
                }
                self.merge_usage(usage.as_ref());
            }
            StreamEvent::MessageStop => {
                if self.json_block.is_none() {
                    let held = std::mem::take(&mut self.held);
                    push_text(out, Some(&held));
                }
                out.push_back(Ok(FrameBody::Usage {
                    usage: self.usage(),
                }));
                let finish_reason = self.finish.unwrap_or(FinishReason::Stop);
                out.push_back(Ok(FrameBody::End { finish_reason }));
                return Ok(true);
            }
            StreamEvent::Error => {
                let data: Value = serde_json::from_str(&raw.data)
                    .map_err(|e| protocol(format!("unparsable JSON in `error` event: {e}")))?;
                return Err(crate::providers::classify::stream_error(&data));
            }
            StreamEvent::Other => {}
        }
        Ok(false)
    }

    /// `content_block_start`: a tool call's first frame (id and name), or the block's first text.
    fn block_start(
        &mut self,
        index: Option<u64>,
        block: BlockStart,
        out: &mut VecDeque<Item>,
    ) -> Result<(), ErrorInfo> {
        match block {
            BlockStart::ToolUse { id, name } => {
                let field = |v: Option<String>, k: &str| {
                    v.ok_or_else(|| protocol(format!("tool_use content block without `{k}`")))
                };
                let (id, name) = (field(id, "id")?, field(name, "name")?);
                let at = block_index(index, "content_block_start")?;
                if self.structured && name == structured::JSON_TOOL {
                    self.json_block = Some((at, false));
                    return Ok(());
                }
                let tool = self.next_tool;
                self.next_tool += 1;
                self.tools.insert(at, (tool, false));
                out.push_back(tool_frame(tool, Some(id), Some(name), String::new()));
            }
            BlockStart::Text { text } => self.text(out, text.as_deref()),
            BlockStart::Thinking { thinking } => push_reasoning(out, thinking),
            BlockStart::RedactedThinking { data } => {
                let data = data.unwrap_or_default();
                out.push_back(Ok(FrameBody::RedactedReasoning { data }));
            }
            BlockStart::Other => {}
        }
        Ok(())
    }

    /// `content_block_delta`: text, a tool call's argument piece, thinking or its signature.
    fn block_delta(
        &mut self,
        index: Option<u64>,
        delta: BlockDelta,
        out: &mut VecDeque<Item>,
    ) -> Result<(), ErrorInfo> {
        match delta {
            BlockDelta::TextDelta { text } => self.text(out, text.as_deref()),
            BlockDelta::InputJsonDelta { partial_json } => {
                let piece = partial_json.unwrap_or_default();
                let at = block_index(index, "content_block_delta")?;
                if let Some((json_at, sent)) = &mut self.json_block
                    && *json_at == at
                {
                    *sent |= !piece.is_empty();
                    push_text(out, Some(&piece));
                    return Ok(());
                }
                let not_tool = || protocol(format!("input_json_delta for non-tool block {at}"));
                let (tool, sent) = self.tools.get_mut(&at).ok_or_else(not_tool)?;
                if !piece.is_empty() {
                    *sent = true;
                    out.push_back(tool_frame(*tool, None, None, piece));
                }
            }
            BlockDelta::ThinkingDelta { thinking } => push_reasoning(out, thinking),
            BlockDelta::SignatureDelta { signature } => {
                let signature = signature.unwrap_or_default();
                out.push_back(Ok(FrameBody::ReasoningSignature { signature }));
            }
            BlockDelta::Other => {}
        }
        Ok(())
    }

    /// A text piece: sent now, or held while structured output may still replace it.
    fn text(&mut self, out: &mut VecDeque<Item>, text: Option<&str>) {
        match text {
            Some(t) if self.structured => self.held.push_str(t),
            _ => push_text(out, text),
        }
    }

    /// Merges an Anthropic usage object. Counts are cumulative, so the larger value wins (this
    /// also keeps `message_start` input counts when `message_delta` omits or zeroes them).
    fn merge_usage(&mut self, u: Option<&WireUsage>) {
        let Some(u) = u else {
            return;
        };
        let get = |c: Count| c.0.unwrap_or(0);
        self.input = self.input.max(get(u.input_tokens));
        self.cache_read = self.cache_read.max(get(u.cache_read_input_tokens));
        self.cache_creation = self.cache_creation.max(get(u.cache_creation_input_tokens));
        if let Some(split) = &u.cache_creation {
            if let Some(h1) = split.ephemeral_1h_input_tokens.0 {
                self.cache_creation_1h = self.cache_creation_1h.max(h1);
            }
            // A `cache_creation` split without the total (or a larger one): the split wins.
            let split_total = get(split.ephemeral_5m_input_tokens) + self.cache_creation_1h;
            self.cache_creation = self.cache_creation.max(split_total);
        }
        if let Some(tier) = u.service_tier.as_ref().and_then(Value::as_str) {
            self.service_tier = switchyard_schemas::usage::ServiceTier::from_provider(tier);
        }
        self.output = self.output.max(get(u.output_tokens));
    }

    /// Normalised usage: Anthropic `input_tokens` excludes cache reads and writes, so they are
    /// added into `prompt_tokens` (see [`Usage`]).
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self
                .input
                .saturating_add(self.cache_read)
                .saturating_add(self.cache_creation),
            cached_tokens: self.cache_read,
            cache_write_tokens: self.cache_creation,
            completion_tokens: self.output,
            reasoning_tokens: 0,
            cache_write_1h_tokens: self.cache_creation_1h.min(self.cache_creation),
            service_tier: self.service_tier,
            ..Usage::default()
        }
    }
}

/// The block index an event needs, else a protocol error naming the event.
fn block_index(index: Option<u64>, event: &str) -> Result<u64, ErrorInfo> {
    index.ok_or_else(|| protocol(format!("`{event}` event without an index")))
}

/// Pushes a `Text` event unless the text is absent or empty.
fn push_text(out: &mut VecDeque<Item>, text: Option<&str>) {
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        out.push_back(Ok(FrameBody::Text {
            text: text.to_owned(),
        }));
    }
}

/// Pushes a `Reasoning` event unless the thinking text is absent or empty.
fn push_reasoning(out: &mut VecDeque<Item>, thinking: Option<String>) {
    if let Some(text) = thinking.filter(|t| !t.is_empty()) {
        out.push_back(Ok(FrameBody::Reasoning { text }));
    }
}

/// A `ToolCall` event (`id`/`name` only on the first piece of a call).
pub(super) fn tool_frame(
    index: u32,
    id: Option<String>,
    name: Option<String>,
    arguments: String,
) -> Item {
    Ok(FrameBody::ToolCall {
        index,
        id,
        name,
        arguments,
    })
}

/// Anthropic `stop_reason` → OpenAI `finish_reason` (unknown reasons map to `stop`).
fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::ContentFilter,
        // end_turn, stop_sequence, pause_turn, …
        _ => FinishReason::Stop,
    }
}

/// A non-streamed `message` object ("Messages" → response): the fields read.
#[derive(Debug, Deserialize)]
struct WireMessage {
    content: Option<Vec<ContentBlock>>,
    stop_reason: Option<String>,
}

/// One content block of a `message` object.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentBlock {
    Text {
        text: Option<String>,
    },
    ToolUse {
        id: Option<String>,
        name: Option<String>,
        input: Option<Value>,
    },
    Thinking {
        thinking: Option<String>,
        signature: Option<String>,
    },
    RedactedThinking {
        data: Option<String>,
    },
    /// Server tool blocks: not part of the normalised answer.
    #[serde(other)]
    Other,
}

/// Reads a non-streamed `message` object (Anthropic API reference, "Messages" → response):
/// `text` blocks coalesced, `tool_use` blocks as tool calls (`input` serialised), `stop_reason`,
/// `usage` normalised as in the stream (cache reads and writes added into `prompt_tokens`).
pub fn parse_message(v: &Value) -> Result<Answer, ErrorInfo> {
    let message = WireMessage::deserialize(v)
        .map_err(|e| protocol(format!("unreadable upstream JSON answer: {e}")))?;
    let blocks = message
        .content
        .ok_or_else(|| protocol("upstream JSON answer has no `content` array"))?;
    let mut answer = Answer::default();
    for b in blocks {
        match b {
            ContentBlock::Text { text } => answer.text.push_str(text.as_deref().unwrap_or("")),
            ContentBlock::ToolUse { id, name, input } => answer.tool_calls.push((
                id,
                name,
                input.map_or_else(|| "{}".to_owned(), |i| i.to_string()),
            )),
            ContentBlock::Thinking {
                thinking,
                signature,
            } => answer.thinking.push(ThinkingBlock::Thinking {
                thinking: thinking.unwrap_or_default(),
                signature,
            }),
            ContentBlock::RedactedThinking { data } => {
                answer.thinking.push(ThinkingBlock::RedactedThinking {
                    data: data.unwrap_or_default(),
                })
            }
            ContentBlock::Other => {}
        }
    }
    let mut t = AnthropicTranslator::default();
    t.merge_usage(WireUsage::from_value(v.get("usage")).as_ref());
    answer.usage = Some(t.usage());
    answer.finish_reason = message
        .stop_reason
        .as_deref()
        .map_or(FinishReason::Stop, finish_reason);
    Ok(answer)
}

/// [`parse_message`] for a request that carried [`structured::JSON_TOOL`]: its call becomes the
/// text content ([`structured::into_content`]).
pub fn parse_structured_message(v: &Value) -> Result<Answer, ErrorInfo> {
    parse_message(v).map(structured::into_content)
}
