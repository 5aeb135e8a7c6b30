//! `switchyard mock-upstream`: a wire-accurate mock of the OpenAI Chat Completions API and
//! the Anthropic Messages API, used by tests, the demo and benchmarks.
//!
//! # Routes
//!
//! * `POST /v1/chat/completions` — OpenAI Chat Completions (stream and non-stream).
//! * `POST /v1/responses` — OpenAI Responses (stream: typed `event:`/`data:` events with
//!   `sequence_number`, ending in `response.completed` or, when truncated by
//!   `max_output_tokens`, `response.incomplete`; non-stream: the `response` object). Directives are
//!   read from the last `user` input item; ids `resp_mock<uuid>`, items `msg_…`, `fc_…_<i>`.
//!   Also served as Azure's `/openai/v1/responses` (and `/v1/openai/v1/responses`).
//! * `POST /v1/messages` — Anthropic Messages (stream and non-stream; `max_tokens` required,
//!   `anthropic-version` is recorded but not required).
//! * `POST /v1beta/models/{model}:streamGenerateContent` and `:generateContent` — Google Gemini
//!   API (also under `/v1/models/…`); `?alt=sse` gives SSE, without it a JSON-array stream.
//! * `POST /openai/deployments/{deployment}/chat/completions?api-version=…` — Azure OpenAI (the
//!   OpenAI handler plus Azure's `prompt_filter_results` chunk; also under `/v1/openai/…` for
//!   `builtin:mock` targets); 404 without `api-version`.
//! * `POST /model/{modelId}/converse-stream` and `/converse` — Amazon Bedrock Converse (also
//!   under `/v1/model/…` for `builtin:mock` targets): AWS event-stream frames
//!   (`application/vnd.amazon.eventstream`), errors as `{"message"}` plus `x-amzn-ErrorType`; the
//!   in-stream error is a `modelStreamErrorException` frame. SigV4 is not verified (the
//!   `authorization` header is recorded).
//! * `GET /v1/models` — OpenAI list with the single model `mock`.
//! * `GET /health` — `{"status":"ok"}`.
//! * `GET /_mock/requests` — the recorded requests as a JSON array; `DELETE` clears them.
//!
//! Requests to the provider routes are recorded (path, query, headers, body).
//!
//! # Path prefix
//!
//! Every route is also served under `/x/<spec>/`, e.g. `/x/status=503/v1/chat/completions`:
//! `<spec>` is `key=value` pairs separated by `,` (a piece without `=` continues the previous
//! value, so `split=5,9` works; flags need `=1`), applied with the lowest precedence (below
//! directives and headers). Targets name it as `base_url: builtin:mock/x/<spec>`, which lets two
//! targets on one mock behave differently. Recorded paths keep the prefix.
//!
//! # Behaviour
//!
//! Each request can steer the mock with headers `x-mock-<key>: value` or with a line
//! `#mock key=value key=value` inside the **last user message** (for requests that pass
//! through a gateway that does not forward headers). Headers win over directives. Keys are
//! case-insensitive, `-` may replace `_`, a bare `key` in a directive means `key=1`.
//! Unknown keys are ignored; malformed values give a 400 in the provider's error shape.
//!
//! | key | meaning |
//! |-----|---------|
//! | `text=<urlencoded>` | completion text (default [`DEFAULT_TEXT`]; `+` decodes to a space) |
//! | `text_len=N` | deterministic ASCII text of exactly N bytes (`lorem ipsum dolor sit amet ...`); `text` wins |
//! | `chunks=N` | N nearly-equal stream pieces at char boundaries (default: one per word, each word keeps its following whitespace) |
//! | `ttft_ms=N` | delay before the first content (stream headers go out at once; Anthropic `message_start` too) |
//! | `chunk_delay_ms=N` | delay between content chunks |
//! | `status=N` | answer with HTTP status N and a provider-shaped error body (2xx means "no error") |
//! | `retry_after=S` | adds `Retry-After: S` to error responses |
//! | `error_after=N` | streams: N content chunks then an in-stream error; non-stream: 500 |
//! | `hang=1` | streams: headers (Anthropic: plus `message_start`) then nothing; non-stream: no response |
//! | `garbage=1` | streams: invalid non-SSE bytes (invalid UTF-8) after the first content chunk |
//! | `split=a,b,c` | serialise the whole body, then write it as frames cut at these byte offsets (~2 ms apart) |
//! | `split_every=N` | like `split`, every N bytes |
//! | `compact=1` | `data:{...}` / `event:x` without the space after the colon |
//! | `crlf=1` | `\r\n` line endings |
//! | `tool_calls=N` | N parallel tool calls instead of text (names cycle through the request's `tools`, default `get_weather`); as a directive, ignored when the last message is a tool result |
//! | `tool_args=<urlencoded JSON>` | the arguments of every generated tool call (default `{"city": …}`) |
//! | `prompt_tokens=N`, `completion_tokens=N`, `cached_tokens=N` | override usage |
//! | `usage=<urlencoded JSON object>` | report this provider-native usage object verbatim (Anthropic `usage`: whole in `message_delta`, with at most 1 output token in `message_start`; Gemini `usageMetadata`: in the last chunk, its prompt counts on the earlier ones; Bedrock `usage` in `metadata`; OpenAI `usage` in the usage chunk / body) |
//! | `service_tier=<name>` | OpenAI: top-level `service_tier` on the body and the usage chunk |
//! | `finish=<reason>` | the provider-native stop reason, verbatim (OpenAI `finish_reason`, Anthropic `stop_reason`, Gemini `finishReason`, Bedrock `stopReason`), e.g. a safety block: `content_filter`, `refusal`, `SAFETY` / `PROHIBITED_CONTENT`, `content_filtered` / `guardrail_intervened` |
//! | `id=<urlencoded>` | exact response id (for byte-identical comparisons) |
//! | `created=N` | OpenAI `created` timestamp |
//! | `keepalive_ms=N` | SSE streams: write the comment `: keepalive` every N ms while otherwise silent (before the first chunk, between chunks, while hanging) |
//! | `fail_times=N` | `status` applies only to the first N requests with this request's `idempotency-key` header (or, without one, the same body), counted over the recorded requests; later ones succeed |
//! | `error_message=<urlencoded>` | message of the `status` error body |
//! | `json_for_stream=1` | a stream request gets the complete non-stream JSON answer (`application/json`), as some OpenAI-compatible servers send |
//! | `reject_stream_options=1` | a request with `stream_options` gets 400 `Unrecognized request argument supplied: stream_options` (older Azure api-versions) |
//! | `rate_headers=1` | successful answers carry the provider's rate-limit headers (OpenAI `x-ratelimit-*`: limit 10000 requests / 30000000 tokens, remaining 9999 / 29999000; Anthropic `anthropic-ratelimit-requests-*`) |
//! | `accept_encrypted=<prefix>` | Responses: an input `reasoning` item whose `encrypted_content` does not start with the prefix gets 400 `invalid_encrypted_content` (another deployment's encrypted reasoning) |
//! | `texts=<urlencoded>\|<urlencoded>…` | OpenAI/Azure `n > 1`: the text of each choice (choice `k` takes entry `k` modulo their number); without it every choice answers the same |
//!
//! Notes:
//!
//! * With `split`/`split_every` the timing options `ttft_ms`/`chunk_delay_ms` are ignored
//!   (frames are written ~2 ms apart); with `hang=1` splitting is ignored. Splitting also
//!   applies to non-stream JSON bodies.
//! * A non-stream response waits `ttft_ms + (pieces - 1) * chunk_delay_ms`, i.e. the time
//!   the equivalent stream would take.
//! * Default usage: prompt tokens = whitespace-separated words over all text of the request
//!   messages (and the Anthropic `system`); completion tokens = words of the generated text
//!   (10 per tool call); cached 0. Anthropic `input_tokens` excludes cached tokens.
//! * `max_tokens` / `max_completion_tokens` smaller than the word count truncates the text to
//!   that many words and finishes with `length` / `max_tokens`.
//! * Ids are `chatcmpl-mock-<uuid>` / `msg_mock_<uuid>` / Gemini `responseId` `mock<uuid>`; tool
//!   call ids `call_mock_<i>` / `toolu_mock_<i>` (Gemini function calls carry none); the
//!   response `model` (Gemini `modelVersion`) echoes the request.
//! * OpenAI / Azure honour `n` as OpenAI does: `n` choices (`index` 0..n-1), each with its own
//!   `message`, `finish_reason` (`max_tokens` truncates each) and `logprobs`; streamed one choice
//!   per chunk, round robin (all role chunks first), each choice's `finish_reason` chunk after its
//!   last content, then one usage chunk; usage counts the prompt once and sums the completions.
//!   `logprobs: true` gives one entry per text chunk (`logprob` −0.5) with `top_logprobs`
//!   alternatives: the token itself (−0.5), then `alt1`, `alt2`, … (−1.5, −2.5, …).
//! * Gemini: directives are read from the last `user` content with text; `maxOutputTokens`
//!   truncates like `max_tokens`; each function call is streamed whole in its own chunk; the
//!   in-stream error is `{"error":{"code":503,…,"status":"UNAVAILABLE"}}`.

mod anthropic;
mod bedrock;
mod behaviour;
pub mod embeddings;
pub mod fixtures;
mod gemini;
mod handler;
mod openai;
mod responses;
mod wire;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_anthropic;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The default completion text; streamed as one chunk per word.
pub const DEFAULT_TEXT: &str =
    "Hello from the Switchyard mock upstream. Every word arrives as its own chunk.";

/// One request received by the mock on a provider route (`/v1/...`, `/v1beta/...`, `/openai/...`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordedRequest {
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Query string without `?`, e.g. `alt=sse` or `api-version=2024-10-21`, when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// Request headers (lower-case names, arrival order) without hop-by-hop headers
    /// and `content-length`.
    pub headers: Vec<(String, String)>,
    /// JSON body; `Null` when empty, a string holding the raw text when not valid JSON.
    pub body: serde_json::Value,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
struct Inner {
    requests: Mutex<VecDeque<RecordedRequest>>,
    count: AtomicUsize,
    early_closes: Mutex<Vec<std::time::Instant>>,
    limit: Option<usize>,
}

/// Shared state of a mock server: the request recording. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MockState {
    inner: Arc<Inner>,
}

impl Default for MockState {
    fn default() -> Self {
        Self::new()
    }
}

impl MockState {
    /// State that records every request.
    pub fn new() -> Self {
        Self::build(None)
    }

    /// State that keeps only the most recent `limit` requests (for long benchmarks);
    /// [`MockState::request_count`] still counts all of them.
    pub fn with_record_limit(limit: usize) -> Self {
        Self::build(Some(limit))
    }

    fn build(limit: Option<usize>) -> Self {
        Self {
            inner: Arc::new(Inner {
                requests: Mutex::new(VecDeque::new()),
                count: AtomicUsize::new(0),
                early_closes: Mutex::new(Vec::new()),
                limit,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<RecordedRequest>> {
        self.inner
            .requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When each streamed response was closed by the client before its end, in order.
    pub fn early_closes(&self) -> Vec<std::time::Instant> {
        self.inner
            .early_closes
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    pub(crate) fn record_early_close(&self) {
        if let Ok(mut v) = self.inner.early_closes.lock() {
            v.push(std::time::Instant::now());
        }
    }

    /// The recorded requests in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().iter().cloned().collect()
    }

    /// How many requests were recorded since creation or the last [`MockState::clear`].
    pub fn request_count(&self) -> usize {
        self.inner.count.load(Ordering::SeqCst)
    }

    /// Forgets all recorded requests and resets the count.
    pub fn clear(&self) {
        let mut requests = self.lock();
        requests.clear();
        self.inner.count.store(0, Ordering::SeqCst);
    }

    /// How many kept requests satisfy `pred` (see [`MockState::with_record_limit`]).
    pub fn count_matching(&self, pred: impl Fn(&RecordedRequest) -> bool) -> usize {
        self.lock().iter().filter(|r| pred(r)).count()
    }

    fn record(&self, request: RecordedRequest) {
        let mut requests = self.lock();
        if self.inner.limit == Some(0) {
            self.inner.count.fetch_add(1, Ordering::SeqCst);
            return;
        }
        requests.push_back(request);
        if let Some(limit) = self.inner.limit {
            while requests.len() > limit {
                requests.pop_front();
            }
        }
        self.inner.count.fetch_add(1, Ordering::SeqCst);
    }
}

/// Serves the mock API on `listener` until the returned future is dropped.
pub async fn serve(listener: TcpListener, state: MockState) -> std::io::Result<()> {
    serve_until_dropped(listener, state, CancellationToken::new()).await
}

/// Like [`serve`]; cancelling `shutdown` fails every open stream and hanging request.
async fn serve_until_dropped(
    listener: TcpListener,
    state: MockState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use axum::ServiceExt as _;
    use tower::Layer as _;
    let app =
        axum::middleware::from_fn(handler::path_prefix).layer(handler::router(state, shutdown));
    axum::serve(listener, app.into_make_service()).await
}

/// A mock server running in the background on `127.0.0.1`; stops when dropped.
#[derive(Debug)]
pub struct MockUpstream {
    addr: SocketAddr,
    state: MockState,
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl MockUpstream {
    /// Binds `127.0.0.1:0` and spawns the server with fresh state.
    pub async fn start() -> std::io::Result<MockUpstream> {
        Self::start_with_state(MockState::new()).await
    }

    /// Binds `127.0.0.1:0` and spawns the server with the given state.
    pub async fn start_with_state(state: MockState) -> std::io::Result<MockUpstream> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        #[expect(
            clippy::disallowed_methods,
            reason = "aborted when the MockUpstream is dropped, so it cannot outlive it"
        )]
        let task = tokio::spawn(serve_until_dropped(
            listener,
            state.clone(),
            shutdown.clone(),
        ));
        Ok(MockUpstream {
            addr,
            state,
            shutdown,
            task,
        })
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shared state (recording).
    pub fn state(&self) -> &MockState {
        &self.state
    }

    /// The recorded requests in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests()
    }

    /// How many requests were recorded.
    pub fn request_count(&self) -> usize {
        self.state.request_count()
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        // Open connections outlive the accept loop, so fail their streams explicitly.
        self.shutdown.cancel();
        self.task.abort();
    }
}
