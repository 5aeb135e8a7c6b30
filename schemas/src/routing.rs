//! Routing and protection config: per-target limits, circuit breaker, retries and timeouts, and
//! the policies that order a model's targets. All durations in ms, rates as fractions 0–1.

use serde::{Deserialize, Serialize};

/// Per-target limits, enforced by the workers across all replicas of a provider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Requests per minute (token bucket, refilled continuously). `None` = unlimited.
    pub rpm: Option<u32>,
    /// Tokens per minute: charged before the call with a tokenizer estimate (prompt + max_tokens),
    /// corrected with the actual usage after. `None` = unlimited.
    pub tpm: Option<u64>,
    /// In-flight requests per worker process; beyond it the worker rejects at once. `None` = unlimited.
    pub max_concurrency: Option<u32>,
}

/// Circuit breaker over a sliding window of recent calls (closed → open → half-open → closed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Breaker {
    /// Off = never opens.
    pub enabled: bool,
    /// Sliding window length, ms.
    pub window_ms: u64,
    /// Calls needed in the window before rates are judged.
    pub min_calls: u32,
    /// Failure share (retryable classes only) that opens the breaker.
    pub failure_rate: f64,
    /// A call slower than this (to the end) counts as slow, ms.
    pub slow_call_ms: u64,
    /// Slow-call share that opens the breaker.
    pub slow_call_rate: f64,
    /// How long it stays open before a half-open probe, ms.
    pub open_ms: u64,
    /// Probe requests let through while half-open.
    pub half_open_probes: u32,
    /// Provider-wide cooldown: this many 429s within `window_ms` across the provider…
    pub cooldown_after_429s: u32,
    /// …pause every target of the provider for this long, ms (or the largest Retry-After seen).
    pub cooldown_ms: u64,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            enabled: true,
            window_ms: 30_000,
            min_calls: 10,
            failure_rate: 0.5,
            slow_call_ms: 60_000,
            slow_call_rate: 0.8,
            open_ms: 15_000,
            half_open_probes: 1,
            cooldown_after_429s: 5,
            cooldown_ms: 10_000,
        }
    }
}

/// Retries inside the worker, for retryable classes only (429, 5xx, overloaded, timeouts, network).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retry {
    /// Upstream calls at most, first included (1 = no retry).
    pub max_attempts: u32,
    /// First backoff, ms; doubles each retry, with full jitter.
    pub base_ms: u64,
    /// Backoff cap, ms.
    pub max_ms: u64,
    /// Total time the worker may spend waiting between attempts, ms. A `Retry-After` longer than
    /// what is left fails the attempt at once (ingress then falls back or returns 429 with it).
    pub budget_ms: u64,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            max_attempts: 2,
            base_ms: 200,
            max_ms: 2_000,
            budget_ms: 5_000,
        }
    }
}

/// Timeout overrides; `None` keeps the global `timeouts` value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutOverrides {
    /// TCP/TLS connect, ms.
    pub connect_ms: Option<u64>,
    /// First upstream byte/token, ms.
    pub first_byte_ms: Option<u64>,
    /// Longest gap between two data events (keep-alive comments do not count), ms.
    pub idle_ms: Option<u64>,
    /// Whole request, ms.
    pub total_ms: Option<u64>,
}

/// Active health probe of a target (opt-in: probes are real, billed upstream calls).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Probe {
    /// Interval while the target is healthy, ms.
    pub interval_ms: u64,
    /// Interval while its breaker is open or half-open (faster, to notice recovery), ms.
    pub unhealthy_interval_ms: u64,
    /// A realistic prompt; the answer must be non-empty.
    pub prompt: String,
    /// Output cap of a probe, tokens.
    pub max_tokens: u32,
    /// A probe slower than this (to the end) counts as a failure, ms.
    pub max_latency_ms: u64,
}

impl Default for Probe {
    fn default() -> Self {
        Self {
            interval_ms: 30_000,
            unhealthy_interval_ms: 5_000,
            prompt: "Reply with the single word: ok".into(),
            max_tokens: 8,
            max_latency_ms: 10_000,
        }
    }
}

/// How a policy orders a model's candidate targets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Targets in `priority` order (ties: config order).
    #[default]
    Priority,
    /// Random by `weight`, then the rest by priority as fallbacks.
    Weighted,
    /// Cheapest cost price first (from the pricing catalog).
    LowestCost,
    /// Lowest EWMA of recent TTFT first.
    LowestLatency,
    /// Fewest in-flight requests first.
    LeastBusy,
    /// `canary.percent` of users (stable hash of the user id) to `canary.target`, the rest by priority.
    Canary,
    /// Weighted score of priority, health, cost, latency and limit headroom.
    Composite,
}

/// Canary split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Canary {
    /// The canary target id.
    pub target: String,
    /// Share of users sent to it, 0–100.
    pub percent: f64,
}

/// Weights of the composite score (each term normalised to 0–1, higher is better).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompositeWeights {
    /// Lower `priority` number scores higher.
    pub priority: f64,
    /// Healthy 1, degraded 0.5.
    pub health: f64,
    /// Cheaper scores higher.
    pub cost: f64,
    /// Faster TTFT scores higher.
    pub latency: f64,
    /// More remaining RPM/TPM headroom scores higher.
    pub headroom: f64,
}

impl Default for CompositeWeights {
    fn default() -> Self {
        Self {
            priority: 1.0,
            health: 2.0,
            cost: 1.0,
            latency: 1.0,
            headroom: 1.0,
        }
    }
}

/// A routing policy, referenced by models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Unique id.
    pub id: String,
    /// Ordering strategy.
    #[serde(default)]
    pub strategy: Strategy,
    /// For `canary`.
    pub canary: Option<Canary>,
    /// For `composite`.
    #[serde(default)]
    pub weights: CompositeWeights,
    /// Most targets tried per request (first included); `None` = all candidates.
    pub max_attempts: Option<u32>,
    /// Timeout overrides for requests under this policy.
    #[serde(default)]
    pub timeouts: TimeoutOverrides,
    /// Drop the oldest turns (keeping system prompts and the latest turns) when the estimated
    /// prompt exceeds the target's `context_window`.
    #[serde(default)]
    pub trim_context: bool,
}
