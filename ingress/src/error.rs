//! The one place errors become HTTP responses, in OpenAI's error shape
//! `{"error":{"message","type","param","code"}}` (OpenAI API reference, "Error codes") or, for the
//! Anthropic front door, Anthropic's `{"type":"error","error":{"type","message"}}` (Anthropic API
//! reference, "Errors").

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use switchyard_schemas::{ErrorClass, ErrorInfo};

/// An error answered to the client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI `type`, e.g. `invalid_request_error`.
    pub kind: &'static str,
    /// Offending parameter, e.g. `messages[0].role`.
    pub param: Option<String>,
    /// Machine code, e.g. `model_not_found`.
    pub code: Option<&'static str>,
    /// `Retry-After` to send, seconds.
    pub retry_after_s: Option<u64>,
    /// The request id when the request was admitted (sent as `x-request-id`, so a failed
    /// request can be found in the ledger and the logs).
    pub request_id: Option<uuid::Uuid>,
}

impl ApiError {
    /// An error of HTTP `status`, OpenAI `type` `kind` and machine `code` (a `&'static str` or
    /// `None`), with no `param` and no `Retry-After` (add them with [`Self::with_param`] and
    /// [`Self::retry_after`]).
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: impl Into<Option<&'static str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: code.into(),
            retry_after_s: None,
            request_id: None,
        }
    }

    /// The same error naming the offending parameter (e.g. `messages[0].role`).
    #[must_use]
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// The same error with `Retry-After: seconds`.
    #[must_use]
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// A 503 `service_unavailable_error` with `code` and `Retry-After: 1`: a transient refusal
    /// (overload, a store that is down) the client should retry shortly.
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable_error",
            code,
            message,
        )
        .retry_after(1)
    }

    /// A 400 `invalid_request_error` naming `param`.
    pub fn invalid(message: impl Into<String>, param: Option<String>) -> Self {
        Self {
            param,
            ..Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                message,
            )
        }
    }

    /// A 400 `invalid_request_error` about `param`, worded like OpenAI's:
    /// `Invalid '<param>': <problem>`.
    pub fn invalid_field(param: impl Into<String>, problem: impl std::fmt::Display) -> Self {
        let param = param.into();
        Self::invalid(format!("Invalid '{param}': {problem}"), Some(param))
    }

    /// The 400 for an OpenAI-shaped body that did not deserialize, worded like OpenAI's:
    /// unparsable JSON, a body of the wrong shape, or the offending field named by its JSON path
    /// (`messages[0].role`) in the message and as `param`.
    pub fn bad_body(e: serde_path_to_error::Error<serde_json::Error>) -> Self {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            Self::invalid(
                format!("We could not parse the JSON body of your request: {inner}"),
                None,
            )
        } else if path == "." {
            Self::invalid(format!("Invalid request body: {inner}"), None)
        } else {
            Self::invalid(format!("Invalid value for `{path}`: {inner}"), Some(path))
        }
    }

    /// The 400 for body field `name` that the front door does not take, naming it as `param`
    /// (cut, see [`switchyard_schemas::input::echo`]): a field of `unsupported` is one the
    /// protocol defines but Switchyard does not serve yet; any other is worded by `unknown`
    /// (each API's own wording for an unknown field).
    pub fn extra_field(
        name: &str,
        unsupported: &[&str],
        unknown: impl FnOnce(&str) -> String,
    ) -> Self {
        let shown = switchyard_schemas::input::echo(name);
        let message = if unsupported.contains(&name) {
            format!("The parameter `{name}` is not supported by Switchyard yet.")
        } else {
            unknown(&shown)
        };
        Self::invalid(message, Some(shown.into_owned()))
    }

    /// A 500 `server_error`: `what` could not be encoded as JSON. Sent instead of a body with
    /// the part left empty or `null`.
    pub fn encoding(what: &str, e: &serde_json::Error) -> Self {
        ErrorInfo::new(ErrorClass::Internal, format!("encoding {what}: {e}")).into()
    }

    /// A 403 `invalid_request_error` with code `permission_denied`: the caller may not reach
    /// what `param` names (no `param` when the route itself is out of reach).
    pub fn permission_denied(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            param: param.map(str::to_owned),
            ..Self::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                "permission_denied",
                message,
            )
        }
    }

    /// 404 for a model or route nobody configured (OpenAI's `model_not_found`); a long model
    /// name is cut (see [`switchyard_schemas::input::echo`]).
    pub fn model_not_found(model: &str) -> Self {
        let model = switchyard_schemas::input::echo(model);
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("The model `{model}` does not exist or you do not have access to it."),
        )
        .with_param("model")
    }

    /// Anthropic's error `type` for this error, from its HTTP status (Anthropic API reference,
    /// "Errors"): 400 `invalid_request_error` (also other 4xx), 401 `authentication_error`, 403
    /// `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429
    /// `rate_limit_error`, 503 `overloaded_error` (Anthropic's own 529), other 5xx `api_error`.
    /// The status itself comes from [`class_to_http`], so both front doors agree on it.
    pub fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The Anthropic JSON body `{"type":"error","error":{"type","message"}}` (Anthropic API
    /// reference, "Errors", error shapes); also the `data` of a stream's `error` event.
    pub fn anthropic_body(&self) -> serde_json::Value {
        serde_json::json!({"type": "error", "error": {
            "type": self.anthropic_type(),
            "message": self.message,
        }})
    }

    /// The response in Anthropic's error shape, with the same status and `Retry-After` — except
    /// an overloaded upstream (class `overloaded`: Anthropic's 529, or another provider's
    /// overload), which is Anthropic's own 529 `overloaded_error` here (the SDKs raise
    /// `OverloadedError` for 529 only); the OpenAI door keeps 503 for it.
    pub fn into_anthropic_response(mut self) -> Response {
        if self.code == Some("overloaded") {
            self.status = StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        }
        let body = axum::Json(self.anthropic_body());
        self.with_body(body)
    }

    /// `status` + `body` + `Retry-After` when set.
    fn with_body(self, body: impl IntoResponse) -> Response {
        let mut resp = (self.status, body).into_response();
        if let Some(s) = self.retry_after_s
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            resp.headers_mut().insert("retry-after", v);
        }
        if let Some(id) = self.request_id
            && let Ok(v) = HeaderValue::from_str(&id.to_string())
        {
            resp.headers_mut().insert("x-request-id", v);
        }
        resp
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl From<switchyard_schemas::input::Invalid> for ApiError {
    fn from(e: switchyard_schemas::input::Invalid) -> Self {
        Self::invalid_field(e.param, e.message)
    }
}

/// Maps an error class to (HTTP status, OpenAI `type`, `code`). Upstream credential failures are the
/// gateway operator's problem, not the caller's, so they are 502 rather than 401/403: an SDK seeing
/// 401 would wrongly blame the caller's key.
pub(crate) fn class_to_http(class: ErrorClass) -> (StatusCode, &'static str, Option<&'static str>) {
    use ErrorClass::*;
    match class {
        InvalidRequest => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
        ContextLengthExceeded => (
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("context_length_exceeded"),
        ),
        Auth => (
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            Some("upstream_auth_failed"),
        ),
        Permission => (
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            Some("upstream_permission_denied"),
        ),
        NotFound => (
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
        ),
        RateLimited => (
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            Some("rate_limit_exceeded"),
        ),
        Overloaded => (
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable_error",
            Some("overloaded"),
        ),
        Upstream5xx => (
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            Some("upstream_error"),
        ),
        Timeout => (
            StatusCode::GATEWAY_TIMEOUT,
            "timeout_error",
            Some("timeout"),
        ),
        Network => (
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            Some("upstream_unreachable"),
        ),
        Protocol => (
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            Some("upstream_protocol_error"),
        ),
        NoCapacity => (
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable_error",
            Some("no_capacity"),
        ),
        // 499 is never seen by the departed client; it only shows in logs and metrics.
        Cancelled => (
            StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            "cancelled",
            Some("client_closed_request"),
        ),
        Internal => (StatusCode::INTERNAL_SERVER_ERROR, "server_error", None),
    }
}

impl From<ErrorInfo> for ApiError {
    fn from(e: ErrorInfo) -> Self {
        let (status, kind, code) = class_to_http(e.class);
        Self {
            status,
            message: e.message,
            kind,
            param: e.param,
            code,
            retry_after_s: e.retry_after_ms.map(|ms| ms.div_ceil(1000)),
            request_id: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = axum::Json(self.body());
        self.with_body(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn an_encoding_failure_is_a_500() {
        let cause = serde_json::from_str::<serde_json::Value>("{").err();
        let e = ApiError::encoding("usage", cause.as_ref().unwrap());
        assert_eq!(
            (e.status, e.kind, e.code),
            (StatusCode::INTERNAL_SERVER_ERROR, "server_error", None)
        );
        assert_eq!(
            e.message,
            "encoding usage: EOF while parsing an object at line 1 column 1"
        );
    }

    #[test]
    fn shape_and_retry_after() {
        let e: ApiError = ErrorInfo::new(ErrorClass::RateLimited, "slow down")
            .with_retry_after_ms(Some(1500))
            .into();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.retry_after_s, Some(2));
        assert_eq!(
            e.body(),
            serde_json::json!({"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}})
        );
    }

    #[test]
    fn anthropic_types_follow_the_status() {
        let kind = |class| ApiError::from(ErrorInfo::new(class, "m")).anthropic_type();
        assert_eq!(kind(ErrorClass::InvalidRequest), "invalid_request_error");
        assert_eq!(kind(ErrorClass::NotFound), "not_found_error");
        assert_eq!(kind(ErrorClass::RateLimited), "rate_limit_error");
        assert_eq!(kind(ErrorClass::Overloaded), "overloaded_error");
        assert_eq!(kind(ErrorClass::NoCapacity), "overloaded_error");
        assert_eq!(kind(ErrorClass::Upstream5xx), "api_error");
        assert_eq!(kind(ErrorClass::Timeout), "api_error");
        assert_eq!(kind(ErrorClass::Internal), "api_error");
        assert_eq!(kind(ErrorClass::Cancelled), "invalid_request_error");
        let e = ApiError::model_not_found("x/y");
        assert_eq!(
            e.anthropic_body(),
            serde_json::json!({"type":"error","error":{"type":"not_found_error","message":e.message}})
        );
    }
}
