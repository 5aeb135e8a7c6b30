//! The one place errors become HTTP responses, in OpenAI's error shape
//! `{"error":{"message","type","param","code"}}` (OpenAI API reference, "Error codes").

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
}

impl ApiError {
    /// A 400 `invalid_request_error` naming `param`.
    pub fn invalid(message: impl Into<String>, param: Option<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
            retry_after_s: None,
        }
    }

    /// 404 for a model or route nobody configured (OpenAI's `model_not_found`).
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist or you do not have access to it."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
            retry_after_s: None,
        }
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

/// Maps an error class to (HTTP status, OpenAI `type`, `code`). Upstream credential failures are the
/// gateway operator's problem, not the caller's, so they are 502 rather than 401/403: an SDK seeing
/// 401 would wrongly blame the caller's key.
fn class_to_http(class: ErrorClass) -> (StatusCode, &'static str, Option<&'static str>) {
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
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            resp.headers_mut().insert("retry-after", v);
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
