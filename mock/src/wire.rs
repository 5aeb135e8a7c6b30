//! SSE framing, timing plans and streaming bodies shared by both providers.

use std::collections::VecDeque;
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use tokio_util::sync::CancellationToken;

use super::behaviour::Behaviour;

/// Pause between frames when a body is split at byte offsets.
pub(crate) const SPLIT_PAUSE: Duration = Duration::from_millis(2);

/// Invalid, non-SSE bytes (including invalid UTF-8) written by `garbage=1`.
const GARBAGE: &[u8] = b"\xff\xfe\xfd{not sse} \xc3\x28 \x80garbage";

/// How SSE lines are written (`compact=1`, `crlf=1`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SseFormat {
    compact: bool,
    crlf: bool,
}

impl SseFormat {
    /// Format requested by the behaviour.
    pub(crate) fn new(b: &Behaviour) -> Self {
        Self {
            compact: b.compact,
            crlf: b.crlf,
        }
    }

    fn newline(self) -> &'static str {
        if self.crlf { "\r\n" } else { "\n" }
    }

    fn field(self, name: &str, value: &str, out: &mut String) {
        out.push_str(name);
        out.push(':');
        if !self.compact {
            out.push(' ');
        }
        out.push_str(value);
        out.push_str(self.newline());
    }

    /// `data: <data>` followed by a blank line.
    pub(crate) fn data(self, data: &str) -> Bytes {
        let mut out = String::with_capacity(data.len() + 10);
        self.field("data", data, &mut out);
        out.push_str(self.newline());
        Bytes::from(out)
    }

    /// `event: <name>`, `data: <data>` and a blank line.
    pub(crate) fn event(self, name: &str, data: &str) -> Bytes {
        let mut out = String::with_capacity(data.len() + name.len() + 20);
        self.field("event", name, &mut out);
        self.field("data", data, &mut out);
        out.push_str(self.newline());
        Bytes::from(out)
    }

    /// Garbage bytes terminated by a blank line.
    pub(crate) fn garbage(self) -> Bytes {
        let mut out = BytesMut::from(GARBAGE);
        out.extend_from_slice(self.newline().as_bytes());
        out.extend_from_slice(self.newline().as_bytes());
        out.freeze()
    }
}

/// One element of a stream script.
#[derive(Debug, Clone)]
pub(crate) enum Item {
    /// Framing event (role chunk, block start/stop, ping): no inter-chunk delay.
    Frame(Bytes),
    /// A content delta: counted by `error_after`, separated by `chunk_delay_ms`.
    Content(Bytes),
}

/// The provider-specific events of one streamed answer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Script {
    /// Sent immediately, even when hanging (Anthropic `message_start`).
    pub(crate) prelude: Vec<Bytes>,
    /// Sent after `ttft_ms`.
    pub(crate) body: Vec<Item>,
    /// Sent after a successful body (finish chunk, usage, `[DONE]`, `message_stop`).
    pub(crate) trailer: Vec<Bytes>,
    /// Sent instead of the rest when `error_after` triggers.
    pub(crate) error: Bytes,
}

/// One write: wait `delay`, then send `bytes` as a body frame.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) delay: Duration,
    pub(crate) bytes: Bytes,
}

/// A timed sequence of body frames, optionally never ending.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    pub(crate) steps: Vec<Step>,
    pub(crate) hang: bool,
    /// Write [`KEEPALIVE`] this often while waiting for the next step (or hanging).
    pub(crate) keepalive: Option<Duration>,
}

/// The SSE comment written by `keepalive_ms=N` while the stream is otherwise silent.
pub(crate) const KEEPALIVE: &[u8] = b": keepalive\n\n";

impl Plan {
    /// All bytes of the plan concatenated.
    pub(crate) fn concat(&self) -> Bytes {
        let mut out = BytesMut::new();
        for step in &self.steps {
            out.extend_from_slice(&step.bytes);
        }
        out.freeze()
    }

    /// Cuts `bytes` at `offsets` into frames separated by [`SPLIT_PAUSE`].
    pub(crate) fn split(bytes: &Bytes, offsets: &[usize]) -> Plan {
        let mut steps = Vec::with_capacity(offsets.len() + 1);
        let mut start = 0;
        for &end in offsets.iter().chain(std::iter::once(&bytes.len())) {
            if end <= start || end > bytes.len() {
                continue;
            }
            let delay = if steps.is_empty() {
                Duration::ZERO
            } else {
                SPLIT_PAUSE
            };
            steps.push(Step {
                delay,
                bytes: bytes.slice(start..end),
            });
            start = end;
        }
        Plan {
            steps,
            hang: false,
            keepalive: None,
        }
    }
}

/// Turns a script into a timed plan according to the behaviour.
///
/// * `hang=1`: only the prelude, then the stream stays open forever (split is ignored).
/// * `ttft_ms` delays the first body item, `chunk_delay_ms` every later content item.
/// * `error_after=N`: after N content items the error event replaces the rest.
/// * `garbage=1`: garbage bytes right after the first content item.
/// * `split` / `split_every`: the whole body is serialised and re-cut at byte offsets;
///   `ttft_ms` and `chunk_delay_ms` are ignored then.
pub(crate) fn plan(script: Script, b: &Behaviour, fmt: SseFormat) -> Plan {
    let mut steps: Vec<Step> = script
        .prelude
        .into_iter()
        .map(|bytes| Step {
            delay: Duration::ZERO,
            bytes,
        })
        .collect();
    let keepalive = b.keepalive_ms.map(Duration::from_millis);
    if b.hang {
        return Plan {
            steps,
            hang: true,
            keepalive,
        };
    }
    let mut contents = 0usize;
    let mut first_body = true;
    let mut errored = false;
    for item in script.body {
        let mut delay = if first_body {
            Duration::from_millis(b.ttft_ms)
        } else {
            Duration::ZERO
        };
        first_body = false;
        match item {
            Item::Frame(bytes) => steps.push(Step { delay, bytes }),
            Item::Content(bytes) => {
                if contents > 0 {
                    delay += Duration::from_millis(b.chunk_delay_ms);
                }
                if b.error_after == Some(contents) {
                    steps.push(Step {
                        delay,
                        bytes: script.error.clone(),
                    });
                    errored = true;
                    break;
                }
                steps.push(Step { delay, bytes });
                contents += 1;
                if b.garbage && contents == 1 {
                    steps.push(Step {
                        delay: Duration::ZERO,
                        bytes: fmt.garbage(),
                    });
                }
            }
        }
    }
    if !errored {
        if b.error_after.is_some() {
            steps.push(Step {
                delay: Duration::ZERO,
                bytes: script.error,
            });
        } else {
            steps.extend(script.trailer.into_iter().map(|bytes| Step {
                delay: Duration::ZERO,
                bytes,
            }));
        }
    }
    let plan = Plan {
        steps,
        hang: b.hold,
        keepalive,
    };
    let all = plan.concat();
    match b.split_offsets(all.len()) {
        Some(offsets) => Plan::split(&all, &offsets),
        None => plan,
    }
}

struct BodyState {
    /// Records an early close (client went away) when dropped before the end.
    _watch: CloseWatch,
    steps: VecDeque<Step>,
    hang: bool,
    keepalive: Option<Duration>,
    /// When the front step is due (set when its wait starts).
    due: Option<tokio::time::Instant>,
    shutdown: CancellationToken,
    finished: bool,
}

fn shutdown_error() -> std::io::Error {
    std::io::Error::other("mock upstream shut down")
}

/// A streaming body that writes each step as its own frame.
///
/// When `shutdown` fires, the body fails so the client sees an aborted response.
pub(crate) fn body(plan: Plan, shutdown: CancellationToken, mock: super::MockState) -> Body {
    let state = BodyState {
        _watch: CloseWatch {
            mock,
            finished: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        },
        steps: plan.steps.into(),
        hang: plan.hang,
        keepalive: plan.keepalive,
        due: None,
        shutdown,
        finished: false,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.finished {
            return None;
        }
        let now = tokio::time::Instant::now();
        let due = match st.steps.front() {
            Some(step) => Some(*st.due.get_or_insert(now + step.delay)),
            None if st.hang => None,
            None => {
                st._watch
                    .finished
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                return None;
            }
        };
        if due.is_some_and(|due| due <= now) {
            st.due = None;
            let step = st.steps.pop_front()?;
            return Some((Ok(step.bytes), st));
        }
        // Silent until `due` (forever when hanging): a keep-alive comment first if one fits.
        let wake = match (st.keepalive, due) {
            (Some(every), Some(due)) if now + every < due => Some((now + every, true)),
            (Some(every), None) => Some((now + every, true)),
            (_, Some(due)) => Some((due, false)),
            (None, None) => None,
        };
        let keepalive = match wake {
            Some((at, keepalive)) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => keepalive,
                    () = st.shutdown.cancelled() => {
                        st.finished = true;
                        return Some((Err(shutdown_error()), st));
                    }
                }
            }
            None => {
                st.shutdown.cancelled().await;
                st.finished = true;
                return Some((Err(shutdown_error()), st));
            }
        };
        if keepalive {
            return Some((Ok(Bytes::from_static(KEEPALIVE)), st));
        }
        st.due = None;
        let step = st.steps.pop_front()?;
        Some((Ok::<Bytes, std::io::Error>(step.bytes), st))
    });
    Body::from_stream(stream)
}

/// Notes in the mock's state when a streamed body is dropped before its end (the client closed
/// the connection), so tests can check that cancellation reached the upstream.
struct CloseWatch {
    mock: super::MockState,
    finished: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for CloseWatch {
    fn drop(&mut self) {
        if !self.finished.load(std::sync::atomic::Ordering::SeqCst) {
            self.mock.record_early_close();
        }
    }
}

/// A body that fails immediately (used to abort hanging non-stream responses on shutdown).
pub(crate) fn aborted_body() -> Body {
    Body::from_stream(futures::stream::once(async {
        Err::<Bytes, std::io::Error>(shutdown_error())
    }))
}
