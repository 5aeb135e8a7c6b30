//! The one classifier of provider error objects: HTTP error bodies and errors inside a 200 stream
//! (or a 200 JSON body), for every provider adapter.
//!
//! Providers name a failure in different fields, and servers that copy one provider's shape fill
//! them differently, so every field is read:
//!
//! * OpenAI (API reference, "Error codes"; "Streaming"): `{"error":{"message","type","param",
//!   "code"}}` — `type` is coarse (`invalid_request_error` for 400, 401 and 404 alike), `code` a
//!   precise string (`context_length_exceeded`, `rate_limit_exceeded`, `insufficient_quota`,
//!   `invalid_api_key`, `model_not_found`) or null. OpenAI-compatible servers (vLLM's
//!   `ErrorResponse`, LiteLLM) put the HTTP status in `code` as a number (`400`) or a string
//!   (`"400"`), and an SDK exception name in `type` (`BadRequestError`), sometimes at the top level
//!   (`{"object":"error","message","type","code"}`).
//! * Azure OpenAI gateway errors: `{"error":{"code":"429","message"}}`.
//! * Anthropic (API reference, "Errors"): `{"type":"error","error":{"type","message"}}`, `type` one
//!   of `invalid_request_error`, `authentication_error`, `permission_error`, `not_found_error`,
//!   `request_too_large`, `rate_limit_error`, `api_error`, `overloaded_error`.
//! * Google (Gemini API reference, "API errors"): `{"error":{"code":400,"message","status":
//!   "INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"},{"retryDelay":"37s"}]}}`.
//! * AWS (Amazon Bedrock API Reference, "Common Errors"; Smithy restJson1): the shape name in
//!   `x-amzn-ErrorType`, `__type` or `code` (`ThrottlingException`), the message in `message` /
//!   `Message`; Bedrock passes the shape it found as `shape`.
//!
//! Names are compared normalised (ASCII letters and digits, lower case, a trailing `exception` or
//! `error` dropped: `BadRequestError`, `bad_request` and `BadRequestException` are one name).
//! Precedence: a precise name (`context_length_exceeded`, `RESOURCE_EXHAUSTED`, `BadRequestError`)
//! over a numeric status, over a coarse name (`invalid_request_error`, `api_error`,
//! `server_error`), over `upstream_5xx`. For an HTTP error the HTTP status decides, refined by a
//! precise name only when the status alone says no more than "bad request" (400, 413, 422 and
//! unlisted 4xx): a Google 400 `API_KEY_INVALID` is `auth`. An `invalid_request` whose message
//! says the prompt does not fit is `context_length_exceeded`.

use reqwest::header::HeaderMap;
use serde_json::Value;
use switchyard_schemas::secret::redact_credentials;
use switchyard_schemas::{ErrorClass, ErrorInfo};

/// How much a name tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Weight {
    /// Names one failure (`context_length_exceeded`, `RESOURCE_EXHAUSTED`).
    Precise,
    /// Shared by several statuses (`invalid_request_error`, `api_error`).
    Coarse,
}

/// The class a normalised name stands for (see the module docs), with its weight.
fn name_class(norm: &str) -> Option<(ErrorClass, Weight)> {
    use ErrorClass::*;
    use Weight::*;
    Some(match norm {
        "contextlengthexceeded" | "contextwindowexceeded" => (ContextLengthExceeded, Precise),
        "ratelimitexceeded"
        | "ratelimit"
        | "ratelimited"
        | "insufficientquota"
        | "resourceexhausted"
        | "throttling"
        | "throttled"
        | "servicequotaexceeded"
        | "toomanyrequests"
        | "quotaexceeded" => (RateLimited, Precise),
        "overloaded" | "serveroverloaded" | "engineoverloaded" | "unavailable"
        | "serviceunavailable" | "modelnotready" => (Overloaded, Precise),
        "timeout" | "apitimeout" | "deadlineexceeded" | "modeltimeout" | "requesttimeout"
        | "gatewaytimeout" => (Timeout, Precise),
        "badrequest"
        | "invalidargument"
        | "failedprecondition"
        | "outofrange"
        | "validation"
        | "conflict"
        | "unprocessableentity"
        | "requesttoolarge" => (InvalidRequest, Precise),
        "authentication"
        | "unauthenticated"
        | "unauthorized"
        | "invalidapikey"
        | "apikeyinvalid"
        | "unrecognizedclient"
        | "invalidsignature"
        | "incompletesignature"
        | "expiredtoken"
        | "missingauthenticationtoken"
        | "invalidclienttokenid"
        | "signaturedoesnotmatch" => (Auth, Precise),
        "permission" | "permissiondenied" | "accessdenied" | "forbidden" => (Permission, Precise),
        "notfound" | "resourcenotfound" | "modelnotfound" | "deploymentnotfound" => {
            (NotFound, Precise)
        }
        "internalserver" | "internalfailure" | "internal" | "modelerror" | "modelstreamerror"
        | "dataloss" => (Upstream5xx, Precise),
        "invalidrequest" => (InvalidRequest, Coarse),
        "api" | "server" | "unknown" => (Upstream5xx, Coarse),
        _ => return None,
    })
}

/// `BadRequestError` / `bad_request_error` / `BadRequestException` → `badrequest`.
fn normalise(name: &str) -> String {
    let s: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    for suffix in ["exception", "error"] {
        if let Some(stem) = s.strip_suffix(suffix)
            && !stem.is_empty()
        {
            return stem.to_owned();
        }
    }
    s
}

/// The class an HTTP status stands for (RFC 9110 semantics; Anthropic's 529 is "overloaded").
pub fn status_class(status: u16) -> ErrorClass {
    match status {
        401 => ErrorClass::Auth,
        403 => ErrorClass::Permission,
        404 => ErrorClass::NotFound,
        408 => ErrorClass::Timeout,
        429 => ErrorClass::RateLimited,
        503 | 529 => ErrorClass::Overloaded,
        500..=599 => ErrorClass::Upstream5xx,
        _ => ErrorClass::InvalidRequest,
    }
}

/// Whether a message says the prompt does not fit the model's context window (OpenAI "maximum
/// context length", Anthropic "prompt is too long", Gemini "exceeds the maximum number of tokens",
/// Bedrock "Input is too long for requested model.").
pub fn is_context_overflow(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    [
        "context length",
        "context window",
        "prompt is too long",
        "exceeds the maximum number of tokens",
        "input is too long",
        "too many input tokens",
    ]
    .iter()
    .any(|p| lower.contains(p))
}

/// What one provider error object says, read from every field providers use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ErrorFacts {
    /// Names in precedence order (Google `details[].reason`, `code`, `type`, `status`, `__type`),
    /// as sent.
    pub names: Vec<String>,
    /// HTTP-like statuses found in `code` / `status` (numbers or digit strings), 100–599.
    pub statuses: Vec<u16>,
    /// The human-readable message, if any.
    pub message: Option<String>,
    /// Google's `google.rpc.RetryInfo` `retryDelay`, in ms.
    pub retry_delay_ms: Option<u64>,
    /// The request parameter at fault (OpenAI's `param`), if named.
    pub param: Option<String>,
}

/// Reads an error body or event: `{"error":{…}}`, `{"error":"text"}` or a top-level error object.
pub fn read_facts(body: &Value) -> ErrorFacts {
    let mut f = ErrorFacts::default();
    let err = match body.get("error") {
        Some(e) if e.is_object() => e,
        Some(Value::String(s)) => {
            f.message = Some(s.clone());
            body
        }
        _ => body,
    };
    let details = err.get("details").and_then(Value::as_array);
    for d in details.into_iter().flatten() {
        if let Some(r) = d.get("reason").and_then(Value::as_str) {
            f.names.push(r.to_owned());
        }
        if let Some(secs) = d
            .get("retryDelay")
            .and_then(Value::as_str)
            .and_then(|s| s.strip_suffix('s'))
            .and_then(|s| s.parse::<f64>().ok())
        {
            f.retry_delay_ms = Some(delay_ms_from_secs(secs));
        }
    }
    let take = |v: Option<&Value>, f: &mut ErrorFacts| match v {
        Some(Value::String(s)) => match s.trim().parse::<u16>() {
            Ok(n) if (100..=599).contains(&n) => f.statuses.push(n),
            _ if !s.is_empty() => f.names.push(s.clone()),
            _ => {}
        },
        Some(Value::Number(n)) => {
            if let Some(n) = n.as_u64().filter(|n| (100..=599).contains(n)) {
                f.statuses.push(n as u16);
            }
        }
        _ => {}
    };
    for key in ["code", "type", "status", "__type"] {
        take(err.get(key), &mut f);
    }
    if !std::ptr::eq(err, body) {
        for key in ["code", "status"] {
            take(body.get(key), &mut f);
        }
    }
    f.param = err
        .get("param")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .map(str::to_owned);
    if f.message.is_none() {
        f.message = ["message", "Message", "detail"]
            .iter()
            .find_map(|k| err.get(*k).or_else(|| body.get(*k)))
            .and_then(Value::as_str)
            .map(str::to_owned);
    }
    f
}

impl ErrorFacts {
    /// The first name of `weight` that means something, with its class.
    fn named(&self, weight: Weight) -> Option<(ErrorClass, &str)> {
        self.names.iter().find_map(|n| {
            let sane = crate::providers::classify::sanitize_shape(n);
            name_class(&normalise(sane))
                .filter(|(_, w)| *w == weight)
                .map(|(c, _)| (c, n.as_str()))
        })
    }

    /// The class, given the HTTP status of a non-2xx answer (`None` for an error inside a 2xx
    /// answer). See the module docs for the precedence.
    pub fn class(&self, http_status: Option<u16>) -> ErrorClass {
        let precise = self.named(Weight::Precise).map(|(c, _)| c);
        let class = match http_status {
            Some(s) => match status_class(s) {
                ErrorClass::InvalidRequest => precise
                    .filter(|c| *c != ErrorClass::Upstream5xx)
                    .unwrap_or(ErrorClass::InvalidRequest),
                other => other,
            },
            None => precise
                .or_else(|| {
                    self.statuses
                        .iter()
                        .find(|s| (400..=599).contains(*s))
                        .map(|s| status_class(*s))
                })
                .or_else(|| self.named(Weight::Coarse).map(|(c, _)| c))
                .unwrap_or(ErrorClass::Upstream5xx),
        };
        match class {
            ErrorClass::InvalidRequest
                if self.message.as_deref().is_some_and(is_context_overflow) =>
            {
                ErrorClass::ContextLengthExceeded
            }
            c => c,
        }
    }

    /// The name shown in messages: the most telling one, or the numeric status.
    fn label(&self) -> Option<String> {
        self.named(Weight::Precise)
            .or_else(|| self.named(Weight::Coarse))
            .map(|(_, n)| n.to_owned())
            .or_else(|| self.names.first().cloned())
            .or_else(|| self.statuses.first().map(u16::to_string))
    }
}

/// The bare shape name of an AWS error code: a trailing `:<url>` and a leading `<namespace>#` are
/// dropped (Smithy restJson1, "Operation error serialization"), e.g.
/// `aws#ThrottlingException:http://internal.amazon.com/…` → `ThrottlingException`.
pub fn sanitize_shape(code: &str) -> &str {
    let code = code.split(':').next().unwrap_or(code);
    code.rsplit('#').next().unwrap_or(code).trim()
}

/// The class of a precise provider error name (an AWS exception shape such as
/// `ThrottlingException` / `throttlingException`, an OpenAI code, a Google status), refined to
/// `context_length_exceeded` by `message`; `None` for unknown or coarse names.
pub fn named_class(name: &str, message: &str) -> Option<ErrorClass> {
    let facts = ErrorFacts {
        names: vec![name.to_owned()],
        message: Some(message.to_owned()),
        ..ErrorFacts::default()
    };
    facts.named(Weight::Precise)?;
    Some(facts.class(None))
}

/// Classifies a non-success HTTP answer: `body` is the (possibly truncated) error body, `shape`
/// an AWS error shape (Bedrock: `x-amzn-ErrorType`, else the body's `__type` / `code`; it decides
/// when known). The message is
/// `upstream returned HTTP <status>[ <shape>]: <message>`; the wait comes from `Retry-After` /
/// `retry-after-ms`, else Google's `retryDelay`.
pub fn http_error(status: u16, headers: &HeaderMap, body: &[u8], shape: Option<&str>) -> ErrorInfo {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let mut facts = parsed.as_ref().map(read_facts).unwrap_or_default();
    let message = facts
        .message
        .clone()
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned());
    facts.message = Some(message.clone());
    let shape = shape.map(sanitize_shape).filter(|s| !s.is_empty());
    let class = shape
        .and_then(|s| named_class(s, &message))
        .unwrap_or_else(|| facts.class(Some(status)));
    let what = shape.map(|s| format!(" {s}")).unwrap_or_default();
    // Never the raw body of an auth failure (it may echo the credential); other messages with
    // anything shaped like a key redacted, before they reach a client, a log or the ledger.
    let message = if class == ErrorClass::Auth {
        "the upstream refused the target's credentials (check the key configured for it)".into()
    } else {
        redact_credentials(&message)
    };
    let mut e = ErrorInfo::new(
        class,
        format!("upstream returned HTTP {status}{what}: {message}"),
    )
    .with_status(status)
    .with_retry_after_ms(retry_after_ms(headers).or(facts.retry_delay_ms));
    e.param = facts.param;
    e
}

/// Classifies an error sent inside a successful answer (an SSE `data:` event, an Anthropic
/// `event: error`, a Gemini chunk, a 200 JSON body): `upstream stream error[ <name>]: <message>`.
pub fn stream_error(body: &Value) -> ErrorInfo {
    let facts = read_facts(body);
    let class = facts.class(None);
    let label = facts.label().map(|l| format!(" {l}")).unwrap_or_default();
    let message = redact_credentials(facts.message.as_deref().unwrap_or("unknown error"));
    let mut e = ErrorInfo::new(class, format!("upstream stream error{label}: {message}"))
        .with_retry_after_ms(facts.retry_delay_ms);
    e.param = facts.param.clone();
    e
}

/// Classifies a named stream exception (Bedrock's `:exception-type` / `:error-code` frames):
/// unknown names are `upstream_5xx`.
pub fn named_stream_error(name: &str, message: &str) -> ErrorInfo {
    let class = named_class(name, message).unwrap_or(ErrorClass::Upstream5xx);
    let message = redact_credentials(message);
    ErrorInfo::new(class, format!("upstream stream error {name}: {message}"))
}

/// The longest upstream retry delay honoured, ms (1 day): a larger (or infinite) `Retry-After`
/// reads as this, so no timer arithmetic on it can overflow.
pub const MAX_RETRY_AFTER_MS: u64 = 86_400_000;

/// Seconds (possibly fractional, negative, NaN or infinite, as an upstream may send them) as
/// milliseconds in `0..=`[`MAX_RETRY_AFTER_MS`].
pub fn delay_ms_from_secs(secs: f64) -> u64 {
    delay_ms(secs * 1000.0)
}

fn delay_ms(ms: f64) -> u64 {
    if ms.is_nan() {
        return 0;
    }
    // `as` saturates: +inf → u64::MAX, negative → 0.
    (ms as u64).min(MAX_RETRY_AFTER_MS)
}

/// Parses `Retry-After` (delta-seconds; RFC 9110 §10.2.3) and the OpenAI-style `retry-after-ms`
/// header into milliseconds, at most [`MAX_RETRY_AFTER_MS`]. HTTP-date values are not honoured
/// (no provider we target sends them).
pub fn retry_after_ms(headers: &HeaderMap) -> Option<u64> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        return Some(delay_ms(ms));
    }
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(delay_ms_from_secs)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn in_stream(v: Value) -> ErrorClass {
        stream_error(&v).class
    }

    /// FC-07 and its kind: every field that names a 4xx, numeric or string, nested or top level.
    #[test]
    fn in_stream_4xx_by_every_field() {
        use ErrorClass::*;
        let cases = [
            json!({"error":{"message":"bad","type":"invalid_request_error","param":null,"code":400}}),
            json!({"error":{"message":"bad","code":400}}),
            json!({"error":{"message":"bad","code":"400"}}),
            json!({"error":{"message":"bad","type":"BadRequestError"}}),
            json!({"error":{"message":"bad","type":"invalid_request_error"}}),
            json!({"error":{"message":"bad","status":400}}),
            json!({"error":{"message":"bad","code":500,"status":"INVALID_ARGUMENT"}}),
            json!({"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}),
            json!({"type":"error","error":{"type":"invalid_request_error","message":"bad"}}),
            json!({"error":{"message":"bad","type":"server_error","code":400}}),
        ];
        for c in cases {
            assert_eq!(in_stream(c.clone()), InvalidRequest, "{c}");
        }
        let e = stream_error(&json!({"error":{"message":"bad","code":400}}));
        assert_eq!(e.message, "upstream stream error 400: bad");
        assert!(!e.retryable);
        let table = [
            (json!({"error":{"message":"m","code":429}}), RateLimited),
            (json!({"error":{"message":"m","code":"429"}}), RateLimited),
            (
                json!({"error":{"code":"insufficient_quota","type":"insufficient_quota"}}),
                RateLimited,
            ),
            (
                json!({"error":{"message":"m","type":"RateLimitError"}}),
                RateLimited,
            ),
            (json!({"error":{"message":"m","code":401}}), Auth),
            (
                json!({"error":{"message":"m","type":"authentication_error"}}),
                Auth,
            ),
            (
                json!({"error":{"message":"m","code":"invalid_api_key","type":"invalid_request_error"}}),
                Auth,
            ),
            (
                json!({"error":{"message":"m","type":"permission_error"}}),
                Permission,
            ),
            (
                json!({"error":{"message":"m","code":"model_not_found"}}),
                NotFound,
            ),
            (json!({"error":{"message":"m","code":503}}), Overloaded),
            (
                json!({"error":{"message":"m","status":"UNAVAILABLE","code":503}}),
                Overloaded,
            ),
            (
                json!({"type":"error","error":{"type":"overloaded_error","message":"m"}}),
                Overloaded,
            ),
            (json!({"error":{"message":"m","code":500}}), Upstream5xx),
            (
                json!({"error":{"message":"m","type":"server_error","code":null}}),
                Upstream5xx,
            ),
            (json!({"error":{"message":"m"}}), Upstream5xx),
            (json!({"error":"model crashed"}), Upstream5xx),
            (
                json!({"error":{"message":"m","status":"DEADLINE_EXCEEDED","code":500}}),
                Timeout,
            ),
            (
                json!({"error":{"code":"context_length_exceeded","type":"invalid_request_error","message":"m"}}),
                ContextLengthExceeded,
            ),
            (
                json!({"error":{"code":400,"message":"This model's maximum context length is 8192 tokens."}}),
                ContextLengthExceeded,
            ),
            (
                json!({"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens"}}),
                ContextLengthExceeded,
            ),
        ];
        for (v, class) in table {
            assert_eq!(in_stream(v.clone()), class, "{v}");
        }
    }

    #[test]
    fn http_status_decides_refined_by_precise_names() {
        use ErrorClass::*;
        let h = HeaderMap::new();
        let http = |status, body: Value| http_error(status, &h, body.to_string().as_bytes(), None);
        let cases = [
            // OpenAI puts `invalid_request_error` on a 408 too: the status wins.
            (
                408,
                json!({"error":{"type":"invalid_request_error","message":"m"}}),
                Timeout,
            ),
            (
                503,
                json!({"error":{"type":"server_error","message":"m"}}),
                Overloaded,
            ),
            (
                400,
                json!({"error":{"code":400,"message":"m","status":"INVALID_ARGUMENT",
            "details":[{"reason":"API_KEY_INVALID"}]}}),
                Auth,
            ),
            (
                400,
                json!({"error":{"code":"context_length_exceeded","message":"m"}}),
                ContextLengthExceeded,
            ),
            (
                409,
                json!({"error":{"type":"rate_limit_error","message":"m"}}),
                RateLimited,
            ),
            (
                400,
                json!({"error":{"type":"server_error","message":"m"}}),
                InvalidRequest,
            ),
        ];
        for (status, body, class) in cases {
            let what = format!("{status} {body}");
            assert_eq!(http(status, body).class, class, "{what}");
        }
        let e = http_error(
            429,
            &h,
            br#"{"error":{"code":429,"message":"slow","status":"RESOURCE_EXHAUSTED",
            "details":[{"retryDelay":"3s"}]}}"#,
            None,
        );
        assert_eq!(
            (e.class, e.retry_after_ms, e.upstream_status),
            (RateLimited, Some(3000), Some(429))
        );
        assert_eq!(e.message, "upstream returned HTTP 429: slow");
    }

    #[test]
    fn names_are_normalised() {
        for n in [
            "BadRequestError",
            "bad_request",
            "BadRequestException",
            "BAD_REQUEST",
        ] {
            assert_eq!(named_class(n, ""), Some(ErrorClass::InvalidRequest), "{n}");
        }
        assert_eq!(
            named_class("throttlingException", ""),
            Some(ErrorClass::RateLimited)
        );
        assert_eq!(named_class("invalid_request_error", ""), None, "coarse");
        assert_eq!(named_class("Nope", ""), None);
        assert_eq!(
            sanitize_shape("aws#ThrottlingException:http://x"),
            "ThrottlingException"
        );
    }
}
