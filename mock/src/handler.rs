//! Axum routes and the request flow shared by both providers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::behaviour::{Behaviour, RequestInfo, generate, generate_choices};
use super::wire::{self, Item, Plan, SseFormat};
use super::{MockState, RecordedRequest, anthropic, bedrock, gemini, openai, responses};

/// Largest accepted request body.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// Headers never recorded.
const SKIPPED_HEADERS: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
];

#[derive(Clone)]
struct App {
    state: MockState,
    shutdown: CancellationToken,
}

/// One provider request as its handler reads it: the app, the headers, the URI and the raw body
/// (extracted in that order, as `State`, `HeaderMap`, `Uri` and `Bytes` would be).
struct Call {
    app: App,
    headers: HeaderMap,
    uri: Uri,
    body: Bytes,
}

impl FromRequest<App> for Call {
    type Rejection = BytesRejection;

    async fn from_request(req: Request, app: &App) -> Result<Self, Self::Rejection> {
        let (headers, uri) = (req.headers().clone(), req.uri().clone());
        let body = Bytes::from_request(req, app).await?;
        Ok(Self {
            app: app.clone(),
            headers,
            uri,
            body,
        })
    }
}

impl Call {
    /// Records the request with `body` as its recorded body.
    fn record(&self, body: Value) {
        record(&self.app.state, &self.headers, &self.uri, body);
    }

    /// Records the request with its body read as JSON (`null` when it is not) and returns that.
    fn record_json(&self) -> Value {
        let value: Value = serde_json::from_slice(&self.body).unwrap_or(Value::Null);
        self.record(value.clone());
        value
    }
}

/// Internal header carrying the `/x/<spec>` path prefix a request arrived with (set by
/// [`path_prefix`], never recorded).
const PREFIX_HEADER: &str = "switchyard-mock-prefix";

/// Strips a leading `/x/<spec>` from the path (keeping the query) and remembers it in
/// [`PREFIX_HEADER`], so `/x/status=503/v1/chat/completions` is served by the normal route with
/// `status=503` as its lowest-precedence behaviour.
pub(crate) async fn path_prefix(mut req: Request, next: Next) -> Response {
    let rewritten = req.uri().path().strip_prefix("/x/").and_then(|rest| {
        let (spec, tail) = rest.split_once('/')?;
        let prefix = HeaderValue::from_str(&format!("/x/{spec}")).ok()?;
        let tail = match req.uri().query() {
            Some(q) => format!("/{tail}?{q}"),
            None => format!("/{tail}"),
        };
        Some((prefix, tail.parse::<Uri>().ok()?))
    });
    if let Some((prefix, uri)) = rewritten {
        *req.uri_mut() = uri;
        req.headers_mut()
            .insert(HeaderName::from_static(PREFIX_HEADER), prefix);
    } else {
        req.headers_mut().remove(PREFIX_HEADER);
    }
    next.run(req).await
}

/// The `k=v,…` spec of the request's `/x/<spec>` path prefix, if it had one.
fn path_spec(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(PREFIX_HEADER)?
        .to_str()
        .ok()?
        .strip_prefix("/x/")
}

/// All routes of the mock.
pub(crate) fn router(state: MockState, shutdown: CancellationToken) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/messages", post(messages))
        .route("/v1/responses", post(responses_create))
        .route("/openai/v1/responses", post(responses_create))
        .route("/v1/openai/v1/responses", post(responses_create))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1beta/models/{target}", post(generate_content))
        .route("/v1/models/{target}", post(generate_content))
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(azure_chat_completions),
        )
        .route(
            "/v1/openai/deployments/{deployment}/chat/completions",
            post(azure_chat_completions),
        )
        .route("/model/{model}/{operation}", post(converse))
        .route("/v1/model/{model}/{operation}", post(converse))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/_mock/requests", get(list_requests).delete(clear_requests))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(App { state, shutdown })
}

#[derive(Debug, Clone, Copy)]
enum Provider {
    OpenAi,
    Anthropic,
    /// Google Gemini API (`models/{model}:generateContent` / `:streamGenerateContent`).
    Gemini,
    /// Azure OpenAI: the OpenAI wire format plus Azure's content-filter annotations.
    Azure,
    /// Amazon Bedrock Converse (`/model/{modelId}/converse(-stream)`, event-stream frames).
    Bedrock,
    /// OpenAI Responses (`/v1/responses`, typed SSE events).
    Responses,
}

impl Provider {
    fn error_body(self, status: u16, message: Option<&str>) -> Value {
        match self {
            Provider::OpenAi | Provider::Responses => openai::error_body(status, message),
            Provider::Anthropic => anthropic::error_body(status, message),
            Provider::Gemini => gemini::error_body(status, message),
            Provider::Azure => openai::azure_error_body(status, message),
            Provider::Bedrock => bedrock::error_body(status, message),
        }
    }

    fn request_info(self, body: &Value, uri: &Uri) -> Result<RequestInfo, String> {
        match self {
            Provider::OpenAi | Provider::Azure => openai::request_info(body),
            Provider::Anthropic => anthropic::request_info(body),
            Provider::Gemini => gemini::request_info(body, uri),
            Provider::Bedrock => bedrock::request_info(body, uri),
            Provider::Responses => responses::request_info(body),
        }
    }

    fn new_id(self) -> String {
        let uuid = uuid::Uuid::now_v7().simple();
        match self {
            Provider::OpenAi | Provider::Azure => format!("chatcmpl-mock-{uuid}"),
            Provider::Anthropic => format!("msg_mock_{uuid}"),
            Provider::Gemini | Provider::Bedrock => format!("mock{uuid}"),
            Provider::Responses => format!("resp_mock{uuid}"),
        }
    }

    fn request_id_header(self) -> (HeaderName, String) {
        let uuid = uuid::Uuid::now_v7().simple();
        match self {
            Provider::OpenAi | Provider::Responses => (
                HeaderName::from_static("x-request-id"),
                format!("req_mock_{uuid}"),
            ),
            Provider::Azure => (
                HeaderName::from_static("apim-request-id"),
                uuid::Uuid::now_v7().to_string(),
            ),
            // Google sends no request id header; its front end names itself.
            Provider::Gemini => (header::SERVER, "scaffolding on HTTPServer2".to_string()),
            Provider::Anthropic => (
                HeaderName::from_static("request-id"),
                format!("req_mock_{uuid}"),
            ),
            Provider::Bedrock => (
                HeaderName::from_static("x-amzn-requestid"),
                uuid::Uuid::now_v7().to_string(),
            ),
        }
    }

    /// A response with the provider's request id header.
    fn response(self, status: StatusCode, content_type: &'static str, body: Body) -> Response {
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        let (name, value) = self.request_id_header();
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
        response
    }

    /// `rate_headers=1`: the rate-limit headers a real upstream sends with its answers: OpenAI's
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (OpenAI API docs, "Rate limits"),
    /// Anthropic's `anthropic-ratelimit-requests-{limit,remaining,reset}` (Anthropic API
    /// reference, "Rate limits"); fixed values (limit 10000 requests / 30000000 tokens, one
    /// request and 1000 tokens used).
    fn rate_headers(self, response: &mut Response) {
        let pairs: &[(&'static str, &'static str)] = match self {
            Provider::OpenAi | Provider::Azure | Provider::Responses => &[
                ("x-ratelimit-limit-requests", "10000"),
                ("x-ratelimit-remaining-requests", "9999"),
                ("x-ratelimit-reset-requests", "6ms"),
                ("x-ratelimit-limit-tokens", "30000000"),
                ("x-ratelimit-remaining-tokens", "29999000"),
                ("x-ratelimit-reset-tokens", "2ms"),
            ],
            Provider::Anthropic => &[
                ("anthropic-ratelimit-requests-limit", "4000"),
                ("anthropic-ratelimit-requests-remaining", "3999"),
                ("anthropic-ratelimit-requests-reset", "2026-01-01T00:00:00Z"),
            ],
            Provider::Gemini | Provider::Bedrock => &[],
        };
        for (name, value) in pairs {
            response
                .headers_mut()
                .insert(*name, HeaderValue::from_static(value));
        }
    }

    /// A provider-shaped error response.
    fn error(self, status: u16, message: Option<&str>, retry_after: Option<&str>) -> Response {
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let value = self.error_body(status, message);
        let body = match self {
            Provider::Gemini => gemini::pretty(&value),
            _ => value.to_string(),
        };
        let mut response = self.response(code, "application/json", Body::from(body));
        if let Some(value) = retry_after.and_then(|v| HeaderValue::from_str(v).ok()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        if let (Provider::Bedrock, Ok(value)) = (
            self,
            HeaderValue::from_str(&bedrock::error_type_header(status)),
        ) {
            let name = HeaderName::from_static("x-amzn-errortype");
            response.headers_mut().insert(name, value);
        }
        response
    }

    /// An OpenAI-shaped error with an explicit `code` (e.g. `invalid_encrypted_content`).
    fn error_with_code(self, status: u16, message: &str, code: &str) -> Response {
        let mut value = self.error_body(status, Some(message));
        value["error"]["code"] = Value::String(code.to_owned());
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        self.response(code, "application/json", Body::from(value.to_string()))
    }
}

async fn chat_completions(call: Call) -> Response {
    handle(Provider::OpenAi, &call).await
}

async fn responses_create(call: Call) -> Response {
    handle(Provider::Responses, &call).await
}

async fn messages(call: Call) -> Response {
    handle(Provider::Anthropic, &call).await
}

/// `POST /v1/messages/count_tokens` (Anthropic "Count Message tokens"): `{"input_tokens": N}`
/// with N = `prompt_tokens` when the request's directives set it, else the words of `system`
/// and `messages`; `status=` answers an Anthropic error instead.
async fn count_tokens(call: Call) -> Response {
    let value = call.record_json();
    let b = match Behaviour::from_request(path_spec(&call.headers), &call.headers, &value) {
        Ok(b) => b,
        Err(e) => return Provider::Anthropic.error(400, Some(&e), None),
    };
    if let Some(status) = b.status {
        return Provider::Anthropic.error(status, b.error_message.as_deref(), None);
    }
    if !value.get("messages").is_some_and(Value::is_array) {
        return Provider::Anthropic.error(400, Some("messages: Field required"), None);
    }
    if value.get("max_tokens").is_some() {
        let message = "max_tokens: Extra inputs are not permitted";
        return Provider::Anthropic.error(400, Some(message), None);
    }
    let words = super::behaviour::messages_words(&value)
        + value
            .get("system")
            .map_or(0, super::behaviour::content_words);
    let n = b.prompt_tokens.unwrap_or(words);
    let body = json!({ "input_tokens": n }).to_string();
    Provider::Anthropic.response(StatusCode::OK, "application/json", Body::from(body))
}

/// `POST /v1beta/models/{model}:(stream)GenerateContent` (also under `/v1`).
async fn generate_content(call: Call) -> Response {
    if gemini::parse_target(call.uri.path()).is_none() {
        call.record(Value::Null);
        let message = format!("Method not found: {}", call.uri.path());
        return Provider::Gemini.error(404, Some(&message), None);
    }
    handle(Provider::Gemini, &call).await
}

/// `POST /model/{modelId}/converse-stream` and `/converse` (Amazon Bedrock; also under `/v1`).
async fn converse(call: Call) -> Response {
    if bedrock::parse_target(call.uri.path()).is_none() {
        call.record(Value::Null);
        return Provider::Bedrock.error(404, Some("Unknown operation (mock)"), None);
    }
    handle(Provider::Bedrock, &call).await
}

/// Azure OpenAI chat completions: the OpenAI handler behind Azure's URL, which requires the
/// `api-version` query parameter (answered 404 "Resource not found" without it).
async fn azure_chat_completions(call: Call) -> Response {
    let has_version = call
        .uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("api-version=")));
    if !has_version {
        call.record(Value::Null);
        return Provider::Azure.error(404, Some("Resource not found"), None);
    }
    handle(Provider::Azure, &call).await
}

async fn embeddings(call: Call) -> Response {
    let value = call.record_json();
    super::embeddings::respond(&call.headers, &value)
}

async fn models(call: Call) -> Response {
    call.record(Value::Null);
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": "mock",
            "object": "model",
            "created": 1_700_000_000u64,
            "owned_by": "switchyard",
        }],
    }))
    .into_response()
}

async fn health() -> Response {
    axum::Json(json!({ "status": "ok" })).into_response()
}

async fn list_requests(State(app): State<App>) -> Response {
    axum::Json(app.state.requests()).into_response()
}

async fn clear_requests(State(app): State<App>) -> StatusCode {
    app.state.clear();
    StatusCode::NO_CONTENT
}

async fn not_found(method: Method, uri: Uri) -> Response {
    let message = format!("Invalid URL ({method} {})", uri.path());
    let body = json!({
        "error": { "message": message, "type": "invalid_request_error", "param": null, "code": null }
    });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

fn record(state: &MockState, headers: &HeaderMap, uri: &Uri, body: Value) {
    let path = match headers.get(PREFIX_HEADER).and_then(|v| v.to_str().ok()) {
        Some(prefix) => format!("{prefix}{}", uri.path()),
        None => uri.path().to_string(),
    };
    let headers = headers
        .iter()
        .filter(|(name, _)| {
            !SKIPPED_HEADERS.contains(&name.as_str()) && name.as_str() != PREFIX_HEADER
        })
        .map(|(name, value)| {
            let value = match value.to_str() {
                Ok(v) => v.to_string(),
                Err(_) => String::from_utf8_lossy(value.as_bytes()).into_owned(),
            };
            (name.as_str().to_string(), value)
        })
        .collect();
    state.record(RecordedRequest {
        path,
        query: uri.query().map(str::to_string),
        headers,
        body,
    });
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn handle(provider: Provider, call: &Call) -> Response {
    let Call {
        app,
        headers,
        uri,
        body: raw,
    } = call;
    let parsed = serde_json::from_slice::<Value>(raw);
    let recorded = match &parsed {
        Ok(value) => value.clone(),
        Err(_) if raw.is_empty() => Value::Null,
        Err(_) => Value::String(String::from_utf8_lossy(raw).into_owned()),
    };
    call.record(recorded);

    let body = match parsed {
        Ok(value) if value.is_object() => value,
        Ok(_) => return provider.error(400, Some("The request body must be a JSON object."), None),
        Err(e) => {
            let message = format!("We could not parse the JSON body of your request: {e}");
            return provider.error(400, Some(&message), None);
        }
    };
    let directives = match provider {
        Provider::Gemini => gemini::directive_view(&body),
        Provider::Responses => std::borrow::Cow::Owned(responses::chat_view(&body)),
        _ => std::borrow::Cow::Borrowed(&body),
    };
    let behaviour = match Behaviour::from_request(path_spec(headers), headers, &directives) {
        Ok(b) => b,
        Err(message) => return provider.error(400, Some(&message), None),
    };
    if let Some(status) = behaviour.status {
        let failing = behaviour.fail_times.is_none_or(|n| {
            let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
            let seen = app.state.count_matching(|r| match key {
                Some(key) => r.header("idempotency-key") == Some(key),
                None => r.body == body,
            });
            seen <= n
        });
        if failing {
            return provider.error(
                status,
                behaviour.error_message.as_deref(),
                behaviour.retry_after.as_deref(),
            );
        }
    }
    if let (Provider::Responses, Some(prefix)) = (provider, &behaviour.accept_encrypted) {
        let foreign = body["input"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["type"] == "reasoning")
            .filter_map(|i| i["encrypted_content"].as_str())
            .any(|c| !c.starts_with(prefix.as_str()));
        if foreign {
            let message = "The encrypted content for item could not be verified.";
            return provider.error_with_code(400, message, "invalid_encrypted_content");
        }
    }
    if behaviour.reject_stream_options && body.get("stream_options").is_some() {
        let message = "Unrecognized request argument supplied: stream_options";
        return provider.error(400, Some(message), None);
    }
    if let Some(name) = &behaviour.fixture {
        let Some(bytes) = super::fixtures::get(name) else {
            return provider.error(400, Some(&format!("unknown mock fixture `{name}`")), None);
        };
        let script = wire::Script {
            body: super::fixtures::events(bytes)
                .into_iter()
                .map(Item::Content)
                .collect(),
            ..wire::Script::default()
        };
        let plan = wire::plan(script, &behaviour, SseFormat::new(&behaviour));
        return provider.response(
            StatusCode::OK,
            "text/event-stream; charset=utf-8",
            wire::body(plan, app.shutdown.clone(), app.state.clone()),
        );
    }
    let mut info = match provider.request_info(&body, uri) {
        Ok(info) => info,
        Err(message) => return provider.error(400, Some(&message), None),
    };
    info.assistant_turns = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
    info.logprobs = body.get("logprobs") == Some(&Value::Bool(true));
    if matches!(provider, Provider::OpenAi | Provider::Azure) {
        let num = |k: &str| body.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
        info.n = num("n").max(1);
        info.top_logprobs = num("top_logprobs");
    }
    // OpenAI-style answers have `n` choices; the other providers one.
    let choices = generate_choices(&behaviour, &info);
    let generation = choices
        .first()
        .cloned()
        .unwrap_or_else(|| generate(&behaviour, &info));
    let fmt = SseFormat::new(&behaviour);
    let id = behaviour.id.clone().unwrap_or_else(|| provider.new_id());
    let created = behaviour.created.unwrap_or_else(now_secs);

    if info.stream && !behaviour.json_for_stream {
        let script = match provider {
            Provider::OpenAi => openai::stream_script(&id, created, &info, &choices, fmt),
            Provider::Azure => {
                let mut script = openai::stream_script(&id, created, &info, &choices, fmt);
                script
                    .body
                    .insert(0, Item::Frame(openai::azure_prompt_filter_chunk(fmt)));
                script
            }
            Provider::Anthropic => anthropic::stream_script(&id, &info, &generation, fmt),
            Provider::Gemini => {
                gemini::stream_script(&id, &info, &generation, fmt, gemini::is_sse(uri))
            }
            Provider::Bedrock => bedrock::stream_script(&generation, behaviour.ttft_ms),
            Provider::Responses => responses::stream_script(&id, created, &info, &generation, fmt),
        };
        let content_type = match provider {
            Provider::Gemini if !gemini::is_sse(uri) => "application/json; charset=UTF-8",
            Provider::Bedrock => "application/vnd.amazon.eventstream",
            _ => "text/event-stream; charset=utf-8",
        };
        let mut plan = wire::plan(script, &behaviour, fmt);
        if matches!(provider, Provider::Bedrock)
            || matches!(provider, Provider::Gemini if !gemini::is_sse(uri))
        {
            plan.keepalive = None; // not SSE: a comment line would corrupt the stream
        }
        let mut response = provider.response(
            StatusCode::OK,
            content_type,
            wire::body(plan, app.shutdown.clone(), app.state.clone()),
        );
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        if behaviour.rate_headers {
            provider.rate_headers(&mut response);
        }
        return response;
    }

    // Non-stream: wait as long as the equivalent stream would take.
    if behaviour.hang {
        app.shutdown.cancelled().await;
        return provider.response(StatusCode::OK, "application/json", wire::aborted_body());
    }
    let pieces = generation.content_pieces().saturating_sub(1) as u64;
    let delay = Duration::from_millis(
        behaviour
            .ttft_ms
            .saturating_add(behaviour.chunk_delay_ms.saturating_mul(pieces)),
    );
    if !delay.is_zero() {
        // A client that leaves while the answer is "generated" drops this future: recorded as an
        // early close, as for streams.
        let guard = EarlyClose(Some(app.state.clone()));
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = app.shutdown.cancelled() => {
                return provider.response(StatusCode::OK, "application/json", wire::aborted_body());
            }
        }
        guard.finish();
    }
    if behaviour.error_after.is_some() {
        return provider.error(500, None, behaviour.retry_after.as_deref());
    }
    let value = match provider {
        Provider::OpenAi => openai::completion(&id, created, &info, &choices),
        Provider::Azure => {
            let mut value = openai::completion(&id, created, &info, &choices);
            value["prompt_filter_results"] = openai::azure_prompt_filter_results();
            value
        }
        Provider::Anthropic => anthropic::message(&id, &info, &generation),
        Provider::Gemini => gemini::generate_response(&id, &info, &generation),
        Provider::Bedrock => bedrock::converse_response(&generation, delay.as_millis() as u64),
        Provider::Responses => responses::response_object(&id, created, &info, &generation),
    };
    let bytes = Bytes::from(match provider {
        Provider::Gemini => gemini::pretty(&value),
        _ => value.to_string(),
    });
    let body = match behaviour.split_offsets(bytes.len()) {
        Some(offsets) => wire::body(
            Plan::split(&bytes, &offsets),
            app.shutdown.clone(),
            app.state.clone(),
        ),
        None => Body::from(bytes),
    };
    let mut response = provider.response(StatusCode::OK, "application/json", body);
    if behaviour.rate_headers {
        provider.rate_headers(&mut response);
    }
    response
}

/// Records an early close when dropped before [`EarlyClose::finish`].
struct EarlyClose(Option<MockState>);

impl EarlyClose {
    fn finish(mut self) {
        self.0 = None;
    }
}

impl Drop for EarlyClose {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            state.record_early_close();
        }
    }
}
