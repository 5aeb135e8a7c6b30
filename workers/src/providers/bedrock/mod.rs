//! Amazon Bedrock adapter: the Converse API, streaming through `ConverseStream`
//! (`POST {base_url}/model/{modelId}/converse-stream`) for streaming clients and `Converse`
//! (`…/converse`, one JSON answer, [`parse_converse`]) for the others, signed with AWS Signature
//! Version 4.
//!
//! * Endpoint (Amazon Bedrock API Reference, "ConverseStream"; AWS General Reference, "Amazon
//!   Bedrock endpoints and quotas"): `base_url` defaults to
//!   `https://bedrock-runtime.{region}.amazonaws.com`; `modelId` (a model id such as
//!   `anthropic.claude-3-haiku-20240307-v1:0`, an inference profile id or an ARN) is one
//!   URI-encoded path segment, so `:` goes out as `%3A` and `/` as `%2F`.
//! * Signing (AWS IAM User Guide, "Create a signed AWS API request"): SigV4 with service
//!   `bedrock`, the target's region and credentials, computed by the `aws-sigv4` crate with its
//!   default settings: the canonical URI is the path URI-encoded once more (`%3A` → `%253A`),
//!   which is what every AWS service except S3 expects. Signed headers: `content-type`, `host`,
//!   `x-amz-date` and, with temporary credentials, `x-amz-security-token`.
//! * Request translation: [`build_request`] (Amazon Bedrock API Reference, "Converse":
//!   `Message`, `ContentBlock`, `SystemContentBlock`, `InferenceConfiguration`,
//!   `ToolConfiguration`).
//! * Response: `application/vnd.amazon.eventstream` (AWS SDKs, "Event stream encoding": binary
//!   frames with a CRC32-checked prelude, typed headers and a payload), decoded with
//!   `aws-smithy-eventstream`'s `MessageFrameDecoder`. Each frame's `:message-type` is `event`
//!   (`:event-type` names a `ConverseStreamOutput` member and the payload is its JSON), `exception`
//!   (`:exception-type`, payload `{"message"}`) or `error` (`:error-code`, `:error-message`).
//!   Event order (Amazon Bedrock API Reference, "ConverseStreamOutput"): `messageStart`, per
//!   content block `contentBlockStart`? `contentBlockDelta`* `contentBlockStop`, `messageStop`
//!   (`stopReason`), then `metadata` (`usage`, `metrics.latencyMs`). Payloads also carry a
//!   padding member `p` of varying length (seen on the wire, not in the API reference), which is
//!   ignored like every unknown member; unknown event types are ignored too.
//! * HTTP errors (Amazon Bedrock API Reference, "ConverseStream" → Errors; Smithy restJson1
//!   protocol): JSON `{"message": …}` with the error shape in the `x-amzn-ErrorType` header
//!   (`ThrottlingException:http://internal.amazon.com/coral/…`); see [`classify_http_error`].

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue as FrameHeaderValue, Message as Frame};
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use reqwest::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use switchyard_schemas::config::{AwsTarget, ProviderKind, TargetConfig};
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage};

use crate::provider::{
    Answer, Call, EventStream, Provider, Upstream, classify_transport_error, is_json_answer,
    translate_json,
};

/// SigV4 signing name of the Bedrock runtime, the service part of the credential scope
/// `…/{region}/bedrock/aws4_request` (the `bedrock-runtime` service model's `aws.auth#sigv4`
/// name, equal to the IAM service prefix in the AWS Service Authorization Reference, "Amazon
/// Bedrock").
pub const SIGNING_SERVICE: &str = "bedrock";

/// Content type of a `ConverseStream` response body (AWS SDKs, "Event stream encoding").
pub const EVENT_STREAM_CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// Largest event-stream frame accepted, bytes. Not an AWS number: Bedrock frames are a few
/// hundred bytes; this only bounds what a broken upstream can make the worker buffer.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// `inputSchema.json` sent for a tool declared without `parameters`; Bedrock requires an
/// input schema on every `ToolSpecification` (Amazon Bedrock API Reference, "ToolSpecification").
pub fn empty_input_schema() -> Value {
    crate::providers::shared::empty_object_schema()
}

/// Adapter for Amazon Bedrock Converse with SigV4 request signing (see the module docs).
/// Stateless; `ConverseStream` for streaming clients, `Converse` for the others.
#[derive(Debug, Clone, Copy, Default)]
pub struct BedrockProvider;

impl Provider for BedrockProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Bedrock
    }

    fn stream_chat(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<EventStream> {
        let prepared = prepare(up.target, up.base_url, req, SystemTime::now());
        let builder = prepared.map(|signed| {
            let accept = if signed.url.ends_with("/converse") {
                "application/json"
            } else {
                EVENT_STREAM_CONTENT_TYPE
            };
            let mut builder = up.post_json(&signed.url).header(ACCEPT, accept);
            for (name, value) in signed.headers {
                builder = builder.header(name, value);
            }
            builder.body(signed.body)
        });
        Box::pin(async move {
            let resp = send(builder?).await?;
            if is_json_answer(&resp) {
                return Ok(translate_json(resp, None, parse_converse));
            }
            Ok(translate_event_stream(resp.bytes_stream()))
        })
    }
}

/// A Converse request ready to send: URL, JSON body and the SigV4 headers for exactly these.
#[derive(Debug, Clone)]
pub struct SignedRequest {
    /// `{base}/model/{modelId}/converse-stream` (`…/converse` for a non-streaming client),
    /// `modelId` URI-encoded.
    pub url: String,
    /// The Converse JSON body.
    pub body: Vec<u8>,
    /// `authorization`, `x-amz-date` and, with a session token, `x-amz-security-token`
    /// (the credentials are marked sensitive).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// Builds and signs the `ConverseStream` call of `req` for `target` at `time` (AWS rejects a
/// request whose `x-amz-date` is more than 5 minutes off its clock — AWS IAM User Guide,
/// "Elements of an AWS API request signature" — so callers pass `SystemTime::now()`).
/// `base_url` is the worker's resolved base URL; empty means the regional endpoint.
pub fn prepare(
    target: &TargetConfig,
    base_url: &str,
    req: &ChatRequest,
    time: SystemTime,
) -> Result<SignedRequest, ErrorInfo> {
    let aws = target.aws.as_ref().ok_or_else(|| {
        ErrorInfo::new(
            ErrorClass::Internal,
            format!("bedrock target `{}` has no aws settings", target.id),
        )
    })?;
    let base = if base_url.is_empty() {
        default_base_url(&aws.region)
    } else {
        base_url.to_owned()
    };
    let mut url = converse_stream_url(&base, &target.upstream_model);
    if !req.stream {
        // `Converse` (Amazon Bedrock API Reference, "Converse"): same body, one JSON answer.
        url.truncate(url.len() - "-stream".len());
    }
    let body = build_request(req)?.to_string().into_bytes();
    let headers = sigv4_headers(
        SIGNING_SERVICE,
        "POST",
        &url,
        &[("content-type", "application/json")],
        &body,
        aws,
        time,
    )?;
    Ok(SignedRequest { url, body, headers })
}

/// `https://bedrock-runtime.{region}.amazonaws.com`, the Bedrock runtime endpoint of a
/// commercial region (AWS General Reference, "Amazon Bedrock endpoints and quotas"); other
/// partitions (e.g. China, `amazonaws.com.cn`) need an explicit `base_url`.
pub fn default_base_url(region: &str) -> String {
    format!("https://bedrock-runtime.{region}.amazonaws.com")
}

/// `{base_url}/model/{modelId}/converse-stream` (Amazon Bedrock API Reference, "ConverseStream"
/// → Request Syntax), with `modelId` encoded by [`encode_path_segment`].
pub fn converse_stream_url(base_url: &str, model_id: &str) -> String {
    let base = base_url.trim_end_matches('/');
    format!(
        "{base}/model/{}/converse-stream",
        encode_path_segment(model_id)
    )
}

/// Percent-encodes every byte except the RFC 3986 unreserved characters `A-Z a-z 0-9 - _ . ~`
/// (upper-case hex), as SigV4 requires for URI path segments (AWS IAM User Guide, "Create a
/// signed AWS API request" → canonical URI). A model id therefore stays one path segment.
pub fn encode_path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The SigV4 headers for one request (AWS IAM User Guide, "AWS Signature Version 4 for API
/// requests"), computed by `aws-sigv4` with its default settings (double URI encoding of the
/// path, path normalisation, payload hash of `body`, session token included in the signature).
/// `headers` are the request headers to sign besides `host` (taken from `url`) and
/// `x-amz-date`; they must be sent unchanged. Errors: `internal` for a URL without a host,
/// `auth` when the credentials cannot be used.
pub fn sigv4_headers(
    service: &str,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    aws: &AwsTarget,
    time: SystemTime,
) -> Result<Vec<(HeaderName, HeaderValue)>, ErrorInfo> {
    // The signer needs a host (it derives the `host` header from the URL).
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| ErrorInfo::new(ErrorClass::Internal, format!("bad upstream URL: {e}")))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(ErrorInfo::new(
            ErrorClass::Internal,
            "bad upstream URL: no host",
        ));
    }
    let auth_err = |e: &dyn std::fmt::Display| {
        ErrorInfo::new(
            ErrorClass::Auth,
            format!("cannot SigV4-sign the request: {e}"),
        )
    };
    let identity = Credentials::new(
        aws.access_key_id.expose(),
        aws.secret_access_key.expose(),
        aws.session_token.as_ref().map(|t| t.expose().to_owned()),
        None,
        "switchyard-config",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&aws.region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| auth_err(&e))?
        .into();
    let signable = SignableRequest::new(
        method,
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| auth_err(&e))?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|e| auth_err(&e))?
        .into_parts();
    let (signed, _query) = instructions.into_parts();
    signed
        .into_iter()
        .map(|h| {
            let name = HeaderName::from_bytes(h.name().as_bytes()).map_err(|e| auth_err(&e))?;
            let mut value = HeaderValue::from_str(h.value()).map_err(|e| auth_err(&e))?;
            value.set_sensitive(h.sensitive() || name == reqwest::header::AUTHORIZATION);
            Ok((name, value))
        })
        .collect()
}

/// Sends the signed request; a non-2xx answer becomes an error classified by
/// [`classify_http_error`] (reading at most [`MAX_ERROR_BODY`](crate::provider::MAX_ERROR_BODY) bytes), a transport failure a
/// `network` / `timeout` error.
async fn send(builder: reqwest::RequestBuilder) -> Result<reqwest::Response, ErrorInfo> {
    let resp = builder
        .send()
        .await
        .map_err(|e| classify_transport_error(&e))?;
    crate::provider::check_status(resp, classify_http_error).await
}

/// The bare error shape name of an AWS error code (see
/// [`crate::providers::classify::sanitize_shape`]), e.g.
/// `ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/` → `ThrottlingException`.
pub fn sanitize_error_code(code: &str) -> &str {
    crate::providers::classify::sanitize_shape(code)
}

/// Classifies a Bedrock HTTP error answer. The shape name comes from `x-amzn-ErrorType`, else
/// the body's `__type` / `code`; the message from the body's `message` / `Message`. Shapes
/// (Amazon Bedrock API Reference, "ConverseStream" → Errors, and "Common Errors") are mapped by
/// [`exception_class`]; an unknown or missing shape falls back to the status (the shared
/// [`crate::providers::classify::http_error`]). `Retry-After` is honoured when present (Bedrock
/// normally sends none).
pub fn classify_http_error(status: u16, headers: &HeaderMap, body: &[u8]) -> ErrorInfo {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let shape = headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            let v = parsed.as_ref()?;
            ["__type", "code"]
                .iter()
                .find_map(|k| v.get(*k).and_then(Value::as_str))
                .map(str::to_owned)
        });
    crate::providers::classify::http_error(status, headers, body, shape.as_deref())
}

/// The error class of a Bedrock error shape or stream exception, matched case-insensitively (HTTP
/// errors name `ThrottlingException`, stream frames `throttlingException`); `None` if unknown.
///
/// Amazon Bedrock API Reference ("ConverseStream" → Errors, "ConverseStreamOutput", "Common
/// Errors"): throttling (429) → `rate_limited`; `ServiceQuotaExceededException` → `rate_limited`
/// (a quota of this account: another target may have room); `ServiceUnavailableException` (503)
/// and `ModelNotReadyException` (429, "not ready to serve inference requests") → `overloaded`;
/// `ModelTimeoutException` (408) → `timeout`; `InternalServerException` (500), `ModelErrorException`
/// (424), `ModelStreamErrorException` (424) → `upstream_5xx`; `ValidationException` (400) →
/// `invalid_request` or `context_length_exceeded`; `AccessDeniedException` (403) → `permission`;
/// the SigV4 / credential errors of the AWS common errors (`UnrecognizedClientException`,
/// `InvalidSignatureException`, `IncompleteSignature`, `ExpiredTokenException`,
/// `MissingAuthenticationToken`, `InvalidClientTokenId`) → `auth`; `ResourceNotFoundException`
/// (404) → `not_found`. The table lives in the shared [`crate::providers::classify`].
pub fn exception_class(shape: &str, message: &str) -> Option<ErrorClass> {
    crate::providers::classify::named_class(shape, message)
}

use crate::providers::shared::protocol;

mod request;
pub use request::build_request;

type Item = Result<FrameBody, ErrorInfo>;

/// The string value of event-stream header `name`, if present and a string.
fn header_str<'a>(frame: &'a Frame, name: &str) -> Option<&'a str> {
    frame
        .headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| match h.value() {
            FrameHeaderValue::String(s) => Some(s.as_str()),
            _ => None,
        })
}

/// A stream `exception` frame (`:exception-type`, the `ConverseStreamOutput` exception members of
/// the Amazon Bedrock API Reference) or generic `error` frame (`:error-code`; AWS SDKs, "Event
/// stream encoding") → a classified error (see [`exception_class`]; unknown names are
/// `upstream_5xx`).
pub fn stream_exception(name: &str, message: &str) -> ErrorInfo {
    crate::providers::classify::named_stream_error(name, message)
}

/// Reads a `Converse` answer (Amazon Bedrock API Reference, "Converse" → Response Syntax):
/// `output.message.content[]` `text` blocks coalesced and `toolUse` blocks (`toolUseId`, `name`,
/// `input` serialised) as tool calls, `stopReason` ([`finish_reason`]), `usage` ([`parse_usage`]).
pub fn parse_converse(v: &Value) -> Result<Answer, ErrorInfo> {
    let blocks = v
        .pointer("/output/message/content")
        .and_then(Value::as_array)
        .ok_or_else(|| protocol("Converse answer has no `output.message.content`"))?;
    let mut answer = Answer::default();
    for b in blocks {
        if let Some(t) = b.get("text").and_then(Value::as_str) {
            answer.text.push_str(t);
        } else if let Some(tu) = b.get("toolUse") {
            let s = |k: &str| tu.get(k).and_then(Value::as_str).map(str::to_owned);
            let input = tu
                .get("input")
                .map_or_else(|| "{}".to_owned(), Value::to_string);
            answer.tool_calls.push((s("toolUseId"), s("name"), input));
        }
    }
    answer.usage = v.get("usage").map(parse_usage);
    answer.finish_reason = v
        .get("stopReason")
        .and_then(Value::as_str)
        .map_or(FinishReason::Stop, finish_reason);
    Ok(answer)
}

/// Bedrock `stopReason` → OpenAI `finish_reason` (Amazon Bedrock API Reference,
/// "MessageStopEvent"): `end_turn` / `stop_sequence` → `stop`; `max_tokens` and
/// `model_context_window_exceeded` → `length`; `tool_use` → `tool_calls`; `guardrail_intervened`
/// / `content_filtered` → `content_filter`; `malformed_model_output`, `malformed_tool_use` and
/// unknown reasons → `stop`.
pub fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "guardrail_intervened" | "content_filtered" => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    }
}

/// Bedrock `TokenUsage` → normalised usage.
///
/// The API reference ("TokenUsage") only says `inputTokens` is "the number of tokens sent in the
/// request to the model" and `totalTokens` "the total of input tokens and tokens generated".
/// Bedrock's quota burndown formula ("Quotas for Amazon Bedrock": `InputTokenCount +
/// CacheWriteInputTokens + …`) and observed responses show `inputTokens` *excludes* cache reads
/// and writes, with `totalTokens = inputTokens + outputTokens + cacheReadInputTokens +
/// cacheWriteInputTokens`; so `prompt_tokens = inputTokens + cacheRead + cacheWrite`. Should a
/// model report `inputTokens` inclusive instead — recognisable by `totalTokens == inputTokens +
/// outputTokens` while the cache counts are non-zero — `inputTokens` is taken as is.
/// Reasoning is not reported separately (`reasoning_tokens` 0).
pub fn parse_usage(u: &Value) -> Usage {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let (input, output) = (n("inputTokens"), n("outputTokens"));
    let (read, write) = (n("cacheReadInputTokens"), n("cacheWriteInputTokens"));
    let total = u.get("totalTokens").and_then(Value::as_u64);
    let inclusive = read + write > 0 && total == Some(input + output);
    let prompt = if inclusive {
        input
    } else {
        input + read + write
    };
    Usage {
        prompt_tokens: prompt,
        cached_tokens: read,
        cache_write_tokens: write,
        completion_tokens: output,
        reasoning_tokens: 0,
        ..Default::default()
    }
}

/// ConverseStream frames → normalised events: `Text`, `ToolCall` (start with id and name, then
/// argument fragments), then after `metadata` one `Usage` and `End`.
#[derive(Debug, Default)]
struct ConverseTranslator {
    /// From `messageStop.stopReason`.
    finish: Option<FinishReason>,
    /// Content block index → (tool index, whether any argument piece was sent).
    tools: HashMap<u64, (u32, bool)>,
    /// Next tool index (counts only `toolUse` blocks, from 0).
    next_tool: u32,
}

fn tool_frame(index: u32, id: Option<String>, name: Option<String>, arguments: String) -> Item {
    Ok(FrameBody::ToolCall {
        index,
        id,
        name,
        arguments,
    })
}

impl ConverseTranslator {
    /// Handles one frame; returns true when the stream is finished (after `metadata` or an error).
    fn on_frame(&mut self, frame: &Frame, out: &mut VecDeque<Item>) -> bool {
        self.frame(frame, out).unwrap_or_else(|e| {
            out.push_back(Err(e));
            true
        })
    }

    fn frame(&mut self, frame: &Frame, out: &mut VecDeque<Item>) -> Result<bool, ErrorInfo> {
        match header_str(frame, ":message-type").unwrap_or("event") {
            "event" => {}
            "exception" => {
                let name = header_str(frame, ":exception-type").unwrap_or("unknownException");
                let payload: Option<Value> = serde_json::from_slice(frame.payload()).ok();
                let message = payload
                    .as_ref()
                    .and_then(|v| v.get("message").or_else(|| v.get("Message")))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| String::from_utf8_lossy(frame.payload()).into_owned());
                return Err(stream_exception(name, &message));
            }
            "error" => {
                let code = header_str(frame, ":error-code").unwrap_or("unknownError");
                let message = header_str(frame, ":error-message").unwrap_or("");
                return Err(stream_exception(code, message));
            }
            other => {
                return Err(protocol(format!(
                    "unknown event-stream :message-type `{other}`"
                )));
            }
        }
        let kind = header_str(frame, ":event-type")
            .ok_or_else(|| protocol("event-stream event without :event-type"))?;
        let data: Value = serde_json::from_slice(frame.payload())
            .map_err(|e| protocol(format!("unparsable JSON in `{kind}` event: {e}")))?;
        let at = data.get("contentBlockIndex").and_then(Value::as_u64);
        let block_index =
            || at.ok_or_else(|| protocol(format!("`{kind}` event without contentBlockIndex")));
        match kind {
            "contentBlockStart" => {
                if let Some(tool) = data.pointer("/start/toolUse") {
                    let field = |k: &str| {
                        let v = tool.get(k).and_then(Value::as_str).map(str::to_owned);
                        v.ok_or_else(|| protocol(format!("toolUse block start without `{k}`")))
                    };
                    let (id, name) = (field("toolUseId")?, field("name")?);
                    let index = self.next_tool;
                    self.next_tool += 1;
                    self.tools.insert(block_index()?, (index, false));
                    out.push_back(tool_frame(index, Some(id), Some(name), String::new()));
                }
            }
            "contentBlockDelta" => {
                let delta = data.get("delta");
                if let Some(text) = delta.and_then(|d| d.get("text")).and_then(Value::as_str) {
                    if !text.is_empty() {
                        out.push_back(Ok(FrameBody::Text {
                            text: text.to_owned(),
                        }));
                    }
                } else if let Some(tool) = delta.and_then(|d| d.get("toolUse")) {
                    let piece = tool.get("input").and_then(Value::as_str).unwrap_or("");
                    let at = block_index()?;
                    let not_tool = || protocol(format!("toolUse delta for non-tool block {at}"));
                    let (index, sent) = self.tools.get_mut(&at).ok_or_else(not_tool)?;
                    if !piece.is_empty() {
                        *sent = true;
                        out.push_back(tool_frame(*index, None, None, piece.to_owned()));
                    }
                }
                // reasoningContent, citation, image, … deltas: not forwarded.
            }
            "contentBlockStop" => {
                // A tool called without arguments still needs valid JSON arguments.
                if let Some((index, sent @ false)) = at.and_then(|at| self.tools.get_mut(&at)) {
                    *sent = true;
                    out.push_back(tool_frame(*index, None, None, "{}".into()));
                }
            }
            "messageStop" => {
                let reason = data.get("stopReason").and_then(Value::as_str);
                let reason = reason.ok_or_else(|| protocol("messageStop without stopReason"))?;
                self.finish = Some(finish_reason(reason));
            }
            "metadata" => {
                let finish_reason = self
                    .finish
                    .ok_or_else(|| protocol("metadata event before messageStop"))?;
                if let Some(u) = data.get("usage").filter(|u| u.is_object()) {
                    out.push_back(Ok(FrameBody::Usage {
                        usage: parse_usage(u),
                    }));
                }
                if let Some(ms) = data.pointer("/metrics/latencyMs").and_then(Value::as_u64) {
                    tracing::debug!(latency_ms = ms, "bedrock reported latency");
                }
                out.push_back(Ok(FrameBody::End { finish_reason }));
                return Ok(true);
            }
            // messageStart (role only) and event types added later are ignored.
            _ => {}
        }
        Ok(false)
    }

    /// The body ended before `metadata`: after `messageStop` that is a complete answer without
    /// usage, before it a truncated one.
    fn on_eof(&mut self, out: &mut VecDeque<Item>) {
        match self.finish {
            Some(finish_reason) => out.push_back(Ok(FrameBody::End { finish_reason })),
            None => out.push_back(Err(protocol("upstream stream ended before messageStop"))),
        }
    }
}

/// Decoder state of one response body.
struct Decoding<S> {
    body: std::pin::Pin<Box<S>>,
    buf: BytesMut,
    decoder: MessageFrameDecoder,
    /// The decoder holds the prelude of a frame whose rest has not arrived.
    mid_frame: bool,
    translator: ConverseTranslator,
    pending: VecDeque<Item>,
    done: bool,
}

/// Streams a successful `ConverseStream` body (a stream of byte chunks) through the event-stream
/// frame decoder and the Converse translator. After the first error the stream ends; a transport
/// failure is `network`, bad framing (CRC mismatch, truncated or oversized frame) `protocol`.
pub fn translate_event_stream<S, E>(body: S) -> EventStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let state = Decoding {
        body: Box::pin(body),
        buf: BytesMut::new(),
        decoder: MessageFrameDecoder::new(),
        mid_frame: false,
        translator: ConverseTranslator::default(),
        pending: VecDeque::new(),
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(item) = st.pending.pop_front() {
                if item.is_err() {
                    st.pending.clear();
                    st.done = true;
                }
                return Some((item, st));
            }
            if st.done {
                return None;
            }
            let before = st.buf.len();
            match st.decoder.decode_frame(&mut st.buf) {
                Ok(DecodedFrame::Complete(frame)) => {
                    st.mid_frame = false;
                    st.done = st.translator.on_frame(&frame, &mut st.pending);
                    continue;
                }
                Ok(DecodedFrame::Incomplete) => {
                    st.mid_frame |= st.buf.len() < before;
                }
                Err(e) => {
                    st.pending
                        .push_back(Err(protocol(format!("bad event-stream frame: {e}"))));
                    continue;
                }
            }
            if st.buf.len() > MAX_FRAME_BYTES {
                st.pending.push_back(Err(protocol(format!(
                    "event-stream frame larger than {MAX_FRAME_BYTES} bytes"
                ))));
                continue;
            }
            match st.body.next().await {
                Some(Ok(chunk)) => st.buf.extend_from_slice(&chunk),
                Some(Err(e)) => st.pending.push_back(Err(ErrorInfo::new(
                    ErrorClass::Network,
                    format!("upstream stream broke: {e}"),
                ))),
                None if st.mid_frame || !st.buf.is_empty() => {
                    st.pending.push_back(Err(protocol(
                        "upstream stream ended inside an event-stream frame",
                    )));
                }
                None => {
                    st.translator.on_eof(&mut st.pending);
                    st.done = true;
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests;
