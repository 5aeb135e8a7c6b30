//! Error classes that routing understands, shared by workers (which classify upstream failures) and
//! ingress (which maps them once to an HTTP status and the OpenAI error shape).

use serde::{Deserialize, Serialize};

/// What kind of failure happened. Ingress decides fallback and the HTTP status from this alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The request itself is wrong (HTTP 400). Never retried, never failed over.
    InvalidRequest,
    /// The prompt does not fit the model's context window (HTTP 400, code `context_length_exceeded`).
    ContextLengthExceeded,
    /// The upstream rejected our credentials (HTTP 401 from the provider).
    Auth,
    /// The credentials lack access to this model or feature (HTTP 403 from the provider).
    Permission,
    /// Unknown model or route (HTTP 404).
    NotFound,
    /// Rate limited upstream or by a Switchyard limit (HTTP 429, may carry Retry-After).
    RateLimited,
    /// The provider says it is overloaded (Anthropic 529, HTTP 503).
    Overloaded,
    /// The provider failed with a 5xx.
    Upstream5xx,
    /// A connect, first-byte or idle timeout expired.
    Timeout,
    /// Connection refused, reset or DNS failure.
    Network,
    /// The upstream sent bytes that are not the protocol it promised (bad SSE, bad JSON).
    Protocol,
    /// No worker can take the request now (no responders, concurrency limit, open breaker).
    NoCapacity,
    /// The client went away and the request was aborted.
    Cancelled,
    /// A bug or unexpected state inside Switchyard.
    Internal,
}

impl ErrorClass {
    /// Whether another attempt (retry or fallback to the next target) may succeed.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Self::RateLimited
                | Self::Overloaded
                | Self::Upstream5xx
                | Self::Timeout
                | Self::Network
                | Self::Protocol
                | Self::NoCapacity
        )
    }

    /// The snake_case wire name, e.g. `rate_limited`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::ContextLengthExceeded => "context_length_exceeded",
            Self::Auth => "auth",
            Self::Permission => "permission",
            Self::NotFound => "not_found",
            Self::RateLimited => "rate_limited",
            Self::Overloaded => "overloaded",
            Self::Upstream5xx => "upstream_5xx",
            Self::Timeout => "timeout",
            Self::Network => "network",
            Self::Protocol => "protocol",
            Self::NoCapacity => "no_capacity",
            Self::Cancelled => "cancelled",
            Self::Internal => "internal",
        }
    }
}

/// A classified failure as it travels between services.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// The class routing acts on.
    pub class: ErrorClass,
    /// Human-readable detail; never contains credentials.
    pub message: String,
    /// Whether a retry or fallback may succeed (normally `class.retryable()`).
    pub retryable: bool,
    /// The upstream HTTP status, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// How long the upstream asked us to wait (from `Retry-After`), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The request parameter at fault, for `invalid_request` (OpenAI's `param`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
}

impl ErrorInfo {
    /// A failure of `class` with `retryable` taken from the class.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
            retryable: class.retryable(),
            upstream_status: None,
            retry_after_ms: None,
            param: None,
        }
    }

    /// Sets the upstream HTTP status.
    pub fn with_status(mut self, status: u16) -> Self {
        self.upstream_status = Some(status);
        self
    }

    /// Sets the offending parameter.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets the upstream's requested wait in ms.
    pub fn with_retry_after_ms(mut self, ms: Option<u64>) -> Self {
        self.retry_after_ms = ms;
        self
    }
}

impl std::fmt::Display for ErrorInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.class.as_str(), self.message)
    }
}

impl std::error::Error for ErrorInfo {}
