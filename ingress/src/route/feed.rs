//! The feed stage: the committed attempt's frames, in order, as the front doors read them; it
//! settles the request (charge, metrics, health) when the terminal frame passes.

use super::Served;
use super::admit::Ledger;
use super::attempt::{Opened, judge};
use super::timeouts::RequestTimeouts;
use crate::AppState;
use crate::charge::Charge;
use crate::dispatch::Attempt;
use crate::error::ApiError;
use crate::metrics::Outcome;
use crate::target_health::InFlight;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;
use switchyard_schemas::cache::CachedToolCall;
use switchyard_schemas::{ErrorInfo, FinishReason, FrameBody, Usage};

/// The frames of the committed attempt, in order, ending with `End` or `Error`. Keeps the charge
/// event and the metrics up to date as frames pass; dropping the feed early (client gone) cancels
/// the upstream call and records the request as cancelled.
pub struct FrameFeed {
    app: Arc<AppState>,
    attempt: Attempt,
    buffered: VecDeque<FrameBody>,
    charge: Option<Charge>,
    outcome: Outcome,
    in_flight: Option<InFlight>,
    timeouts: RequestTimeouts,
    deadline: Instant,
    dispatched: Instant,
    last_content: Option<Instant>,
    /// Who served.
    pub served: Served,
    done: bool,
}

impl FrameFeed {
    /// The feed of the committed attempt `opened`, served as `served`; it takes over the
    /// request's `ledger` and the attempt's `in_flight` count.
    pub(super) fn new(
        app: Arc<AppState>,
        ledger: Ledger,
        served: Served,
        opened: Opened,
        in_flight: InFlight,
        timeouts: RequestTimeouts,
        deadline: Instant,
    ) -> Self {
        let Ledger { charge, outcome } = ledger;
        if let Some(at) = opened.first_content {
            outcome.first_content(at);
        }
        Self {
            app,
            attempt: opened.attempt,
            buffered: opened.buffered,
            charge: Some(charge),
            outcome,
            in_flight: Some(in_flight),
            timeouts,
            deadline,
            dispatched: opened.dispatched,
            last_content: opened.last_content,
            served,
            done: false,
        }
    }

    /// The next frame (`Start` and heartbeats are skipped); `None` after the terminal frame.
    pub async fn next(&mut self) -> Option<FrameBody> {
        loop {
            if self.done {
                return None;
            }
            let frame = match self.buffered.pop_front() {
                Some(f) => f,
                None => {
                    let t = self.timeouts;
                    let (until, why) = t.wait(self.deadline, self.dispatched, self.last_content);
                    let next = self.attempt.next(t.silence);
                    match tokio::time::timeout_at(until.into(), next).await {
                        Ok(f) => f,
                        Err(_) => FrameBody::Error {
                            error: t.error(why, &self.served.target),
                            content_sent: self.last_content.is_some(),
                        },
                    }
                }
            };
            if frame.is_content() {
                let now = Instant::now();
                if let Some(prev) = self.last_content {
                    self.outcome.chunk_gap(now.saturating_duration_since(prev));
                }
                self.last_content = Some(now);
            }
            if let Some(c) = self.charge.as_mut() {
                match &frame {
                    FrameBody::Text { text } => {
                        c.content(text.len());
                        c.capture_response(text);
                    }
                    FrameBody::ToolCall { arguments, .. } => c.content(arguments.len()),
                    FrameBody::Usage { usage } => c.usage(*usage),
                    _ => {}
                }
            }
            match &frame {
                FrameBody::Start { .. }
                | FrameBody::Heartbeat
                | FrameBody::UpstreamHeaders { .. } => continue,
                FrameBody::End { finish_reason } => {
                    self.done = true;
                    if let Some(mut c) = self.charge.take() {
                        c.finish_reason(*finish_reason);
                        c.finish(None);
                    }
                    self.outcome.finish(200);
                    self.in_flight = None;
                }
                FrameBody::Error { error, .. } => {
                    self.done = true;
                    let status = ApiError::from(error.clone()).status.as_u16();
                    if let Some(mut c) = self.charge.take() {
                        c.attempt_failed(error);
                        c.http_status(status);
                        c.finish(Some(error.class));
                    }
                    // No fallback after the commit, but the same judgement of the target.
                    judge(&self.app, &self.served.target, error);
                    self.outcome.finish(status);
                    self.in_flight = None;
                }
                _ => {}
            }
            return Some(frame);
        }
    }

    /// Reads the whole answer (non-streaming clients): choice 0 in the aggregate itself, the
    /// others (`n > 1`) in [`Aggregate::more_choices`], each by its [`FrameBody::Choice`].
    pub async fn collect(mut self) -> Result<Aggregate, ErrorInfo> {
        let mut agg = Aggregate::default();
        let mut current = 0;
        while let Some(f) = self.next().await {
            match f {
                FrameBody::Choice { index } => current = index,
                FrameBody::ChoiceEnd {
                    index,
                    finish_reason,
                } => agg.choice(index).finish = finish_reason,
                FrameBody::Usage { usage } => agg.usage = Some(usage),
                FrameBody::End { finish_reason } => agg.finish = finish_reason,
                FrameBody::Error { error, .. } => return Err(error),
                other => agg.choice(current).add(other),
            }
        }
        Ok(agg)
    }
}

/// A tool call accumulated from deltas ([`CachedToolCall::accumulate`]): id, name and the
/// concatenated JSON argument pieces; the same type the cache stores.
pub type ToolCallAcc = CachedToolCall;

/// A complete answer.
#[derive(Debug, Default, Clone)]
pub struct Aggregate {
    /// All text.
    pub text: String,
    /// Tool calls by index.
    pub tool_calls: Vec<ToolCallAcc>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// Upstream-reported usage.
    pub usage: Option<Usage>,
    /// Reasoning blocks, in order (Anthropic thinking; see [`FrameBody::accumulate_thinking`]).
    pub thinking: Vec<switchyard_schemas::request::ThinkingBlock>,
    /// OpenAI `logprobs.content` entries, in token order (when the upstream sent them).
    pub logprobs: Vec<serde_json::Value>,
    /// Choices 1.. of an answer with several (`n > 1`), in index order, each with its own
    /// text, tool calls, finish reason, thinking and logprobs; `usage` (all choices) is only on
    /// the aggregate itself.
    pub more_choices: Vec<Aggregate>,
}

impl Aggregate {
    /// Choice `index`: the aggregate itself for 0, else an entry of `more_choices` (added as
    /// needed).
    pub fn choice(&mut self, index: u32) -> &mut Aggregate {
        let Some(i) = (index as usize).checked_sub(1) else {
            return self;
        };
        if self.more_choices.len() <= i {
            self.more_choices.resize_with(i + 1, Aggregate::default);
        }
        &mut self.more_choices[i]
    }

    /// Adds one content frame (text, tool-call piece, reasoning, logprobs) of this choice.
    pub fn add(&mut self, f: FrameBody) {
        match f {
            FrameBody::Text { text } => self.text.push_str(&text),
            f @ FrameBody::ToolCall { .. } => {
                f.accumulate_tool_call(&mut self.tool_calls);
            }
            FrameBody::Logprobs { content } => self.logprobs.extend(content),
            other => {
                other.accumulate_thinking(&mut self.thinking);
            }
        }
    }
}
