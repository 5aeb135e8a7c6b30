//! Target health events: what a worker publishes on `<prefix>.health.<target>` when the state of
//! one of its per-target protections changes (circuit breaker, provider-wide 429 cooldown).
//!
//! Breakers live in each worker process, so with several replicas every worker publishes its own
//! view: readers key the state by (`target`, `worker`). Events are plain NATS messages (not
//! JetStream): a reader that starts late learns a target's state from its next change.
//!
//! | transition | `state` | `reason` |
//! |---|---|---|
//! | breaker closed → open, half-open → open | `unhealthy` | `breaker_open` (with the observed rates) |
//! | breaker open → half-open (after `open_ms`) | `degraded` | `breaker_half_open` |
//! | breaker half-open → closed | `healthy` | `breaker_closed` |
//! | provider cooldown starts (every target of the provider) | `unhealthy` | `provider_cooldown` |
//! | provider cooldown ends | `healthy` (or the breaker's state) | `cooldown_over` |
//!
//! `retry_after_ms` tells, for `unhealthy`, when the worker will let a probe through again, so a
//! reader can stop avoiding the target then even if it missed the `degraded` event.

use serde::{Deserialize, Serialize};

/// Health of one target as one worker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Breaker closed, no cooldown: requests flow.
    Healthy,
    /// Breaker half-open: a few probe requests go through, the rest are rejected at once.
    Degraded,
    /// Breaker open or provider cooldown: every request is rejected at once (`no_capacity`).
    Unhealthy,
}

impl HealthState {
    /// The snake_case wire name, e.g. `degraded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Unhealthy => "unhealthy",
        }
    }
}

/// One state change, JSON on `<prefix>.health.<target>`, e.g.
/// `{"target":"openai-main","state":"unhealthy","reason":"breaker_open: 6/10 failures",
/// "ts_ms":1732900000000,"worker":"worker-7f3a","retry_after_ms":15000}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthEvent {
    /// Configured target id.
    pub target: String,
    /// New state.
    pub state: HealthState,
    /// Why, machine-readable first word (`breaker_open`, `breaker_half_open`, `breaker_closed`,
    /// `provider_cooldown`, `cooldown_over`), optionally followed by `: <detail>`.
    pub reason: String,
    /// When the change happened, ms since the Unix epoch.
    pub ts_ms: u64,
    /// Id of the worker process whose breaker changed.
    pub worker: String,
    /// For `unhealthy`: ms until the worker lets requests (or a probe) through again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn wire_shape() {
        let e = HealthEvent {
            target: "t".into(),
            state: HealthState::Unhealthy,
            reason: "breaker_open".into(),
            ts_ms: 5,
            worker: "w".into(),
            retry_after_ms: Some(100),
        };
        let s = serde_json::to_string(&e).unwrap();
        assert_eq!(
            s,
            r#"{"target":"t","state":"unhealthy","reason":"breaker_open","ts_ms":5,"worker":"w","retry_after_ms":100}"#
        );
        assert_eq!(serde_json::from_str::<HealthEvent>(&s).unwrap(), e);
    }
}
