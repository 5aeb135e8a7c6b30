//! The timeouts of one request and what each expiry means as an error.

use std::time::{Duration, Instant};
use switchyard_schemas::config::GatewayConfig;
use switchyard_schemas::routing::Policy;
use switchyard_schemas::{ErrorClass, ErrorInfo};

/// Why an attempt stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// The request's total time limit.
    Total,
    /// The policy's `first_byte_ms`: no content since dispatch.
    FirstContent,
    /// The policy's `idle_ms`: no content since the last.
    Idle,
}

/// The timeouts of one request: global `timeouts` with the policy's overrides.
#[derive(Debug, Clone, Copy)]
pub struct RequestTimeouts {
    /// No frame at all from a worker within this → next target.
    pub first_frame: Duration,
    /// No frame or heartbeat within this → the worker is gone.
    pub silence: Duration,
    /// No content within this after dispatch → next target (policy `first_byte_ms`).
    pub first_content: Option<Duration>,
    /// No content for this long → next target / error event (policy `idle_ms`).
    pub idle: Option<Duration>,
    /// Whole request (policy `total_ms`, else global `total_ms`).
    pub total: Duration,
}

impl RequestTimeouts {
    /// Global timeouts with `policy`'s overrides.
    pub fn of(config: &GatewayConfig, policy: Option<&Policy>) -> Self {
        let t = &config.timeouts;
        let o = policy.map(|p| &p.timeouts);
        Self {
            first_frame: Duration::from_millis(t.first_frame_ms),
            silence: Duration::from_millis(t.worker_silence_ms),
            first_content: o.and_then(|o| o.first_byte_ms).map(Duration::from_millis),
            idle: o.and_then(|o| o.idle_ms).map(Duration::from_millis),
            total: Duration::from_millis(o.and_then(|o| o.total_ms).unwrap_or(t.total_ms)),
        }
    }

    /// Until when to wait for the next frame, and what it means when that passes.
    pub(super) fn wait(
        &self,
        deadline: Instant,
        dispatched: Instant,
        last_content: Option<Instant>,
    ) -> (Instant, Expiry) {
        let content = match last_content {
            None => self
                .first_content
                .map(|d| (dispatched + d, Expiry::FirstContent)),
            Some(at) => self.idle.map(|d| (at + d, Expiry::Idle)),
        };
        match content {
            Some((at, why)) if at < deadline => (at, why),
            _ => (deadline, Expiry::Total),
        }
    }

    pub(super) fn error(&self, why: Expiry, target: &str) -> ErrorInfo {
        let ms = |d: Option<Duration>| d.map_or(0, |d| d.as_millis());
        match why {
            Expiry::Total => {
                let mut e = ErrorInfo::new(
                    ErrorClass::Timeout,
                    format!(
                        "The request exceeded its time limit of {} ms.",
                        self.total.as_millis()
                    ),
                );
                e.retryable = false;
                e
            }
            Expiry::FirstContent => ErrorInfo::new(
                ErrorClass::Timeout,
                format!(
                    "target `{target}` sent no content within {} ms",
                    ms(self.first_content)
                ),
            ),
            Expiry::Idle => ErrorInfo::new(
                ErrorClass::Timeout,
                format!("target `{target}` sent no content for {} ms", ms(self.idle)),
            ),
        }
    }
}
