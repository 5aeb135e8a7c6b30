//! Front-door-neutral routing: admission checks, dispatch to the model's targets in order with
//! fallback, and the committed frame feed the front doors encode (OpenAI or Anthropic wire format).
//!
//! Fallback rule: a streaming request moves to the next target only before its first content
//! frame; the HTTP headers are held until then. After content went out, a failure becomes an
//! in-stream error event — never a silent end, never a second answer. A non-streaming request can
//! fall back at any point before its answer is complete, since the client has seen nothing.

use crate::AppState;
use crate::charge::Charge;
use crate::dispatch::Attempt;
use crate::error::ApiError;
use axum::http::HeaderValue;
use axum::response::Response;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::request::{Message, SamplingParams, TargetRef, Tool};
use switchyard_schemas::{
    ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage, now_ms,
};
use uuid::Uuid;

/// Room left in a NATS message for the normalised request's own fields, bytes.
const ENVELOPE_BYTES: usize = 4096;

/// 413 when a body could not fit in one NATS message (the server's `max_payload`).
pub fn check_size(app: &AppState, body_len: usize) -> Result<(), ApiError> {
    let max = app.nats.server_info().max_payload;
    if body_len + ENVELOPE_BYTES <= max {
        return Ok(());
    }
    Err(ApiError {
        status: axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        message: format!(
            "Request body of {body_len} bytes exceeds this gateway's limit of {} bytes.",
            max.saturating_sub(ENVELOPE_BYTES)
        ),
        kind: "invalid_request_error",
        param: None,
        code: Some("request_too_large"),
        retry_after_s: None,
    })
}

/// What a front door parsed, before routing.
#[derive(Debug)]
pub struct Inbound {
    /// Standard model id or route tag.
    pub model: String,
    /// Conversation.
    pub messages: Vec<Message>,
    /// Tools.
    pub tools: Vec<Tool>,
    /// OpenAI-shaped `tool_choice`.
    pub tool_choice: Option<serde_json::Value>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// SSE requested.
    pub stream: bool,
    /// Final usage chunk requested (OpenAI front door).
    pub include_usage: bool,
}

/// Headers naming who served, added to every routed response.
#[derive(Debug, Clone)]
pub struct Served {
    /// Request id.
    pub request_id: Uuid,
    /// Target that served.
    pub target: String,
    /// Worker process that served.
    pub worker: String,
    /// Failed attempts before it.
    pub fallbacks: u32,
}

impl Served {
    /// Adds `x-request-id`, `x-switchyard-target`, `x-switchyard-worker`, `x-switchyard-fallbacks`.
    pub fn apply(&self, resp: &mut Response) {
        let h = resp.headers_mut();
        let mut put = |k: &'static str, v: &str| {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.insert(k, v);
            }
        };
        put("x-request-id", &self.request_id.to_string());
        put("x-switchyard-target", &self.target);
        put("x-switchyard-worker", &self.worker);
        put("x-switchyard-fallbacks", &self.fallbacks.to_string());
    }
}

/// Routes `inbound`: resolves the model, tries its targets in order, and returns the committed
/// feed. Errors are already recorded in the charge event.
pub async fn route(app: &Arc<AppState>, inbound: Inbound) -> Result<FrameFeed, ApiError> {
    let model = app
        .config
        .model(&inbound.model)
        .ok_or_else(|| ApiError::model_not_found(&inbound.model))?;
    let admitted = Instant::now();
    let id = Uuid::now_v7();
    let t = &app.config.timeouts;
    let mut req = ChatRequest {
        id,
        tenant: None,
        key_id: None,
        model: inbound.model,
        target: TargetRef {
            id: String::new(),
            provider: String::new(),
            upstream_model: String::new(),
        },
        messages: inbound.messages,
        tools: inbound.tools,
        tool_choice: inbound.tool_choice,
        params: inbound.params,
        stream: inbound.stream,
        include_usage: inbound.include_usage,
        deadline_ms: now_ms() + t.total_ms,
        attempt: 0,
    };
    let mut charge = Charge::new(app.clone(), &req, admitted);
    let first_frame = Duration::from_millis(t.first_frame_ms);
    let silence = Duration::from_millis(t.worker_silence_ms);
    let mut last_err: Option<ErrorInfo> = None;
    let mut tried = 0u32;
    for target_id in &model.targets {
        let Some(target) = app.config.target(target_id).filter(|t| t.enabled) else {
            continue;
        };
        req.target = TargetRef {
            id: target.id.clone(),
            provider: target.provider.as_str().to_owned(),
            upstream_model: target.upstream_model.clone(),
        };
        req.attempt = tried;
        charge.attempt(&target.id, &target.upstream_model, tried);
        tried += 1;
        let mut attempt = match app.dispatcher.send(&req).await {
            Ok(a) => a,
            Err(e) => {
                last_err = Some(e);
                continue;
            }
        };
        // Read until the first content (stream) or the end (non-stream).
        let mut buffered = VecDeque::new();
        let mut limit = first_frame;
        let failed = loop {
            let frame = attempt.next(limit).await;
            limit = silence;
            match frame {
                FrameBody::Start { .. } => {}
                FrameBody::Error { error, .. } => break Some(error),
                f => {
                    let commit = if req.stream {
                        f.is_content() || f.is_terminal()
                    } else {
                        f.is_terminal()
                    };
                    buffered.push_back(f);
                    if commit {
                        break None;
                    }
                }
            }
        };
        if let Some(error) = failed {
            if error.retryable {
                tracing::info!(request = %id, target = %target.id, error = %error, "attempt failed, trying next target");
                last_err = Some(error);
                continue;
            }
            charge.finish(Some(error.class));
            return Err(error.into());
        }
        let served = Served {
            request_id: id,
            target: target.id.clone(),
            worker: attempt.worker().unwrap_or("").to_owned(),
            fallbacks: tried - 1,
        };
        return Ok(FrameFeed {
            attempt,
            buffered,
            charge: Some(charge),
            silence,
            served,
            done: false,
        });
    }
    let error = last_err.unwrap_or_else(|| {
        ErrorInfo::new(ErrorClass::NoCapacity, "no enabled target for this model")
    });
    charge.finish(Some(error.class));
    Err(error.into())
}

/// The frames of the committed attempt, in order, ending with `End` or `Error`. Keeps the charge
/// event up to date as frames pass; dropping the feed early (client gone) cancels the upstream call
/// and records the request as cancelled.
pub struct FrameFeed {
    attempt: Attempt,
    buffered: VecDeque<FrameBody>,
    charge: Option<Charge>,
    silence: Duration,
    /// Who served.
    pub served: Served,
    done: bool,
}

impl FrameFeed {
    /// The next frame (`Start` and heartbeats are skipped); `None` after the terminal frame.
    pub async fn next(&mut self) -> Option<FrameBody> {
        loop {
            if self.done {
                return None;
            }
            let frame = match self.buffered.pop_front() {
                Some(f) => f,
                None => self.attempt.next(self.silence).await,
            };
            if let Some(c) = self.charge.as_mut() {
                match &frame {
                    FrameBody::Text { text } => c.content(text.len()),
                    FrameBody::ToolCall { arguments, .. } => c.content(arguments.len()),
                    FrameBody::Usage { usage } => c.usage(*usage),
                    _ => {}
                }
            }
            match &frame {
                FrameBody::Start { .. } | FrameBody::Heartbeat => continue,
                FrameBody::End { .. } => {
                    self.done = true;
                    if let Some(c) = self.charge.take() {
                        c.finish(None);
                    }
                }
                FrameBody::Error { error, .. } => {
                    self.done = true;
                    if let Some(c) = self.charge.take() {
                        c.finish(Some(error.class));
                    }
                }
                _ => {}
            }
            return Some(frame);
        }
    }

    /// Reads the whole answer (non-streaming clients).
    pub async fn collect(mut self) -> Result<Aggregate, ErrorInfo> {
        let mut agg = Aggregate::default();
        while let Some(f) = self.next().await {
            match f {
                FrameBody::Text { text } => agg.text.push_str(&text),
                FrameBody::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    let i = index as usize;
                    if agg.tool_calls.len() <= i {
                        agg.tool_calls.resize(i + 1, ToolCallAcc::default());
                    }
                    let call = &mut agg.tool_calls[i];
                    if let Some(id) = id {
                        call.id = id;
                    }
                    if let Some(name) = name {
                        call.name = name;
                    }
                    call.arguments.push_str(&arguments);
                }
                FrameBody::Usage { usage } => agg.usage = Some(usage),
                FrameBody::End { finish_reason } => agg.finish = finish_reason,
                FrameBody::Error { error, .. } => return Err(error),
                FrameBody::Start { .. } | FrameBody::Heartbeat => {}
            }
        }
        Ok(agg)
    }
}

/// A tool call accumulated from deltas.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ToolCallAcc {
    /// Call id.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Concatenated JSON argument pieces.
    pub arguments: String,
}

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
}
