//! The OpenAI front door, `POST /v1/chat/completions`: parse, route (see [`crate::route`]), and
//! answer as OpenAI SSE chunks or one aggregated `chat.completion`.

use crate::AppState;
use crate::cache_client;
use crate::error::ApiError;
use crate::openai::request;
use crate::openai::response::{self, DONE, ResponseMeta};
use crate::route::{self, FrameFeed, Inbound};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use switchyard_schemas::{FrameBody, Usage, now_ms};

/// The handler.
pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match handle(app, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn handle(
    app: Arc<AppState>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    route::check_size(&app, body.len())?;
    let p = request::parse(body)?;
    let model = p.model.clone();
    let include_usage = p.include_usage;
    let stream = p.stream;
    let inbound = Inbound {
        model: p.model,
        messages: p.messages,
        tools: p.tools,
        tool_choice: p.tool_choice,
        params: p.params,
        stream: p.stream,
        include_usage: p.include_usage,
    };
    let cache = cache_client::check(&app, headers, &inbound).await;
    if let Some(hit) = cache_client::openai_hit(&app, &cache, model.clone(), stream, include_usage)
    {
        return Ok(hit);
    }
    let feed = route::route(&app, inbound).await?;
    let mut capture = cache.capture(&app, &feed.served);
    let meta = ResponseMeta {
        id: format!("chatcmpl-{}", feed.served.request_id.simple()),
        created: now_ms() / 1000,
        model,
        include_usage,
    };
    let served = feed.served.clone();
    let mut resp = if stream {
        stream_response(meta, feed, capture)
    } else {
        let agg = feed.collect().await.map_err(ApiError::from)?;
        if let Some(c) = capture.take() {
            c.aggregate(&agg);
        }
        axum::Json(response::completion(&meta, &agg)).into_response()
    };
    served.apply(&mut resp);
    cache.apply_headers(&mut resp);
    Ok(resp)
}

/// State of an SSE response body.
struct SseState {
    meta: ResponseMeta,
    feed: FrameFeed,
    out: VecDeque<Bytes>,
    usage: Option<Usage>,
    /// Stores the answer in the cache when it completes.
    capture: Option<cache_client::Capture>,
}

impl SseState {
    /// Encodes one frame.
    fn emit(&mut self, frame: FrameBody) {
        if let Some(c) = self.capture.as_mut() {
            c.frame(&frame);
        }
        match frame {
            FrameBody::Text { text } => self.out.push_back(self.meta.text_chunk(&text)),
            FrameBody::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                let chunk = self
                    .meta
                    .tool_chunk(index, id.as_deref(), name.as_deref(), &arguments);
                self.out.push_back(chunk);
            }
            FrameBody::Usage { usage } => self.usage = Some(usage),
            FrameBody::End { finish_reason } => {
                self.out.push_back(self.meta.finish_chunk(finish_reason));
                if self.meta.include_usage {
                    self.out
                        .push_back(self.meta.usage_chunk(self.usage.unwrap_or_default()));
                }
                self.out.push_back(Bytes::from_static(DONE));
            }
            FrameBody::Error { error, .. } => {
                self.out.push_back(response::error_event(&error.into()));
            }
            FrameBody::Start { .. } | FrameBody::Heartbeat => {}
        }
    }
}

fn stream_response(
    meta: ResponseMeta,
    feed: FrameFeed,
    capture: Option<cache_client::Capture>,
) -> Response {
    let mut out = VecDeque::new();
    out.push_back(meta.role_chunk());
    let state = SseState {
        meta,
        feed,
        out,
        usage: None,
        capture,
    };
    let body = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.out.pop_front() {
                return Some((Ok::<Bytes, std::convert::Infallible>(b), s));
            }
            let frame = s.feed.next().await?;
            s.emit(frame);
        }
    });
    sse_response(Body::from_stream(body))
}

/// A response with the SSE headers every front door sends.
pub fn sse_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
