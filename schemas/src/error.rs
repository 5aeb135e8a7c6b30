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

/// What a failed upstream call says about its target, for the worker's circuit breaker and
/// provider cooldown (`workers/src/breaker.rs`) and ingress's passive health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetHealth {
    /// The target failed (5xx, overloaded, timeout, network, protocol): a breaker failure.
    Failed,
    /// The target rate-limited us (HTTP 429): feeds the provider cooldown, never a breaker failure.
    Throttled,
    /// The target is alive and answered: a request error it rightly rejected (400, 401, 403, 404)
    /// counts as a breaker success.
    Answered,
    /// Says nothing about the target: cancelled by the client, Switchyard's own error, or its own
    /// admission refusal (`no_capacity`).
    Neutral,
}

/// What to do after a failure — the one place retryability is decided. The worker's retry
/// (`workers/src/retry.rs`), the breaker (`workers/src/breaker.rs`) and ingress's fallback
/// (`judge` in `ingress/src/route/attempt.rs`) all read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disposition {
    /// The worker may call the same target again (before any content reached the client):
    /// `rate_limited`, `overloaded`, `upstream_5xx`, `timeout`, `network`. Not `protocol` (the same
    /// server sends the same bytes again) nor `no_capacity` (Switchyard's own refusal).
    pub retry: bool,
    /// Ingress may move to the next target: every class `retry` allows, plus `protocol` and
    /// `no_capacity`.
    pub fallback: bool,
    /// What the failure says about the target.
    pub health: TargetHealth,
    /// Whether it counts against the target in ingress's passive health: `Failed`, and
    /// `Throttled` when the upstream itself answered 429 (`upstream_status` set) — a worker's own
    /// RPM/TPM refusal carries no status and says nothing new.
    pub degrades: bool,
}

impl ErrorClass {
    /// The disposition of a failure of this class (see [`Disposition`]); [`ErrorInfo::disposition`]
    /// refines it with the error's own fields.
    pub fn disposition(self) -> Disposition {
        use TargetHealth::*;
        let (retry, fallback, health) = match self {
            Self::RateLimited => (true, true, Throttled),
            Self::Overloaded | Self::Upstream5xx | Self::Timeout | Self::Network => {
                (true, true, Failed)
            }
            Self::Protocol => (false, true, Failed),
            Self::NoCapacity => (false, true, Neutral),
            Self::InvalidRequest
            | Self::ContextLengthExceeded
            | Self::Auth
            | Self::Permission
            | Self::NotFound => (false, false, Answered),
            Self::Cancelled | Self::Internal => (false, false, Neutral),
        };
        Disposition {
            retry,
            fallback,
            health,
            degrades: health == Failed,
        }
    }

    /// Whether another attempt (retry or fallback to the next target) may succeed: the class's
    /// [`Disposition::fallback`].
    pub fn retryable(self) -> bool {
        self.disposition().fallback
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
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// The class routing acts on.
    pub class: ErrorClass,
    /// Human-readable detail; never contains credentials.
    pub message: String,
    /// Whether a retry or fallback may succeed (normally `class.retryable()`; `false` turns both
    /// off, see [`ErrorInfo::disposition`]).
    pub retryable: bool,
    /// The upstream HTTP status, when there was one.
    pub upstream_status: Option<u16>,
    /// How long the upstream asked us to wait (from `Retry-After`), in ms.
    pub retry_after_ms: Option<u64>,
    /// The request parameter at fault, for `invalid_request` (OpenAI's `param`).
    pub param: Option<String>,
}

impl ErrorInfo {
    /// What to do after this failure: the class's [`Disposition`], with `retry` and `fallback`
    /// off when the sender marked it not `retryable` (e.g. ingress's total-deadline timeout), and
    /// an upstream 429 (`upstream_status` set) degrading the target.
    pub fn disposition(&self) -> Disposition {
        let mut d = self.class.disposition();
        if !self.retryable {
            d.retry = false;
            d.fallback = false;
        }
        if d.health == TargetHealth::Throttled && self.upstream_status.is_some() {
            d.degrades = true;
        }
        d
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of docs/errors.md ("retried / fallback") and the breaker's counting rules.
    #[test]
    fn dispositions() {
        use TargetHealth::*;
        let d = |c: ErrorClass| {
            let d = c.disposition();
            (d.retry, d.fallback, d.health, d.degrades)
        };
        let retried_failed = (true, true, Failed, true);
        let answered = (false, false, Answered, false);
        let neutral = (false, false, Neutral, false);
        for (c, want) in [
            (ErrorClass::RateLimited, (true, true, Throttled, false)),
            (ErrorClass::Overloaded, retried_failed),
            (ErrorClass::Upstream5xx, retried_failed),
            (ErrorClass::Timeout, retried_failed),
            (ErrorClass::Network, retried_failed),
            (ErrorClass::Protocol, (false, true, Failed, true)),
            (ErrorClass::NoCapacity, (false, true, Neutral, false)),
            (ErrorClass::InvalidRequest, answered),
            (ErrorClass::ContextLengthExceeded, answered),
            (ErrorClass::Auth, answered),
            (ErrorClass::Permission, answered),
            (ErrorClass::NotFound, answered),
            (ErrorClass::Cancelled, neutral),
            (ErrorClass::Internal, neutral),
        ] {
            assert_eq!(d(c), want, "{c:?}");
        }
        // An upstream 429 degrades the target; a worker's own RPM refusal does not.
        let local = ErrorInfo::new(ErrorClass::RateLimited, "rpm");
        assert!(!local.disposition().degrades);
        assert!(local.clone().with_status(429).disposition().degrades);
        // `retryable: false` (ingress's total deadline) turns retry and fallback off.
        let mut e = ErrorInfo::new(ErrorClass::Timeout, "total");
        e.retryable = false;
        let d = e.disposition();
        assert_eq!((d.retry, d.fallback, d.health), (false, false, Failed));
    }
}
