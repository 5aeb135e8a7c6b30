//! Byte-level Server-Sent Events (SSE) parser used for every upstream
//! provider stream (OpenAI, Anthropic, Gemini, ...).
//!
//! The parser follows the WHATWG HTML "event stream interpretation" rules:
//!
//! * input is handled as bytes; each *complete* line is decoded as UTF-8
//!   lossily (invalid bytes become U+FFFD), so multi-byte characters split
//!   across network chunks decode correctly;
//! * lines end with `\r\n`, `\r` or `\n`; a `\r` at the end of one chunk
//!   followed by `\n` at the start of the next is a single line ending;
//! * a leading UTF-8 BOM at the very start of the stream is stripped;
//! * `field:value` / `field: value` (exactly one leading space of the value
//!   is stripped), a line without a colon is a field name with an empty
//!   value, lines starting with `:` are comments;
//! * `data` lines are joined with `\n`, `event` sets the event type, `id`
//!   sets the last event ID (ignored if it contains NUL), `retry` is only
//!   honoured if it consists solely of ASCII digits, unknown fields are
//!   ignored;
//! * a blank line dispatches the event, unless no `data` line was seen.
//!
//! [`SseParser`] is the push-based core; [`sse_stream`] adapts any byte
//! stream (e.g. `reqwest::Response::bytes_stream`) into a stream of events.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;

/// Default limit for a single line or a single event's data buffer: 16 MiB.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// UTF-8 byte order mark, stripped once at the start of a stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched Server-Sent Event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// Event type from the `event:` field; `None` when no (or an empty)
    /// `event:` field was given, i.e. the spec's default `"message"` type.
    pub event: Option<String>,
    /// Data lines of the event joined with `\n` (no trailing newline).
    pub data: String,
    /// Last event ID in effect when the event was dispatched. As in the
    /// spec, the ID persists across events until another `id:` field
    /// changes it; `None` if it was never set or was reset by an empty `id`.
    pub id: Option<String>,
    /// Reconnection time in milliseconds from a valid `retry:` field inside
    /// this event's block, if any.
    pub retry: Option<u64>,
}

/// Errors produced while parsing an SSE stream.
#[derive(Debug, thiserror::Error)]
pub enum SseError {
    /// A single line or an event's data buffer exceeded the configured limit.
    #[error("SSE line or event exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The configured limit in bytes.
        limit: usize,
    },
    /// The underlying byte stream failed.
    #[error("SSE transport error: {0}")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Per-event field state (the spec's data / event type / last event ID
/// buffers), kept separate from the line buffer so lines can be borrowed
/// from the line buffer while the event state is mutated.
#[derive(Debug, Default)]
struct EventState {
    /// Data buffer (lines joined with `\n`).
    data: String,
    /// Whether at least one `data` field was seen since the last dispatch.
    has_data: bool,
    /// Event type buffer.
    event_type: String,
    /// Last event ID buffer (persists across dispatches).
    last_id: String,
    /// `retry` value seen since the last dispatch.
    retry: Option<u64>,
}

impl EventState {
    /// Processes one complete line (without its terminator).
    fn process_line(
        &mut self,
        line: &[u8],
        limit: usize,
        out: &mut Vec<SseEvent>,
    ) -> Result<(), SseError> {
        if line.is_empty() {
            if let Some(event) = self.dispatch() {
                out.push(event);
            }
            return Ok(());
        }
        let (name, value): (&[u8], &[u8]) = match line.iter().position(|&b| b == b':') {
            // Comment line.
            Some(0) => return Ok(()),
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[]),
        };
        match name {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.has_data = true;
                self.data.push_str(&String::from_utf8_lossy(value));
                if self.data.len() > limit {
                    return Err(SseError::TooLarge { limit });
                }
            }
            b"event" => {
                self.event_type.clear();
                self.event_type.push_str(&String::from_utf8_lossy(value));
            }
            // An ID containing NUL is ignored.
            b"id" if !value.contains(&0) => {
                self.last_id.clear();
                self.last_id.push_str(&String::from_utf8_lossy(value));
            }
            // Only honoured if it consists solely of ASCII digits (hence
            // valid UTF-8); values overflowing u64 are ignored.
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                if let Some(ms) = std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                {
                    self.retry = Some(ms);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Dispatches the current event (blank line): returns it if any `data`
    /// field was seen, and resets the per-event buffers either way.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let event_type = std::mem::take(&mut self.event_type);
        let retry = self.retry.take();
        if !self.has_data {
            self.data.clear();
            return None;
        }
        self.has_data = false;
        Some(SseEvent {
            event: (!event_type.is_empty()).then_some(event_type),
            data: std::mem::take(&mut self.data),
            id: (!self.last_id.is_empty()).then(|| self.last_id.clone()),
            retry,
        })
    }
}

/// Incremental, push-based SSE parser working on raw bytes.
///
/// Feed network chunks with [`SseParser::push`] and call
/// [`SseParser::finish`] at end of stream. Each byte is scanned once and
/// copied into the line buffer at most once, so total work is linear in the
/// input size regardless of how it is chunked.
///
/// After an error the stream should be considered broken; the parser drops
/// its buffered state so it does not keep holding memory.
#[derive(Debug)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    buf: Vec<u8>,
    /// Prefix of `buf` already scanned (contains no line terminator).
    scan_pos: usize,
    /// The previous chunk ended with `\r`: skip a `\n` starting the next one.
    pending_cr: bool,
    /// Whether the start of the stream was checked for a BOM.
    bom_checked: bool,
    /// Per-event field state.
    state: EventState,
    /// Maximum size of a line or of an event's data buffer.
    max_event_bytes: usize,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SseParser {
    /// Creates a parser with the default limit of
    /// [`DEFAULT_MAX_EVENT_BYTES`] (16 MiB).
    pub fn new() -> Self {
        Self::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }

    /// Creates a parser whose lines and event data buffers may be at most
    /// `limit` bytes; larger ones make [`SseParser::push`] fail with
    /// [`SseError::TooLarge`].
    pub fn with_max_event_bytes(limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            scan_pos: 0,
            pending_cr: false,
            bom_checked: false,
            state: EventState::default(),
            max_event_bytes: limit,
        }
    }

    /// Feeds the next chunk of the byte stream, appending every event
    /// completed by it to `out` (in stream order).
    ///
    /// Events completed before an error are still appended to `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let result = self.push_inner(chunk, out);
        if result.is_err() {
            self.buf = Vec::new();
            self.scan_pos = 0;
            self.state = EventState::default();
        }
        result
    }

    fn push_inner(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if self.pending_cr && !chunk.is_empty() {
            // `pending_cr` implies the line buffer is empty: the `\r` was the
            // last byte seen and terminated a line.
            self.pending_cr = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        self.buf.extend_from_slice(chunk);

        if !self.bom_checked {
            if self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) {
                // Could still be a BOM split across chunks; wait for more.
                return Ok(());
            }
            if self.buf.starts_with(BOM) {
                self.buf.drain(..BOM.len());
            }
            self.bom_checked = true;
            self.scan_pos = 0;
        }

        let limit = self.max_event_bytes;
        let mut line_start = 0;
        let mut pos = self.scan_pos;
        while let Some(offset) = self.buf[pos..]
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
        {
            let line_end = pos + offset;
            if line_end - line_start > limit {
                return Err(SseError::TooLarge { limit });
            }
            self.state
                .process_line(&self.buf[line_start..line_end], limit, out)?;
            let mut next = line_end + 1;
            if self.buf[line_end] == b'\r' {
                match self.buf.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.pending_cr = true,
                }
            }
            line_start = next;
            pos = next;
        }

        // Only the tail after the last terminator (part of this chunk) is
        // moved, so this stays linear overall.
        self.buf.drain(..line_start);
        self.scan_pos = self.buf.len();
        if self.buf.len() > limit {
            return Err(SseError::TooLarge { limit });
        }
        Ok(())
    }

    /// Signals end of stream and returns the final, not yet dispatched event
    /// if there is one; the parser is then reset for reuse on a new stream.
    ///
    /// The spec discards an event that was not terminated by a blank line.
    /// Because many upstreams omit the final blank line, this parser is
    /// lenient: the pending event is returned if it has data **and** the
    /// last line was complete (ended with a line terminator). A trailing
    /// partial line (no terminator) is discarded together with its event,
    /// since it may be a truncated field.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let last_line_complete = self.buf.is_empty();
        let event = if last_line_complete {
            self.state.dispatch()
        } else {
            None
        };
        *self = Self::with_max_event_bytes(self.max_event_bytes);
        event
    }
}

/// Adapts a byte stream (e.g. `reqwest::Response::bytes_stream()`) into a
/// stream of [`SseEvent`]s, using a parser with the default limits.
///
/// Events are yielded in order; at the end of the byte stream
/// [`SseParser::finish`] is called and its event (if any) is yielded last.
/// Transport errors are mapped to [`SseError::Transport`]. After any error
/// the stream ends (events completed before the error are yielded first).
pub fn sse_stream<S, E>(bytes: S) -> impl Stream<Item = Result<SseEvent, SseError>>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    sse_stream_with_parser(bytes, SseParser::new())
}

/// Like [`sse_stream`], but with a caller-configured parser (e.g. one built
/// with [`SseParser::with_max_event_bytes`]).
pub fn sse_stream_with_parser<S, E>(
    bytes: S,
    parser: SseParser,
) -> impl Stream<Item = Result<SseEvent, SseError>>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    SseStream {
        inner: bytes,
        parser,
        pending: VecDeque::new(),
        scratch: Vec::new(),
        done: false,
    }
}

/// Stream state behind [`sse_stream`].
struct SseStream<S> {
    inner: S,
    parser: SseParser,
    pending: VecDeque<Result<SseEvent, SseError>>,
    scratch: Vec<SseEvent>,
    done: bool,
}

impl<S, E> Stream for SseStream<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    type Item = Result<SseEvent, SseError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(item) = this.pending.pop_front() {
                return Poll::Ready(Some(item));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    let result = this.parser.push(&chunk, &mut this.scratch);
                    this.pending.extend(this.scratch.drain(..).map(Ok));
                    if let Err(err) = result {
                        this.pending.push_back(Err(err));
                        this.done = true;
                    }
                }
                Poll::Ready(Some(Err(err))) => {
                    this.pending
                        .push_back(Err(SseError::Transport(Box::new(err))));
                    this.done = true;
                }
                Poll::Ready(None) => {
                    if let Some(event) = this.parser.finish() {
                        this.pending.push_back(Ok(event));
                    }
                    this.done = true;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// A test fixture: the stream in its "natural" chunks plus the events
    /// (including the one returned by `finish`) it must produce.
    struct Fixture {
        name: &'static str,
        chunks: Vec<Vec<u8>>,
        expected: Vec<SseEvent>,
    }

    impl Fixture {
        fn whole(&self) -> Vec<u8> {
            self.chunks.concat()
        }
    }

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_owned),
            data: data.to_owned(),
            id: None,
            retry: None,
        }
    }

    fn data(d: &str) -> SseEvent {
        ev(None, d)
    }

    /// Feeds `chunks` into a fresh parser and returns all events, including
    /// the one produced by `finish`.
    fn run<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.push(chunk, &mut out).unwrap();
        }
        if let Some(event) = parser.finish() {
            out.push(event);
        }
        out
    }

    /// Split offsets to test for a stream of `len` bytes: every offset,
    /// except for very large streams where every offset would be quadratic
    /// (150 000 splits x 150 000 bytes); those use every offset near the
    /// start, the end and any line terminator, plus a dense stride.
    fn split_offsets(whole: &[u8]) -> Vec<usize> {
        const EVERY_OFFSET_MAX: usize = 20_000;
        let len = whole.len();
        if len <= EVERY_OFFSET_MAX {
            return (0..=len).collect();
        }
        let offsets: Vec<usize> = (0..=len)
            .filter(|&i| {
                i < 512
                    || i + 512 > len
                    || i % 997 == 0
                    || whole[i.saturating_sub(4)..(i + 4).min(len)]
                        .iter()
                        .any(|&b| b == b'\n' || b == b'\r')
            })
            .collect();
        offsets
    }

    fn check(fixture: &Fixture) {
        let whole = fixture.whole();
        let name = fixture.name;
        assert_eq!(run([whole.as_slice()]), fixture.expected, "{name}: whole");
        assert_eq!(
            run(fixture.chunks.iter().map(Vec::as_slice)),
            fixture.expected,
            "{name}: natural chunks"
        );
        for split in split_offsets(&whole) {
            let (a, b) = whole.split_at(split);
            assert_eq!(
                run([a, b]),
                fixture.expected,
                "{name}: split at byte {split}"
            );
        }
        assert_eq!(
            run(whole.chunks(1)),
            fixture.expected,
            "{name}: one byte at a time"
        );
        // Empty chunks interleaved must be harmless.
        assert_eq!(
            run(whole.chunks(7).flat_map(|c| [&[][..], c])),
            fixture.expected,
            "{name}: with empty chunks"
        );
    }

    fn chunks(parts: &[&str]) -> Vec<Vec<u8>> {
        parts.iter().map(|p| p.as_bytes().to_vec()).collect()
    }

    /// [`check`] of the fixture `name` written as the text `parts`.
    fn check_parts(name: &'static str, parts: &[&str], expected: Vec<SseEvent>) {
        check(&Fixture {
            name,
            chunks: chunks(parts),
            expected,
        });
    }

    const OPENAI_1: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
    const OPENAI_2: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"}}]}"#;
    const OPENAI_3: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;

    fn openai_fixture(sep: &str, name: &'static str) -> Fixture {
        Fixture {
            name,
            chunks: vec![
                format!("data{sep}{OPENAI_1}\n\n").into_bytes(),
                format!("data{sep}{OPENAI_2}\n\n").into_bytes(),
                format!("data{sep}{OPENAI_3}\n\n").into_bytes(),
                format!("data{sep}[DONE]\n\n").into_bytes(),
            ],
            expected: vec![
                data(OPENAI_1),
                data(OPENAI_2),
                data(OPENAI_3),
                data("[DONE]"),
            ],
        }
    }

    #[test]
    fn openai_stream() {
        check(&openai_fixture(": ", "openai"));
    }

    #[test]
    fn openai_stream_without_space() {
        check(&openai_fixture(":", "openai-no-space"));
    }

    #[test]
    fn anthropic_stream() {
        let start = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","usage":{"input_tokens":10,"output_tokens":1}}}"#;
        let block_start =
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
        let delta = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello, world"}}"#;
        let block_stop = r#"{"type":"content_block_stop","index":0}"#;
        let msg_delta = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}"#;
        let msg_stop = r#"{"type":"message_stop"}"#;
        check_parts(
            "anthropic",
            &[
                &format!("event: message_start\ndata: {start}\n\n"),
                &format!("event: content_block_start\ndata: {block_start}\n\n"),
                "event: ping\ndata: {\"type\": \"ping\"}\n\n",
                "event: content_block_delta\n",
                r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_del"#,
                "ta\",\"text\":\"Hello, world\"}}\n\n",
                &format!("event: content_block_stop\ndata: {block_stop}\n\n"),
                &format!("event: message_delta\ndata: {msg_delta}\n\n"),
                &format!("event: message_stop\ndata: {msg_stop}\n\n"),
            ],
            vec![
                ev(Some("message_start"), start),
                ev(Some("content_block_start"), block_start),
                ev(Some("ping"), r#"{"type": "ping"}"#),
                ev(Some("content_block_delta"), delta),
                ev(Some("content_block_stop"), block_stop),
                ev(Some("message_delta"), msg_delta),
                ev(Some("message_stop"), msg_stop),
            ],
        );
    }

    #[test]
    fn comments_id_retry_and_unknown_fields() {
        check_parts(
            "comments-id-retry",
            &[
                ": ping\n\n",
                ":\n",
                "id: 1\nretry: 3000\ndata: a\n\n",
                ": keep-alive\n",
                "data: b\nfoo: bar\n\n",
                "id\ndata: c\n\n",
                "retry: 12x\nretry:\nid: a\0b\ndata: d\n\n",
                "id: 7\nretry: 5\n\n",
                "event: lost\n\n",
                "data: e\n\n",
                "retry: 18446744073709551616\nid: 8\nevent:\ndata: f\n\n",
                "data\n\n",
                "Data: ignored\nDATA: ignored\ndata : ignored\n\n",
            ],
            vec![
                SseEvent {
                    id: Some("1".into()),
                    retry: Some(3000),
                    ..data("a")
                },
                // The last event ID persists across events.
                SseEvent {
                    id: Some("1".into()),
                    ..data("b")
                },
                // `id` without a colon resets the ID.
                data("c"),
                // Invalid retry and an ID containing NUL are ignored.
                data("d"),
                // The ID from the data-less block persists; its retry and
                // the data-less `event: lost` do not leak into this event.
                SseEvent {
                    id: Some("7".into()),
                    ..data("e")
                },
                // Overflowing retry ignored; empty `event:` means default.
                SseEvent {
                    id: Some("8".into()),
                    ..data("f")
                },
                // `data` without a colon: a data line with an empty value.
                SseEvent {
                    id: Some("8".into()),
                    ..data("")
                },
            ],
        );
    }

    #[test]
    fn crlf_line_endings() {
        check_parts(
            "crlf",
            &[
                ": comment\r\n\r\n",
                "event: a\r\ndata: 1\r\ndata: 2\r\n\r\n",
                "data: 3\r\n\r\n",
            ],
            vec![ev(Some("a"), "1\n2"), data("3")],
        );
    }

    #[test]
    fn lone_cr_line_endings() {
        check_parts(
            "lone-cr",
            &["event: a\rdata: 1\rdata: 2\r\r", "data: 3\r\r"],
            vec![ev(Some("a"), "1\n2"), data("3")],
        );
    }

    #[test]
    fn mixed_line_endings() {
        // CRLF then CR (blank); LF then CRLF (blank); CR then LF (blank);
        // LF LF.
        check_parts(
            "mixed",
            &[
                "data: a\r\n\r",
                "data: b\n\r\n",
                "data: c\r\n",
                "data: d\n\n",
            ],
            vec![data("a"), data("b"), data("c\nd")],
        );
    }

    #[test]
    fn multi_line_data() {
        check_parts(
            "multi-line",
            &[
                "data: line1\ndata: line2\ndata:\ndata:  indented\ndata\ndata: last\n\n",
                "data:\n\n",
                "data\ndata\n\n",
            ],
            vec![
                data("line1\nline2\n\n indented\n\nlast"),
                data(""),
                data("\n"),
            ],
        );
    }

    #[test]
    fn multi_byte_utf8() {
        check_parts(
            "utf8",
            &[
                "event: ünïcödé\ndata: héllo 世界 🎉\n\n",
                "data: 🎉🎉\ndata: ok\n\n",
            ],
            vec![ev(Some("ünïcödé"), "héllo 世界 🎉"), data("🎉🎉\nok")],
        );
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let fixture = Fixture {
            name: "invalid-utf8",
            chunks: vec![
                b"data: a\xFFb\xE4\xB8\n\n".to_vec(),
                b"data: ok\n\n".to_vec(),
            ],
            expected: vec![data("a\u{FFFD}b\u{FFFD}"), data("ok")],
        };
        check(&fixture);
    }

    #[test]
    fn leading_bom_is_stripped_once() {
        check_parts(
            "bom",
            &["\u{FEFF}data: bom\n\n", "data: \u{FEFF}kept\n\n"],
            vec![data("bom"), data("\u{FEFF}kept")],
        );

        // Only the first BOM is stripped; a second one makes the field name
        // unknown.
        check_parts(
            "double-bom",
            &["\u{FEFF}\u{FEFF}data: x\n\n", "data: y\n\n"],
            vec![data("y")],
        );

        // A partial BOM prefix followed by something else is not stripped.
        let partial = Fixture {
            name: "partial-bom",
            chunks: vec![b"\xEF\xBB\n".to_vec(), b"data: z\n\n".to_vec()],
            expected: vec![data("z")],
        };
        check(&partial);
    }

    #[test]
    fn large_data_line() {
        let pattern = "abcdefgh-世界-🎉 ";
        let mut big = String::new();
        while big.len() < 150_000 {
            big.push_str(pattern);
        }
        let fixture = Fixture {
            name: "large",
            chunks: vec![
                format!("data: {big}\n").into_bytes(),
                b"\n".to_vec(),
                b"data: after\n\n".to_vec(),
            ],
            expected: vec![data(&big), data("after")],
        };
        assert!(fixture.whole().len() > 150_000);
        check(&fixture);
    }

    #[test]
    fn finish_is_lenient_about_missing_blank_line() {
        check_parts(
            "no-final-blank-line",
            &["data: a\n\n", "event: e\ndata: b\r\n"],
            vec![data("a"), ev(Some("e"), "b")],
        );

        check_parts("no-final-blank-line-cr", &["data: a\r"], vec![data("a")]);
    }

    #[test]
    fn finish_discards_incomplete_last_line_or_dataless_event() {
        check_parts(
            "incomplete-last-line",
            &["data: a\n\n", "data: b\ndata: trunc"],
            vec![data("a")],
        );

        check_parts(
            "dataless-at-eof",
            &["data: a\n\n", "event: x\nid: 3\n"],
            vec![data("a")],
        );

        let empty = Fixture {
            name: "empty",
            chunks: Vec::new(),
            expected: Vec::new(),
        };
        check(&empty);
    }

    #[test]
    fn finish_resets_parser() {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        parser.push(b"id: 1\ndata: a\n", &mut out).unwrap();
        assert_eq!(
            parser.finish(),
            Some(SseEvent {
                id: Some("1".into()),
                ..data("a")
            })
        );
        assert_eq!(parser.finish(), None);
        parser.push(b"\xEF\xBB\xBFdata: b\n\n", &mut out).unwrap();
        assert_eq!(out, vec![data("b")]);
    }

    #[test]
    fn too_large_partial_line() {
        let mut parser = SseParser::with_max_event_bytes(16);
        let mut out = Vec::new();
        parser.push(b"data: 0123456789", &mut out).unwrap(); // 16 bytes: ok
        let err = parser.push(b"a", &mut out).unwrap_err();
        assert!(matches!(err, SseError::TooLarge { limit: 16 }), "{err:?}");
        assert!(err.to_string().contains("16"));
    }

    #[test]
    fn too_large_complete_line_in_one_chunk() {
        let mut parser = SseParser::with_max_event_bytes(16);
        let mut out = Vec::new();
        let err = parser
            .push(b"data: ok\n\ndata: 0123456789abcdef\n\n", &mut out)
            .unwrap_err();
        assert!(matches!(err, SseError::TooLarge { limit: 16 }), "{err:?}");
        // Events completed before the error are still delivered.
        assert_eq!(out, vec![data("ok")]);
    }

    #[test]
    fn too_large_event_data() {
        let mut parser = SseParser::with_max_event_bytes(16);
        let mut out = Vec::new();
        parser
            .push(b"data: 01234\ndata: 56789\n", &mut out)
            .unwrap();
        let err = parser.push(b"data: abcde\n", &mut out).unwrap_err();
        assert!(matches!(err, SseError::TooLarge { limit: 16 }), "{err:?}");
        assert!(out.is_empty());
    }

    #[test]
    fn default_limit_accepts_large_lines() {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        let line = vec![b'x'; 1 << 20];
        parser.push(b"data: ", &mut out).unwrap();
        for part in line.chunks(4096) {
            parser.push(part, &mut out).unwrap();
        }
        parser.push(b"\n\n", &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data.len(), 1 << 20);
    }

    fn byte_chunks(parts: &[&'static [u8]]) -> Vec<Result<Bytes, std::io::Error>> {
        parts.iter().map(|p| Ok(Bytes::from_static(p))).collect()
    }

    #[test]
    fn sse_stream_yields_events_in_order() {
        let chunks = byte_chunks(&[
            b"\xEF\xBB",
            b"\xBFevent: content_block_delta\r",
            b"\ndata: {\"text\":\"h\xC3",
            b"\xA9\"}\r\n\r\n: ping\n\ndata: one\n\nda",
            b"ta: two\n\ndata: [DONE]\n",
        ]);
        let events: Vec<_> = futures::executor::block_on(
            sse_stream(futures::stream::iter(chunks)).collect::<Vec<_>>(),
        );
        let events: Vec<SseEvent> = events.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            events,
            vec![
                ev(Some("content_block_delta"), "{\"text\":\"hé\"}"),
                data("one"),
                data("two"),
                // Delivered by `finish` despite the missing blank line.
                data("[DONE]"),
            ]
        );
    }

    #[test]
    fn sse_stream_maps_transport_errors_and_stops() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"data: one\n\ndata: partial\n")),
            Err(std::io::Error::other("connection reset")),
            Ok(Bytes::from_static(b"\ndata: never\n\n")),
        ];
        let mut stream = sse_stream(futures::stream::iter(chunks));
        futures::executor::block_on(async {
            assert_eq!(stream.next().await.unwrap().unwrap(), data("one"));
            let err = stream.next().await.unwrap().unwrap_err();
            assert!(matches!(err, SseError::Transport(_)), "{err:?}");
            assert!(err.to_string().contains("connection reset"));
            assert!(std::error::Error::source(&err).is_some());
            assert!(stream.next().await.is_none());
            assert!(stream.next().await.is_none());
        });
    }

    #[test]
    fn sse_stream_reports_too_large_after_completed_events() {
        let chunks = byte_chunks(&[b"data: ok\n\ndata: this line is far too long\n\n"]);
        let stream = sse_stream_with_parser(
            futures::stream::iter(chunks),
            SseParser::with_max_event_bytes(16),
        );
        let items = futures::executor::block_on(stream.collect::<Vec<_>>());
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].as_ref().unwrap(), &data("ok"));
        assert!(matches!(items[1], Err(SseError::TooLarge { limit: 16 })));
    }
}
