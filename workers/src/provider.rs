//! The one trait every upstream provider adapter implements, and helpers they share.
//!
//! An adapter translates a normalised [`ChatRequest`] into its provider's wire request, sends it with
//! the worker's shared `reqwest::Client`, and translates the provider's stream back into normalised
//! [`FrameBody`] events: `Text`, `ToolCall`, `Usage` (possibly several times, cumulative: the worker
//! keeps the last), and exactly one `End`. Failures are returned as classified [`ErrorInfo`]s.
//! The worker — not the adapter — owns timeouts, heartbeats, sequence numbers and cancellation.

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use reqwest::header::HeaderMap;
use switchyard_schemas::config::{ProviderKind, TargetConfig};
use switchyard_schemas::embed::EmbedRequest;
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, FrameBody, Usage};

/// The normalised events of one upstream call, in order.
pub type EventStream = BoxStream<'static, Result<FrameBody, ErrorInfo>>;

pub use switchyard_schemas::capabilities::Capabilities;

/// Where an upstream call goes: the worker's HTTP client, the target, and the target's resolved
/// base URL (e.g. the built-in mock's address). Every call of a [`Provider`] takes one.
#[derive(Debug, Clone, Copy)]
pub struct Upstream<'a> {
    /// The shared client.
    pub http: &'a reqwest::Client,
    /// The target called.
    pub target: &'a TargetConfig,
    /// The target's resolved base URL.
    pub base_url: &'a str,
}

impl Upstream<'_> {
    /// `{base_url}{path}`, trailing slashes of the base URL dropped (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }

    /// A [`post_json`] to `url` with this call's client.
    pub fn post_json(&self, url: &str) -> reqwest::RequestBuilder {
        post_json(self.http, url)
    }
}

/// A `POST` to `url` whose body is JSON (`content-type: application/json`).
pub fn post_json(http: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
    http.post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
}

/// The `accept` header of a call that streams (`text/event-stream`) or not (`application/json`).
pub fn accept_for(stream: bool) -> &'static str {
    if stream {
        "text/event-stream"
    } else {
        "application/json"
    }
}

/// A started upstream call: resolves to its answer or a classified error.
pub type Call<T> = BoxFuture<'static, Result<T, ErrorInfo>>;

/// One provider family (OpenAI, Anthropic, …). Implementations are stateless apart from config.
pub trait Provider: Send + Sync {
    /// Which family this adapter speaks.
    fn kind(&self) -> ProviderKind;

    /// What the provider supports: its family's entry in the one capability list
    /// ([`Capabilities::of`]), which ingress routing reads too.
    fn capabilities(&self) -> Capabilities {
        self.kind().capabilities()
    }

    /// Starts the upstream call. Resolves once the upstream answered with a success status (the
    /// stream then yields the events) or failed (a classified error, nothing sent to the client yet).
    fn stream_chat(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<EventStream>;

    /// Embeds `req.input`: one vector per input, in order, with the upstream's token usage.
    /// Providers without an embeddings API keep this default, a 400 naming `model`.
    fn embed(&self, _up: Upstream<'_>, _req: &EmbedRequest) -> Call<Embeddings> {
        let kind = self.kind().as_str();
        Box::pin(async move {
            Err(ErrorInfo::new(
                ErrorClass::InvalidRequest,
                format!("provider `{kind}` has no embeddings API in Switchyard"),
            )
            .with_param("model"))
        })
    }

    /// The upstream's exact count of `req`'s input tokens (system, messages, tools), where the
    /// API has a count endpoint ([`ProviderKind::counts_tokens`]); the default is a 400.
    fn count_tokens(&self, _up: Upstream<'_>, _req: &ChatRequest) -> Call<u64> {
        no_count_endpoint(self.kind())
    }
}

/// The default [`Provider::count_tokens`]: this provider has no count endpoint.
pub fn no_count_endpoint(kind: ProviderKind) -> BoxFuture<'static, Result<u64, ErrorInfo>> {
    Box::pin(async move {
        Err(ErrorInfo::new(
            ErrorClass::InvalidRequest,
            format!("provider `{}` has no token-count API", kind.as_str()),
        ))
    })
}

/// The result of an embeddings call.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// One vector per input, in input order.
    pub vectors: Vec<Vec<f32>>,
    /// Upstream-reported usage (`prompt_tokens`).
    pub usage: Usage,
}

pub use crate::providers::classify::{MAX_RETRY_AFTER_MS, delay_ms_from_secs, retry_after_ms};

/// Classifies a non-success upstream HTTP answer from its status and (possibly truncated) error
/// body — OpenAI, Anthropic, Google and OpenAI-compatible shapes alike; see
/// [`crate::providers::classify`], the one classifier of provider error objects.
pub fn classify_http_error(status: u16, headers: &HeaderMap, body: &[u8]) -> ErrorInfo {
    crate::providers::classify::http_error(status, headers, body, None)
}

/// Classifies a transport failure from reqwest.
pub fn classify_transport_error(e: &reqwest::Error) -> ErrorInfo {
    let class = if e.is_timeout() {
        ErrorClass::Timeout
    } else {
        ErrorClass::Network
    };
    // reqwest errors carry the URL but never headers, so they cannot leak the API key.
    ErrorInfo::new(class, format!("upstream request failed: {e}"))
}

/// Upper bound on an upstream error body we read to classify it, bytes.
pub const MAX_ERROR_BODY: usize = 64 * 1024;

tokio::task_local! {
    static REQUEST_ID: Option<String>;
}

/// Runs `fut` (one request's handling) with `id` as the request id [`send_checked`] sends
/// upstream as `X-Request-Id` (docs/tracing.md).
///
/// A plain function returning the scoped future, not an `async fn`: an `async fn` wrapper keeps
/// its argument `fut` beside the future it awaits, doubling a request's task (5 → 10 KB).
pub fn with_request_id<F: std::future::Future>(
    id: Option<String>,
    fut: F,
) -> impl std::future::Future<Output = F::Output> {
    REQUEST_ID.scope(id, fut)
}

/// Sends a prepared upstream request (with the request id as `X-Request-Id` when there is one,
/// for correlation in the provider's own logs); a non-2xx answer becomes a classified error
/// (reading at most [`MAX_ERROR_BODY`] bytes of its body), a transport failure a
/// `network`/`timeout` error.
pub async fn send_checked(req: reqwest::RequestBuilder) -> Result<reqwest::Response, ErrorInfo> {
    let id = REQUEST_ID.try_with(Clone::clone).ok().flatten();
    let req = match id {
        Some(id) => req.header(switchyard_schemas::trace::REQUEST_ID_HEADER, id),
        None => req,
    };
    let resp = req.send().await.map_err(|e| classify_transport_error(&e))?;
    check_status(resp, classify_http_error).await
}

/// `resp` when its status is 2xx; otherwise the error `classify` (e.g. [`classify_http_error`])
/// makes of its status, headers and at most [`MAX_ERROR_BODY`] bytes of its body.
pub async fn check_status(
    mut resp: reqwest::Response,
    classify: fn(u16, &HeaderMap, &[u8]) -> ErrorInfo,
) -> Result<reqwest::Response, ErrorInfo> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let headers = resp.headers().clone();
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(MAX_ERROR_BODY);
    Err(classify(status.as_u16(), &headers, &body))
}

/// Turns one provider's SSE events into normalised events. Implemented once per provider file.
pub trait SseTranslator: Send + 'static {
    /// Handles one SSE event, pushing zero or more results. Returns `true` when the stream is
    /// complete (e.g. OpenAI `[DONE]`, Anthropic `message_stop`); nothing after it is read.
    fn on_event(
        &mut self,
        event: crate::sse::SseEvent,
        out: &mut std::collections::VecDeque<Result<FrameBody, ErrorInfo>>,
    ) -> bool;

    /// The byte stream ended before `on_event` returned `true`: push a final `End` or an error.
    fn on_eof(&mut self, out: &mut std::collections::VecDeque<Result<FrameBody, ErrorInfo>>);
}

/// Streams a successful upstream response through `translator`. After the first error the stream
/// ends; SSE-level failures (transport, oversize) become `network` / `protocol` errors.
pub fn translate_sse<T: SseTranslator>(resp: reqwest::Response, translator: T) -> EventStream {
    use futures::StreamExt;
    use std::collections::VecDeque;
    let first = rate_headers(resp.headers());
    let events = Box::pin(crate::sse::sse_stream(resp.bytes_stream()));
    let state = (
        events,
        translator,
        VecDeque::<Result<FrameBody, ErrorInfo>>::new(),
        false,
    );
    let frames = futures::stream::unfold(
        state,
        |(mut events, mut tr, mut pending, mut done)| async move {
            loop {
                if let Some(item) = pending.pop_front() {
                    if item.is_err() {
                        pending.clear();
                        done = true;
                    }
                    return Some((item, (events, tr, pending, done)));
                }
                if done {
                    return None;
                }
                match events.next().await {
                    Some(Ok(ev)) => done = tr.on_event(ev, &mut pending),
                    Some(Err(crate::sse::SseError::Transport(e))) => {
                        pending.push_back(Err(ErrorInfo::new(
                            ErrorClass::Network,
                            format!("upstream stream broke: {e}"),
                        )));
                    }
                    Some(Err(e)) => {
                        pending.push_back(Err(ErrorInfo::new(ErrorClass::Protocol, e.to_string())));
                    }
                    None => {
                        tr.on_eof(&mut pending);
                        done = true;
                    }
                }
            }
        },
    );
    futures::stream::iter(first.map(Ok)).chain(frames).boxed()
}

/// The upstream's rate-limit headers ([`switchyard_schemas::frame::is_upstream_rate_header`]) as
/// the frame that goes before the answer's first content, if it sent any (at most
/// [`switchyard_schemas::frame::MAX_UPSTREAM_HEADERS`]; values that are not visible ASCII or
/// longer than 256 bytes are dropped).
pub fn rate_headers(headers: &HeaderMap) -> Option<FrameBody> {
    use switchyard_schemas::frame::{MAX_UPSTREAM_HEADERS, is_upstream_rate_header};
    let found: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| is_upstream_rate_header(name.as_str()))
        .filter_map(|(name, value)| {
            let v = value.to_str().ok().filter(|v| v.len() <= 256)?;
            Some((name.as_str().to_owned(), v.to_owned()))
        })
        .take(MAX_UPSTREAM_HEADERS)
        .collect();
    (!found.is_empty()).then_some(FrameBody::UpstreamHeaders { headers: found })
}

/// A complete (non-streamed) answer, read from a provider's JSON body. [`Answer::frames`] turns
/// it into the same normalised events a stream gives: one coalesced `Text`, one `ToolCall` per
/// call (arguments whole), one `Usage`, `End`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    /// The text parts, concatenated.
    pub text: String,
    /// Tool calls in order: (id, function name, arguments as a JSON string).
    pub tool_calls: Vec<(Option<String>, Option<String>, String)>,
    /// The usage the body reported.
    pub usage: Option<Usage>,
    /// Why generation stopped.
    pub finish_reason: switchyard_schemas::FinishReason,
    /// Reasoning blocks before the answer (Anthropic thinking), in order.
    pub thinking: Vec<switchyard_schemas::request::ThinkingBlock>,
    /// OpenAI `logprobs.content` entries of the text, when asked for.
    pub logprobs: Vec<serde_json::Value>,
    /// Choices 1.. of an answer with several (OpenAI `n > 1`), in `index` order; their `usage`
    /// is unused (the answer's own covers every choice).
    pub more_choices: Vec<Answer>,
}

impl Answer {
    /// Collects the events of a translator that read a whole answer at once (Gemini's
    /// `GenerateContentResponse` is one stream chunk): texts coalesced, tool-call pieces joined by
    /// index, the last usage, the end's finish reason; the first error is returned.
    pub fn from_frames(
        frames: impl IntoIterator<Item = Result<FrameBody, ErrorInfo>>,
    ) -> Result<Self, ErrorInfo> {
        let mut a = Answer::default();
        for f in frames {
            match f? {
                FrameBody::Text { text } => a.text.push_str(&text),
                FrameBody::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    let i = index as usize;
                    if a.tool_calls.len() <= i {
                        a.tool_calls.resize(i + 1, (None, None, String::new()));
                    }
                    let call = &mut a.tool_calls[i];
                    call.0 = call.0.take().or(id);
                    call.1 = call.1.take().or(name);
                    call.2.push_str(&arguments);
                }
                FrameBody::Usage { usage } => a.usage = Some(usage),
                FrameBody::End { finish_reason } => a.finish_reason = finish_reason,
                FrameBody::Logprobs { content } => a.logprobs.extend(content),
                other => {
                    other.accumulate_thinking(&mut a.thinking);
                }
            }
        }
        Ok(a)
    }

    /// The normalised events of the answer, in stream order. With several choices each one's
    /// content is followed by its [`FrameBody::ChoiceEnd`], choices 1.. each opened by a
    /// [`FrameBody::Choice`]; then the one `usage` and `end` (choice 0's finish reason).
    pub fn frames(mut self) -> Vec<FrameBody> {
        let more = std::mem::take(&mut self.more_choices);
        let (usage, finish_reason) = (self.usage.take(), self.finish_reason);
        let mut out = Vec::with_capacity(3 + self.tool_calls.len() + 2 * self.thinking.len());
        let multi = !more.is_empty();
        self.push_content(&mut out);
        if multi {
            out.push(FrameBody::ChoiceEnd {
                index: 0,
                finish_reason,
            });
        }
        for (i, choice) in more.into_iter().enumerate() {
            let index = i as u32 + 1;
            out.push(FrameBody::Choice { index });
            let finish_reason = choice.finish_reason;
            choice.push_content(&mut out);
            out.push(FrameBody::ChoiceEnd {
                index,
                finish_reason,
            });
        }
        if let Some(usage) = usage {
            out.push(FrameBody::Usage { usage });
        }
        out.push(FrameBody::End { finish_reason });
        out
    }

    /// The content frames of this one choice: thinking, text, logprobs, tool calls.
    fn push_content(self, out: &mut Vec<FrameBody>) {
        use switchyard_schemas::request::ThinkingBlock;
        for block in self.thinking {
            match block {
                ThinkingBlock::Thinking {
                    thinking,
                    signature,
                } => {
                    if !thinking.is_empty() {
                        out.push(FrameBody::Reasoning { text: thinking });
                    }
                    if let Some(signature) = signature {
                        out.push(FrameBody::ReasoningSignature { signature });
                    }
                }
                ThinkingBlock::RedactedThinking { data } => {
                    out.push(FrameBody::RedactedReasoning { data });
                }
                ThinkingBlock::Reasoning { .. } => {}
            }
        }
        if !self.text.is_empty() {
            out.push(FrameBody::Text { text: self.text });
        }
        if !self.logprobs.is_empty() {
            out.push(FrameBody::Logprobs {
                content: self.logprobs,
            });
        }
        for (index, (id, name, arguments)) in self.tool_calls.into_iter().enumerate() {
            out.push(FrameBody::ToolCall {
                index: index as u32,
                id,
                name,
                arguments,
            });
        }
    }
}

/// Upper bound on a complete JSON answer we read, bytes (64 MiB).
pub const MAX_JSON_ANSWER: usize = 64 * 1024 * 1024;

/// Whether a successful upstream response is one JSON document (`Content-Type: application/json`,
/// RFC 8259 §11) rather than a stream (`text/event-stream`, or Bedrock's
/// `application/vnd.amazon.eventstream`).
pub fn is_json_answer(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// A fast reader of a complete JSON answer's bytes into typed structs (no `serde_json::Value`,
/// whose objects cost an `IndexMap` with SipHash each). It returns `None` for any body it would
/// not read exactly as the provider's `Value` reader does, which then reads it.
pub type TypedParse = fn(&[u8]) -> Option<Answer>;

/// Reads a complete JSON answer (at most [`MAX_JSON_ANSWER`] bytes) and translates it with
/// `typed` when that reads it, else with `parse`. Lazy: the body is read when the stream is
/// first polled, so the worker keeps sending heartbeats while it waits. A body holding an error
/// object (`{"error":…}`, vLLM's `{"object":"error"}`, Anthropic's `{"type":"error"}`) is
/// classified by [`crate::providers::classify::stream_error`]; an unreadable body is a
/// `protocol` error.
pub fn translate_json(
    resp: reqwest::Response,
    typed: Option<TypedParse>,
    parse: fn(&serde_json::Value) -> Result<Answer, ErrorInfo>,
) -> EventStream {
    use futures::StreamExt;
    let first = rate_headers(resp.headers());
    let read = async move {
        let mut resp = resp;
        let mut body = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    body.extend_from_slice(&chunk);
                    if body.len() > MAX_JSON_ANSWER {
                        return vec![Err(ErrorInfo::new(
                            ErrorClass::Protocol,
                            format!("upstream JSON answer larger than {MAX_JSON_ANSWER} bytes"),
                        ))];
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    return vec![Err(ErrorInfo::new(
                        ErrorClass::Network,
                        format!("upstream body broke: {e}"),
                    ))];
                }
            }
        }
        if let Some(answer) = typed.and_then(|t| t(&body)) {
            return first.into_iter().chain(answer.frames()).map(Ok).collect();
        }
        let v: serde_json::Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return vec![Err(ErrorInfo::new(
                    ErrorClass::Protocol,
                    format!("upstream sent an unparsable JSON answer: {e}"),
                ))];
            }
        };
        let is_error = v.get("error").is_some_and(|e| !e.is_null())
            || matches!(
                v.get("object")
                    .or_else(|| v.get("type"))
                    .and_then(|t| t.as_str()),
                Some("error")
            );
        if is_error {
            return vec![Err(crate::providers::classify::stream_error(&v))];
        }
        match parse(&v) {
            Ok(answer) => first.into_iter().chain(answer.frames()).map(Ok).collect(),
            Err(e) => vec![Err(e)],
        }
    };
    futures::stream::once(read)
        .flat_map(futures::stream::iter)
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn classifies_statuses_and_retry_after() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("7"));
        let e = classify_http_error(
            429,
            &h,
            br#"{"error":{"message":"slow down","type":"rate_limit"}}"#,
        );
        assert_eq!(e.class, ErrorClass::RateLimited);
        assert_eq!(e.retry_after_ms, Some(7000));
        assert!(e.retryable);
        assert_eq!(e.message, "upstream returned HTTP 429: slow down");

        let e = classify_http_error(
            400,
            &HeaderMap::new(),
            br#"{"error":{"message":"too long","code":"context_length_exceeded"}}"#,
        );
        assert_eq!(e.class, ErrorClass::ContextLengthExceeded);
        assert!(!e.retryable);
        assert_eq!(
            classify_http_error(529, &HeaderMap::new(), b"").class,
            ErrorClass::Overloaded
        );
        assert_eq!(
            classify_http_error(502, &HeaderMap::new(), b"x").class,
            ErrorClass::Upstream5xx
        );
    }

    /// Google's error shape (Gemini API reference, "API errors").
    #[test]
    fn classifies_google_errors() {
        let body = br#"{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED",
            "details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"37s"}]}}"#;
        let e = classify_http_error(429, &HeaderMap::new(), body);
        assert_eq!(
            (e.class, e.retry_after_ms),
            (ErrorClass::RateLimited, Some(37_000))
        );
        assert_eq!(
            e.message,
            "upstream returned HTTP 429: Resource has been exhausted"
        );
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(
            classify_http_error(429, &h, body).retry_after_ms,
            Some(2000)
        );
        let body = br#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.",
            "status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo",
            "reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}"#;
        let e = classify_http_error(400, &HeaderMap::new(), body);
        assert_eq!((e.class, e.retryable), (ErrorClass::Auth, false));
        let body = br#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#;
        let e = classify_http_error(400, &HeaderMap::new(), body);
        assert_eq!(e.class, ErrorClass::ContextLengthExceeded);
        let body = br#"{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}"#;
        assert_eq!(
            classify_http_error(503, &HeaderMap::new(), body).class,
            ErrorClass::Overloaded
        );
    }
}
