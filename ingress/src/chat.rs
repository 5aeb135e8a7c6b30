//! `POST /v1/chat/completions`: validate, route, dispatch with fallback, answer as SSE or JSON.
//!
//! Fallback rule: a streaming request moves to the next target only before its first content
//! frame; the HTTP headers are held until then. After content went out, a failure becomes an
//! in-stream error event — never a silent end, never a second answer. A non-streaming request can
//! fall back at any point before its answer is complete, since the client has seen nothing.

use crate::AppState;
use crate::charge::Charge;
use crate::error::ApiError;
use crate::openai::request::{self, ParsedChat};
use crate::openai::response::{self, DONE, ResponseMeta, ToolCallAcc};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::request::TargetRef;
use switchyard_schemas::{
    ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage, now_ms,
};
use uuid::Uuid;

/// The handler.
pub async fn chat_completions(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    match handle(app, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Headers naming who served, added to every routed response.
struct Served {
    request_id: Uuid,
    target: String,
    worker: String,
    fallbacks: u32,
}

impl Served {
    fn apply(&self, resp: &mut Response) {
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

/// Room left in a NATS message for the normalised request's own fields, bytes.
const ENVELOPE_BYTES: usize = 4096;

async fn handle(app: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    // The normalised request must fit in one NATS message (the server's max_payload).
    let max = app.nats.server_info().max_payload;
    if body.len() + ENVELOPE_BYTES > max {
        return Err(ApiError {
            status: axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            message: format!(
                "Request body of {} bytes exceeds this gateway's limit of {} bytes.",
                body.len(),
                max.saturating_sub(ENVELOPE_BYTES)
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
            retry_after_s: None,
        });
    }
    let parsed: ParsedChat = request::parse(body)?;
    let model = app
        .config
        .model(&parsed.model)
        .ok_or_else(|| ApiError::model_not_found(&parsed.model))?;
    let admitted = Instant::now();
    let id = Uuid::now_v7();
    let t = &app.config.timeouts;
    let mut req = ChatRequest {
        id,
        tenant: None,
        key_id: None,
        model: parsed.model.clone(),
        target: TargetRef {
            id: String::new(),
            provider: String::new(),
            upstream_model: String::new(),
        },
        messages: parsed.messages,
        tools: parsed.tools,
        tool_choice: parsed.tool_choice,
        params: parsed.params,
        stream: parsed.stream,
        include_usage: parsed.include_usage,
        deadline_ms: now_ms() + t.total_ms,
        attempt: 0,
    };
    let meta = ResponseMeta {
        id: format!("chatcmpl-{}", id.simple()),
        created: now_ms() / 1000,
        model: parsed.model,
        include_usage: parsed.include_usage,
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
        // Read until the first content (stream) or the end (non-stream); fall back on a
        // retryable failure before that point.
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
        let mut resp = if req.stream {
            stream_response(meta, attempt, buffered, charge, silence)
        } else {
            json_response(&meta, buffered, charge)
        };
        served.apply(&mut resp);
        return Ok(resp);
    }
    let error = last_err.unwrap_or_else(|| {
        ErrorInfo::new(ErrorClass::NoCapacity, "no enabled target for this model")
    });
    charge.finish(Some(error.class));
    Err(error.into())
}

fn json_response(meta: &ResponseMeta, frames: VecDeque<FrameBody>, mut charge: Charge) -> Response {
    let mut text = String::new();
    let mut calls: Vec<ToolCallAcc> = Vec::new();
    let mut finish = FinishReason::Stop;
    let mut usage: Option<Usage> = None;
    for f in frames {
        match f {
            FrameBody::Text { text: t } => text.push_str(&t),
            FrameBody::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                let i = index as usize;
                if calls.len() <= i {
                    calls.resize(i + 1, ToolCallAcc::default());
                }
                if let Some(id) = id {
                    calls[i].id = id;
                }
                if let Some(name) = name {
                    calls[i].name = name;
                }
                calls[i].arguments.push_str(&arguments);
            }
            FrameBody::Usage { usage: u } => usage = Some(u),
            FrameBody::End { finish_reason } => finish = finish_reason,
            _ => {}
        }
    }
    charge.output_bytes = text.len();
    charge.first_content();
    if let Some(u) = usage {
        charge.usage(u);
    }
    charge.finish(None);
    axum::Json(response::completion(meta, &text, &calls, finish, usage)).into_response()
}

/// State of an SSE response body.
struct SseState {
    meta: ResponseMeta,
    attempt: crate::dispatch::Attempt,
    frames: VecDeque<FrameBody>,
    out: VecDeque<Bytes>,
    charge: Option<Charge>,
    usage: Option<Usage>,
    silence: Duration,
    done: bool,
}

impl SseState {
    /// Converts one frame into SSE bytes; returns false once the stream is over.
    fn emit(&mut self, frame: FrameBody) -> bool {
        match frame {
            FrameBody::Text { text } => {
                if let Some(c) = self.charge.as_mut() {
                    c.output_bytes += text.len();
                    c.first_content();
                }
                self.out.push_back(self.meta.text_chunk(&text));
            }
            FrameBody::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                if let Some(c) = self.charge.as_mut() {
                    c.output_bytes += arguments.len();
                    c.first_content();
                }
                self.out.push_back(self.meta.tool_chunk(
                    index,
                    id.as_deref(),
                    name.as_deref(),
                    &arguments,
                ));
            }
            FrameBody::Usage { usage } => {
                self.usage = Some(usage);
                if let Some(c) = self.charge.as_mut() {
                    c.usage(usage);
                }
            }
            FrameBody::End { finish_reason } => {
                self.out.push_back(self.meta.finish_chunk(finish_reason));
                if self.meta.include_usage {
                    self.out
                        .push_back(self.meta.usage_chunk(self.usage.unwrap_or_default()));
                }
                self.out.push_back(Bytes::from_static(DONE));
                if let Some(c) = self.charge.take() {
                    c.finish(None);
                }
                return false;
            }
            FrameBody::Error { error, .. } => {
                let class = error.class;
                self.out.push_back(response::error_event(&error.into()));
                if let Some(c) = self.charge.take() {
                    c.finish(Some(class));
                }
                return false;
            }
            FrameBody::Start { .. } | FrameBody::Heartbeat => {}
        }
        true
    }
}

fn stream_response(
    meta: ResponseMeta,
    attempt: crate::dispatch::Attempt,
    frames: VecDeque<FrameBody>,
    charge: Charge,
    silence: Duration,
) -> Response {
    let mut out = VecDeque::new();
    out.push_back(meta.role_chunk());
    let state = SseState {
        meta,
        attempt,
        frames,
        out,
        charge: Some(charge),
        usage: None,
        silence,
        done: false,
    };
    let body = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.out.pop_front() {
                return Some((Ok::<Bytes, std::convert::Infallible>(b), s));
            }
            if s.done {
                return None;
            }
            let frame = match s.frames.pop_front() {
                Some(f) => f,
                None => s.attempt.next(s.silence).await,
            };
            s.done = !s.emit(frame);
        }
    });
    let mut resp = Response::new(Body::from_stream(body));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
