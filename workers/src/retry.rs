//! When the worker calls the upstream again after a failed call, and after how long.
//!
//! Only while nothing has reached the client (no content frame sent), only for the failures a new
//! call can cure — [`ErrorInfo::disposition`]'s `retry` (`rate_limited`, `upstream_5xx`,
//! `overloaded`, `timeout`, `network`; decided in `schemas/src/error.rs`) — and at most `retry.max_attempts` calls in all. The wait before retry *n* (0-based) is
//! exponential backoff with full jitter: uniform in `[0, min(max_ms, base_ms · 2ⁿ)]`, raised to
//! the upstream's `Retry-After` when it sent one (never sooner than asked). All waits of a
//! request together stay within `retry.budget_ms` and the request's deadline: a `Retry-After`
//! longer than what is left ends the retries at once with that error (its `retry_after_ms`
//! intact), so ingress falls back to the next target or answers 429 with `Retry-After`.
//!
//! Each retry is a new upstream call: it needs the breaker's permission and an RPM token again
//! (see `worker.rs`), and it keeps the request id as `idempotency-key`.

use rand::Rng;
use std::time::Duration;
use switchyard_schemas::ErrorInfo;
use switchyard_schemas::routing::Retry;

/// What to do after a failed upstream call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Call again after this wait.
    Retry(Duration),
    /// Return the error now.
    GiveUp,
}

/// The full-jitter backoff before retry `index` (0 = the first retry): uniform in
/// `[0, min(max_ms, base_ms · 2^index)]`.
pub fn backoff(cfg: &Retry, index: u32) -> Duration {
    let ceiling = cfg
        .base_ms
        .saturating_mul(1u64.checked_shl(index.min(62)).unwrap_or(u64::MAX))
        .min(cfg.max_ms);
    Duration::from_millis(rand::rng().random_range(0..=ceiling))
}

/// Decides after call number `calls` (1-based) failed with `error`.
///
/// * `waited` — time already spent waiting between calls of this request;
/// * `left` — time until the request's deadline;
/// * `content_sent` — whether a content frame already went to the client.
pub fn decide(
    cfg: &Retry,
    calls: u32,
    waited: Duration,
    left: Duration,
    error: &ErrorInfo,
    content_sent: bool,
) -> Decision {
    if content_sent || !error.disposition().retry || calls >= cfg.max_attempts {
        return Decision::GiveUp;
    }
    let budget = Duration::from_millis(cfg.budget_ms)
        .saturating_sub(waited)
        .min(left);
    let asked = error.retry_after_ms.map(Duration::from_millis);
    if asked.is_some_and(|a| a > budget) {
        return Decision::GiveUp;
    }
    let wait = backoff(cfg, calls - 1).max(asked.unwrap_or(Duration::ZERO));
    if wait > budget {
        return Decision::GiveUp;
    }
    Decision::Retry(wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_schemas::ErrorClass;

    fn cfg(max_attempts: u32) -> Retry {
        Retry {
            max_attempts,
            base_ms: 100,
            max_ms: 1_000,
            budget_ms: 2_000,
        }
    }

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn backoff_is_jittered_under_an_exponential_cap() {
        let c = cfg(10);
        for i in 0..8 {
            let cap = (100u64 << i).min(1_000);
            for _ in 0..50 {
                assert!(backoff(&c, i) <= Duration::from_millis(cap));
            }
        }
        // Full jitter: not always the cap.
        assert!((0..50).any(|_| backoff(&c, 3) < Duration::from_millis(800)));
        assert!(backoff(&c, 200) <= Duration::from_millis(1_000));
    }

    #[test]
    fn only_retryable_classes_before_content_within_attempts() {
        let c = cfg(3);
        let e503 = ErrorInfo::new(ErrorClass::Overloaded, "x");
        assert!(matches!(
            decide(&c, 1, Duration::ZERO, LONG, &e503, false),
            Decision::Retry(_)
        ));
        assert!(matches!(
            decide(&c, 2, Duration::ZERO, LONG, &e503, false),
            Decision::Retry(_)
        ));
        assert_eq!(
            decide(&c, 3, Duration::ZERO, LONG, &e503, false),
            Decision::GiveUp
        );
        assert_eq!(
            decide(&c, 1, Duration::ZERO, LONG, &e503, true),
            Decision::GiveUp
        );
        for class in [
            ErrorClass::InvalidRequest,
            ErrorClass::ContextLengthExceeded,
            ErrorClass::Auth,
            ErrorClass::Protocol,
            ErrorClass::NoCapacity,
            ErrorClass::Cancelled,
        ] {
            let e = ErrorInfo::new(class, "x");
            assert_eq!(
                decide(&c, 1, Duration::ZERO, LONG, &e, false),
                Decision::GiveUp
            );
        }
    }

    #[test]
    fn retry_after_is_honoured_or_ends_the_retries() {
        let c = cfg(3);
        let e = ErrorInfo::new(ErrorClass::RateLimited, "x").with_retry_after_ms(Some(1_500));
        assert_eq!(
            decide(&c, 1, Duration::ZERO, LONG, &e, false),
            Decision::Retry(Duration::from_millis(1_500))
        );
        // Only 1 s of budget left, or of deadline.
        assert_eq!(
            decide(&c, 1, Duration::from_secs(1), LONG, &e, false),
            Decision::GiveUp
        );
        assert_eq!(
            decide(&c, 1, Duration::ZERO, Duration::from_secs(1), &e, false),
            Decision::GiveUp
        );
        let e = ErrorInfo::new(ErrorClass::RateLimited, "x").with_retry_after_ms(Some(7_000));
        assert_eq!(
            decide(&c, 1, Duration::ZERO, LONG, &e, false),
            Decision::GiveUp
        );
    }
}
