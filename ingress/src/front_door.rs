//! One pipeline for every chat front door, read top to bottom in [`serve`]:
//!
//! parse (the door's wire format → [`Inbound`]) → cache lookup (a hit is replayed as frames
//! through the same encoder) → [`route::route`] (admit: auth, budget reservation; plan: candidate
//! order; attempts: dispatch with fallback before the first content) → relay (frames → the door's
//! SSE encoder, or aggregated into one JSON answer) → settle (the charge event and budget
//! settlement in [`crate::charge`], the cache store in [`cache_client::Capture`]).
//!
//! A protocol is one [`FrontDoor`] implementation: its parser, its stream encoder, its
//! aggregate shape and its error shape. The OpenAI Chat Completions door is [`crate::chat`], the
//! Anthropic Messages door [`crate::anthropic`], the OpenAI Responses door [`crate::responses`]
//! (which parses itself, since `previous_response_id` needs a store read, and enters at
//! [`serve_inbound`]).

use crate::AppState;
use crate::cache_client::{self, Capture};
use crate::context::RequestContext;
use crate::error::ApiError;
use crate::route::{self, Aggregate, FrameFeed, Inbound};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::collections::VecDeque;
use std::sync::Arc;
use switchyard_schemas::FrameBody;
use uuid::Uuid;

/// What every reply of one request needs to know about it.
#[derive(Debug, Clone)]
pub struct ReplyMeta {
    /// The request id (response ids derive from it).
    pub request_id: Uuid,
    /// The `model` the client sent, echoed back.
    pub model: String,
    /// The client asked for a final usage chunk (OpenAI `stream_options.include_usage`).
    pub include_usage: bool,
    /// The target that served (`None` for a cache hit).
    pub target: Option<String>,
}

/// Turns frames into one protocol's SSE bytes.
pub trait StreamEncode: Send + 'static {
    /// Events sent before the first frame (e.g. OpenAI's role chunk, Anthropic's
    /// `message_start`).
    fn start(&mut self, out: &mut VecDeque<Bytes>);
    /// The events of one frame (nothing for frames the protocol does not show).
    fn frame(&mut self, frame: FrameBody, out: &mut VecDeque<Bytes>);
    /// Work awaited after the terminal frame's events were made and before they are sent (the
    /// Responses door stores the response here, so a follow-up sees it once the client has the
    /// final event). Default: nothing.
    fn finish(&mut self) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

/// One wire protocol of the gateway.
pub trait FrontDoor: Send + Sync + 'static {
    /// The SSE encoder of one streamed response.
    type Stream: StreamEncode;
    /// The body as the normalised request, or a 400 in this protocol's shape naming the field.
    fn parse(&self, body: &[u8]) -> Result<Inbound, ApiError>;
    /// The encoder of a streamed answer.
    fn stream(&self, meta: &ReplyMeta) -> Self::Stream;
    /// The JSON body of a complete (non-streamed) answer.
    fn aggregate(&self, meta: &ReplyMeta, agg: &Aggregate) -> Result<serde_json::Value, ApiError>;
    /// An error response in this protocol's shape.
    fn error(&self, e: ApiError) -> Response;
    /// Headers this protocol adds to every answer (beyond `x-request-id` and `x-switchyard-*`).
    fn headers(&self, _meta: &ReplyMeta, _resp: &mut Response) {}
    /// Work awaited after a complete answer's body was made and before it is returned (see
    /// [`StreamEncode::finish`]). Default: nothing.
    fn finish(
        &self,
        _meta: &ReplyMeta,
        _body: &serde_json::Value,
    ) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

/// Serves one request through `door`.
pub async fn serve<D: FrontDoor>(
    door: D,
    app: Arc<AppState>,
    ctx: &RequestContext,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    ctx.clock.body_read();
    let parsed = route::check_size(&app, body.len()).and_then(|()| door.parse(body));
    match parsed {
        Ok(inbound) => serve_inbound(door, app, ctx, headers, inbound).await,
        Err(e) => {
            let mut resp = door.error(e);
            response_head(&app, ctx, None, &mut resp);
            resp
        }
    }
}

/// Ends the request's overhead clock at its response head ([`crate::metrics::response_head`])
/// and notes the `model` it named for a refusal's audit record.
pub fn response_head(
    app: &AppState,
    ctx: &RequestContext,
    model: Option<&str>,
    resp: &mut Response,
) {
    if let Some(m) = model {
        ctx.note_model(m);
    }
    crate::metrics::response_head(app, &ctx.clock, model, resp);
}

/// Serves one request `door` has already parsed (and size-checked with [`route::check_size`]).
///
/// Every door's request passes [`switchyard_schemas::input::check_conversation`] here (tools,
/// tool results, images), whatever its parser already checked: a bad one is a 400 in the door's
/// shape before any cache lookup, admission or upstream call.
pub async fn serve_inbound<D: FrontDoor>(
    door: D,
    app: Arc<AppState>,
    ctx: &RequestContext,
    headers: &HeaderMap,
    inbound: Inbound,
) -> Response {
    let model = inbound.model.clone();
    if let Err(e) = switchyard_schemas::input::check_conversation(&inbound.messages, &inbound.tools)
    {
        let mut resp = door.error(e.into());
        response_head(&app, ctx, Some(&model), &mut resp);
        return resp;
    }
    let out = Box::pin(pipeline(&door, app.clone(), ctx, headers, inbound)).await;
    let mut resp = match out {
        Ok(r) => r,
        Err(e) => door.error(e),
    };
    if let Some(r) = ctx.rates() {
        r.apply(&mut resp);
    }
    response_head(&app, ctx, Some(&model), &mut resp);
    resp
}

async fn pipeline<D: FrontDoor>(
    door: &D,
    app: Arc<AppState>,
    ctx: &RequestContext,
    headers: &HeaderMap,
    inbound: Inbound,
) -> Result<Response, ApiError> {
    let (stream, model, include_usage) =
        (inbound.stream, inbound.model.clone(), inbound.include_usage);

    // Cache: a hit is replayed through the same encoder as a live answer.
    let cache = cache_client::check(&app, ctx, headers, &inbound).await;
    app.metrics.cache(cache.outcome.as_str());
    if cache.is_hit() {
        // A cached answer is still a request of the key: it takes one RPM (and no tokens, it
        // is free) and carries the key's `x-ratelimit-*` headers like any answer.
        let config = app.config.get();
        let until_ms = switchyard_schemas::now_ms() + config.timeouts.total_ms;
        if let Some(h) =
            crate::rate_limit::admit(&app, ctx, &config, None, Some(0), 1, until_ms, false).await?
        {
            h.settle(0, false).await;
        }
    }
    if let Some((request_id, answer)) = cache.hit(&app, ctx) {
        let meta = ReplyMeta {
            request_id,
            model,
            include_usage,
            target: None,
        };
        let mut resp = if stream {
            let mut encoder = door.stream(&meta);
            let mut out = VecDeque::new();
            encoder.start(&mut out);
            for f in cache_client::replay_frames(answer) {
                encoder.frame(f, &mut out);
            }
            if let Some(work) = encoder.finish() {
                work.await;
            }
            sse_response(Body::from_stream(futures::stream::iter(
                out.into_iter().map(Ok::<Bytes, std::convert::Infallible>),
            )))
        } else {
            match door.aggregate(&meta, &cache_client::aggregate(answer)) {
                Ok(v) => {
                    if let Some(work) = door.finish(&meta, &v) {
                        work.await;
                    }
                    axum::Json(v).into_response()
                }
                Err(e) => door.error(e),
            }
        };
        if let Ok(v) = HeaderValue::from_str(&request_id.to_string()) {
            resp.headers_mut().insert("x-request-id", v);
        }
        door.headers(&meta, &mut resp);
        cache.apply_headers(&mut resp);
        return Ok(resp);
    }

    // Admit, plan, attempts.
    let feed = route::route(&app, ctx, inbound, cache.audit_outcome()).await?;
    let served = feed.served.clone();
    let meta = ReplyMeta {
        request_id: served.request_id,
        model,
        include_usage,
        target: Some(served.target.clone()),
    };

    // Relay, then settle (the feed publishes the charge as it ends; the capture stores).
    let capture = cache.capture(&app, &served);
    let mut resp = if stream {
        relay(door.stream(&meta), feed, capture)
    } else {
        match feed.collect().await {
            Ok(agg) => match door.aggregate(&meta, &agg) {
                Ok(v) => {
                    if let Some(c) = capture {
                        c.aggregate(&agg);
                    }
                    if let Some(work) = door.finish(&meta, &v) {
                        work.await;
                    }
                    axum::Json(v).into_response()
                }
                Err(e) => door.error(e),
            },
            Err(e) => door.error(e.into()),
        }
    };
    served.apply(&mut resp);
    door.headers(&meta, &mut resp);
    cache.apply_headers(&mut resp);
    Ok(resp)
}

/// The SSE body of a live answer: frames are pulled from the feed only when the client's
/// connection takes more bytes, so a slow reader slows only its own upstream call.
fn relay<E: StreamEncode>(encoder: E, feed: FrameFeed, capture: Option<Capture>) -> Response {
    struct Relay<E> {
        encoder: E,
        feed: FrameFeed,
        out: VecDeque<Bytes>,
        capture: Option<Capture>,
    }
    let mut out = VecDeque::new();
    let mut encoder = encoder;
    encoder.start(&mut out);
    let state = Relay {
        encoder,
        feed,
        out,
        capture,
    };
    let body = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.out.pop_front() {
                return Some((Ok::<Bytes, std::convert::Infallible>(b), s));
            }
            let frame = s.feed.next().await?;
            if let Some(c) = s.capture.as_mut() {
                c.frame(&frame);
            }
            let terminal = frame.is_terminal();
            s.encoder.frame(frame, &mut s.out);
            if terminal && let Some(work) = s.encoder.finish() {
                work.await;
            }
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
