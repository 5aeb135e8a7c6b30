//! The Anthropic front door, `POST /v1/messages` (Anthropic API reference, "Messages" and
//! "Streaming Messages"): the official `anthropic` SDKs and Claude-Code-style clients reach any
//! provider. The body becomes the normalised request ([`request::parse`]), is routed exactly like
//! the OpenAI front door's ([`crate::route::route`], fallback included), and the frames are written
//! back as a `Message` object or Anthropic SSE events ([`response`]). Errors use Anthropic's shape
//! ([`ApiError::into_anthropic_response`]). Responses carry `request-id` (Anthropic's header name)
//! besides the `x-request-id` / `x-switchyard-*` headers of [`crate::route::Served`].

pub mod request;
pub mod response;

use crate::AppState;
use crate::chat::sse_response;
use crate::error::ApiError;
use crate::route::{self, FrameFeed, Served};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use response::{MessageMeta, StreamEncoder};
use std::collections::VecDeque;
use std::sync::Arc;

/// The `POST /v1/messages` handler (Anthropic API reference, "Messages").
pub async fn messages(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    match handle(app, &body).await {
        Ok(r) => r,
        Err(e) => e.into_anthropic_response(),
    }
}

async fn handle(app: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    route::check_size(&app, body.len())?;
    let inbound = request::parse(body)?;
    let meta_model = inbound.model.clone();
    let stream = inbound.stream;
    let feed = route::route(&app, inbound).await?;
    let served = feed.served.clone();
    let meta = MessageMeta {
        id: format!("msg_{}", served.request_id.simple()),
        model: meta_model,
    };
    let mut resp = if stream {
        stream_response(meta, feed)
    } else {
        let message = feed
            .collect()
            .await
            .map_err(ApiError::from)
            .and_then(|agg| response::message(&meta, &agg));
        match message {
            Ok(m) => axum::Json(m).into_response(),
            Err(e) => e.into_anthropic_response(),
        }
    };
    apply_headers(&served, &mut resp);
    Ok(resp)
}

/// The `Served` headers plus Anthropic's `request-id`.
fn apply_headers(served: &Served, resp: &mut Response) {
    served.apply(resp);
    if let Ok(v) = HeaderValue::from_str(&served.request_id.to_string()) {
        resp.headers_mut().insert("request-id", v);
    }
}

/// State of an SSE response body.
struct SseState {
    encoder: StreamEncoder,
    feed: FrameFeed,
    out: VecDeque<Bytes>,
}

fn stream_response(meta: MessageMeta, feed: FrameFeed) -> Response {
    let encoder = StreamEncoder::new(meta);
    let mut out = VecDeque::new();
    encoder.start(&mut out);
    let state = SseState { encoder, feed, out };
    let body = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.out.pop_front() {
                return Some((Ok::<Bytes, std::convert::Infallible>(b), s));
            }
            let frame = s.feed.next().await?;
            s.encoder.frame(frame, &mut s.out);
        }
    });
    sse_response(Body::from_stream(body))
}
