//! Circuit breaker per target and provider-wide 429 cooldown, per worker process.
//!
//! # Breaker
//!
//! Each target's breaker judges the upstream calls of the last `breaker.window_ms`:
//!
//! * **closed** — calls go through. Once the window holds at least `min_calls` calls and the share
//!   of failures reaches `failure_rate` (or the share of calls slower than `slow_call_ms` reaches
//!   `slow_call_rate`), it opens.
//! * **open** — every request is answered at once with a retryable `no_capacity` error whose
//!   `retry_after_ms` is the time left until half-open; no upstream call. After `open_ms` a timer
//!   moves it to half-open (so readers of the health subject learn it without traffic).
//! * **half-open** — `half_open_probes` requests go through as probes, the rest are rejected. A
//!   failed probe opens it again for `open_ms`; when every probe succeeded it closes, with an
//!   empty window.
//!
//! What counts is the error's `TargetHealth` (`ErrorInfo::disposition`, `schemas/src/error.rs`):
//! retryable upstream failures (`upstream_5xx`, `overloaded`, `timeout`, `network`, `protocol`)
//! are failures. A 429 is not a failure of the target (it feeds the cooldown below).
//! Request errors the upstream answered (`invalid_request`, `context_length_exceeded`, `auth`,
//! `permission`, `not_found`) count as successes — the upstream is alive and answering — so they
//! never trip anything. Cancelled calls and Switchyard's own errors are not counted. A call that
//! ends after the breaker changed state (admitted before it opened, say) is ignored.
//!
//! # Provider cooldown
//!
//! When `cooldown_after_429s` upstream 429s arrive within `window_ms` (the settings of the target
//! that got the last one) from targets of one provider family, every target of that provider in
//! this worker is paused for `cooldown_ms` or the largest `Retry-After` seen, whichever is
//! longer: requests are answered `no_capacity` (retryable, `retry_after_ms` = time left).
//! `cooldown_after_429s: 0` turns it off. Targets with `breaker.enabled: false` are neither
//! judged nor paused.
//!
//! Every state change is sent as a [`HealthEvent`] (see `switchyard_schemas::health`) to the
//! channel returned by [`Breakers::new`]; the worker publishes them on `<prefix>.health.<target>`.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use switchyard_schemas::config::{GatewayConfig, ProviderKind, TargetConfig};
use switchyard_schemas::health::{HealthEvent, HealthState};
use switchyard_schemas::routing::Breaker as BreakerConfig;
use switchyard_schemas::{ErrorClass, ErrorInfo, TargetHealth, now_ms};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How one upstream call ended, as far as the breaker is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    /// The upstream answered (a success, or a request error it rightly rejected).
    Success,
    /// A retryable upstream failure.
    Failure,
    /// An upstream 429, with its `Retry-After` in ms.
    RateLimited(Option<u64>),
    /// Tells nothing about the upstream (cancelled, internal error).
    Neutral,
}

impl CallResult {
    /// Classifies the end of one upstream call (`None` = success) by the error's
    /// [`TargetHealth`] (decided in `schemas/src/error.rs`).
    pub fn of(error: Option<&ErrorInfo>) -> Self {
        let Some(e) = error else {
            return Self::Success;
        };
        match e.disposition().health {
            TargetHealth::Throttled => Self::RateLimited(e.retry_after_ms),
            TargetHealth::Failed => Self::Failure,
            TargetHealth::Answered => Self::Success,
            TargetHealth::Neutral => Self::Neutral,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Closed,
    Open { until: Instant },
    HalfOpen { issued: u32, succeeded: u32 },
}

#[derive(Debug, Clone, Copy)]
struct Call {
    at: Instant,
    failure: bool,
    slow: bool,
}

#[derive(Debug)]
struct TargetBreaker {
    phase: Phase,
    /// Bumped on every state change; permits of an older generation are ignored.
    generation: u64,
    window: Window,
}

impl Default for TargetBreaker {
    fn default() -> Self {
        Self {
            phase: Phase::Closed,
            generation: 0,
            window: Window::default(),
        }
    }
}

/// The calls of the last `window_ms` with running counts, so judging a call is O(1) however
/// many calls the window holds (10,000 at 1,000 rps and a 10 s window).
#[derive(Debug, Default)]
struct Window {
    calls: VecDeque<Call>,
    failures: usize,
    slow: usize,
}

impl Window {
    fn push(&mut self, call: Call) {
        self.failures += usize::from(call.failure);
        self.slow += usize::from(call.slow);
        self.calls.push_back(call);
    }

    /// Drops the calls older than `span` before `now`.
    fn expire(&mut self, now: Instant, span: Duration) {
        while let Some(c) = self.calls.front().filter(|c| now - c.at > span) {
            self.failures -= usize::from(c.failure);
            self.slow -= usize::from(c.slow);
            self.calls.pop_front();
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[derive(Debug, Default)]
struct Cooldown {
    /// Recent 429s: when, and their Retry-After in ms.
    recent: VecDeque<(Instant, Option<u64>)>,
    until: Option<Instant>,
    generation: u64,
}

#[derive(Debug, Default)]
struct State {
    targets: HashMap<String, TargetBreaker>,
    cooldowns: HashMap<ProviderKind, Cooldown>,
}

struct Inner {
    worker: String,
    events: mpsc::UnboundedSender<HealthEvent>,
    state: Mutex<State>,
    /// Half-open and cooldown-end timers; [`Breakers::close`] cancels and waits for them.
    timers: TaskTracker,
    stop: CancellationToken,
}

/// The breakers and cooldowns of one worker process. Cheap to clone.
#[derive(Clone)]
pub struct Breakers {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Breakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breakers")
            .field("worker", &self.inner.worker)
            .finish()
    }
}

/// Permission for one upstream call; report how it ended with [`Permit::record`]. Dropping it
/// unrecorded (e.g. a later limit rejected the request) gives a half-open probe slot back.
#[must_use = "record the call's result"]
pub struct Permit {
    breakers: Option<Breakers>,
    target: String,
    provider: ProviderKind,
    config: BreakerConfig,
    generation: u64,
    probe: bool,
    snapshot: Option<Arc<GatewayConfig>>,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("target", &self.target)
            .field("probe", &self.probe)
            .finish()
    }
}

impl Permit {
    /// Whether this call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// Records the end of the call that took `duration`.
    pub fn record(mut self, result: CallResult, duration: Duration) {
        if let Some(b) = self.breakers.take() {
            b.record(&self, result, duration);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(b) = self.breakers.take() {
            b.release_probe(self);
        }
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

impl Breakers {
    /// Breakers for worker `worker`; state changes arrive on the returned channel.
    pub fn new(worker: impl Into<String>) -> (Self, mpsc::UnboundedReceiver<HealthEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let b = Self {
            inner: Arc::new(Inner {
                worker: worker.into(),
                events: tx,
                state: Mutex::new(State::default()),
                timers: TaskTracker::new(),
                stop: CancellationToken::new(),
            }),
        };
        (b, rx)
    }

    /// Cancels the pending half-open and cooldown-end timers (their transitions no longer
    /// matter once the worker stops serving) and waits until none runs.
    pub async fn close(&self) {
        self.inner.stop.cancel();
        self.inner.timers.close();
        self.inner.timers.wait().await;
    }

    /// Runs `then` once `sleep` ends, unless [`Breakers::close`] comes first.
    fn after(
        &self,
        sleep: impl Future<Output = ()> + Send + 'static,
        then: impl FnOnce() + Send + 'static,
    ) {
        let stop = self.inner.stop.clone();
        self.inner.timers.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = sleep => then(),
            }
        });
    }

    /// Lets a call to `target` through, or says why not (retryable `no_capacity`, with the time
    /// until the breaker half-opens or the cooldown ends). `config` is the snapshot the request
    /// uses (for the provider's other targets when a cooldown starts).
    pub fn admit(
        &self,
        config: &Arc<GatewayConfig>,
        target: &TargetConfig,
    ) -> Result<Permit, ErrorInfo> {
        let cfg = &target.breaker;
        let mut permit = Permit {
            breakers: None,
            target: target.id.clone(),
            provider: target.provider,
            config: cfg.clone(),
            generation: 0,
            probe: false,
            snapshot: None,
        };
        if !cfg.enabled {
            return Ok(permit);
        }
        let now = Instant::now();
        let mut st = self.inner.state.lock();
        if let Some(until) = st.cooldowns.get(&target.provider).and_then(|c| c.until)
            && until > now
        {
            return Err(ErrorInfo::new(
                ErrorClass::NoCapacity,
                format!(
                    "provider `{}` is cooling down after repeated 429s (target `{}`)",
                    target.provider.as_str(),
                    target.id
                ),
            )
            .with_retry_after_ms(Some(ms(until - now).max(1))));
        }
        let tb = st.targets.entry(target.id.clone()).or_default();
        if let Phase::Open { until } = tb.phase {
            if until > now {
                return Err(ErrorInfo::new(
                    ErrorClass::NoCapacity,
                    format!("circuit breaker of target `{}` is open", target.id),
                )
                .with_retry_after_ms(Some(ms(until - now).max(1))));
            }
            // The timer has not fired yet: half-open now.
            self.half_open(tb, &target.id);
        }
        if let Phase::HalfOpen { issued, .. } = &mut tb.phase {
            if *issued >= cfg.half_open_probes.max(1) {
                return Err(ErrorInfo::new(
                    ErrorClass::NoCapacity,
                    format!(
                        "circuit breaker of target `{}` is half-open and its probes are in flight",
                        target.id
                    ),
                ));
            }
            *issued += 1;
            permit.probe = true;
        }
        permit.generation = tb.generation;
        permit.breakers = Some(self.clone());
        permit.snapshot = Some(config.clone());
        Ok(permit)
    }

    fn record(&self, p: &Permit, result: CallResult, duration: Duration) {
        let now = Instant::now();
        let mut st = self.inner.state.lock();
        if let CallResult::RateLimited(retry_after) = result
            && let Some(config) = &p.snapshot
        {
            self.note_429(&mut st, config, p, retry_after, now);
        }
        let Some(tb) = st.targets.get_mut(&p.target) else {
            return;
        };
        if tb.generation != p.generation {
            return; // the state changed while this call ran
        }
        let cfg = &p.config;
        match (tb.phase, result) {
            (Phase::Closed, CallResult::Success | CallResult::Failure) => {
                let window = Duration::from_millis(cfg.window_ms);
                tb.window.push(Call {
                    at: now,
                    failure: result == CallResult::Failure,
                    slow: duration >= Duration::from_millis(cfg.slow_call_ms),
                });
                tb.window.expire(now, window);
                let n = tb.window.calls.len();
                if n == 0 || (n as u64) < u64::from(cfg.min_calls) {
                    return;
                }
                let (failures, slow) = (tb.window.failures, tb.window.slow);
                let failure_rate = failures as f64 / n as f64;
                let slow_rate = slow as f64 / n as f64;
                if (failures > 0 && failure_rate >= cfg.failure_rate)
                    || (slow > 0 && slow_rate >= cfg.slow_call_rate)
                {
                    let reason = format!(
                        "breaker_open: {failures}/{n} calls failed, {slow}/{n} slow within {} ms",
                        cfg.window_ms
                    );
                    self.open(tb, &p.target, cfg, reason, now);
                }
            }
            (Phase::HalfOpen { .. }, CallResult::Failure) if p.probe => {
                self.open(tb, &p.target, cfg, "breaker_open: probe failed".into(), now);
            }
            (Phase::HalfOpen { issued, succeeded }, CallResult::Success) if p.probe => {
                let succeeded = succeeded + 1;
                if succeeded >= cfg.half_open_probes.max(1) {
                    tb.phase = Phase::Closed;
                    tb.generation += 1;
                    tb.window.clear();
                    self.emit(
                        &p.target,
                        HealthState::Healthy,
                        "breaker_closed".into(),
                        None,
                    );
                } else {
                    tb.phase = Phase::HalfOpen { issued, succeeded };
                }
            }
            (Phase::HalfOpen { issued, succeeded }, _) if p.probe => {
                // A probe that told nothing: let another request probe.
                tb.phase = Phase::HalfOpen {
                    issued: issued.saturating_sub(1),
                    succeeded,
                };
            }
            _ => {}
        }
    }

    fn release_probe(&self, p: &Permit) {
        if !p.probe {
            return;
        }
        let mut st = self.inner.state.lock();
        if let Some(tb) = st.targets.get_mut(&p.target)
            && tb.generation == p.generation
            && let Phase::HalfOpen { issued, succeeded } = tb.phase
        {
            tb.phase = Phase::HalfOpen {
                issued: issued.saturating_sub(1),
                succeeded,
            };
        }
    }

    fn open(
        &self,
        tb: &mut TargetBreaker,
        target: &str,
        cfg: &BreakerConfig,
        reason: String,
        now: Instant,
    ) {
        let open = Duration::from_millis(cfg.open_ms);
        tb.phase = Phase::Open { until: now + open };
        tb.generation += 1;
        tb.window.clear();
        self.emit(target, HealthState::Unhealthy, reason, Some(cfg.open_ms));
        let generation = tb.generation;
        let me = self.clone();
        let target = target.to_owned();
        self.after(tokio::time::sleep_until(now + open), move || {
            let mut st = me.inner.state.lock();
            if let Some(tb) = st.targets.get_mut(&target)
                && tb.generation == generation
                && matches!(tb.phase, Phase::Open { .. })
            {
                me.half_open(tb, &target);
            }
        });
    }

    fn half_open(&self, tb: &mut TargetBreaker, target: &str) {
        tb.phase = Phase::HalfOpen {
            issued: 0,
            succeeded: 0,
        };
        tb.generation += 1;
        self.emit(
            target,
            HealthState::Degraded,
            "breaker_half_open".into(),
            None,
        );
    }

    fn note_429(
        &self,
        st: &mut State,
        config: &Arc<GatewayConfig>,
        p: &Permit,
        retry_after: Option<u64>,
        now: Instant,
    ) {
        let cfg = &p.config;
        if cfg.cooldown_after_429s == 0 {
            return;
        }
        let cd = st.cooldowns.entry(p.provider).or_default();
        if cd.until.is_some_and(|u| u > now) {
            return;
        }
        let window = Duration::from_millis(cfg.window_ms);
        cd.recent.push_back((now, retry_after));
        while cd.recent.front().is_some_and(|(at, _)| now - *at > window) {
            cd.recent.pop_front();
        }
        if (cd.recent.len() as u64) < u64::from(cfg.cooldown_after_429s) {
            return;
        }
        let longest = cd.recent.iter().filter_map(|(_, r)| *r).max().unwrap_or(0);
        let pause = cfg.cooldown_ms.max(longest);
        let count = cd.recent.len();
        cd.recent.clear();
        cd.until = now.checked_add(Duration::from_millis(pause));
        cd.generation += 1;
        let generation = cd.generation;
        let targets: Vec<String> = config
            .targets
            .iter()
            .filter(|t| t.provider == p.provider && t.breaker.enabled)
            .map(|t| t.id.clone())
            .collect();
        let reason = format!(
            "provider_cooldown: {count} 429s from `{}` within {} ms",
            p.provider.as_str(),
            cfg.window_ms
        );
        for t in &targets {
            self.emit(t, HealthState::Unhealthy, reason.clone(), Some(pause));
        }
        let me = self.clone();
        let provider = p.provider;
        let sleep = tokio::time::sleep(Duration::from_millis(pause));
        self.after(sleep, move || {
            let st = me.inner.state.lock();
            if st.cooldowns.get(&provider).map(|c| c.generation) != Some(generation) {
                return;
            }
            for t in &targets {
                let state = match st.targets.get(t).map(|b| b.phase) {
                    Some(Phase::Open { .. }) => HealthState::Unhealthy,
                    Some(Phase::HalfOpen { .. }) => HealthState::Degraded,
                    _ => HealthState::Healthy,
                };
                me.emit(t, state, "cooldown_over".into(), None);
            }
        });
    }

    fn emit(&self, target: &str, state: HealthState, reason: String, retry_after_ms: Option<u64>) {
        tracing::info!(target, state = state.as_str(), %reason, "target health changed");
        let _ = self.inner.events.send(HealthEvent {
            target: target.to_owned(),
            state,
            reason,
            ts_ms: now_ms(),
            worker: self.inner.worker.clone(),
            retry_after_ms,
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn config(breaker: serde_json::Value) -> Arc<GatewayConfig> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "targets": [
                    {"id": "a", "provider": "openai", "base_url": "builtin:mock",
                     "upstream_model": "m", "breaker": breaker},
                    {"id": "b", "provider": "openai", "base_url": "builtin:mock",
                     "upstream_model": "m", "breaker": breaker},
                    {"id": "c", "provider": "anthropic", "base_url": "builtin:mock",
                     "upstream_model": "m", "breaker": breaker}
                ]
            }))
            .unwrap(),
        )
    }

    fn call(b: &Breakers, c: &Arc<GatewayConfig>, t: &str, r: CallResult) {
        b.admit(c, c.target(t).unwrap())
            .unwrap()
            .record(r, Duration::from_millis(1));
    }

    #[tokio::test]
    async fn opens_half_opens_and_closes() {
        let c = config(
            serde_json::json!({"min_calls": 4, "failure_rate": 0.5, "open_ms": 50,
            "window_ms": 10000, "half_open_probes": 1}),
        );
        let (b, mut rx) = Breakers::new("w");
        let a = c.target("a").unwrap();
        call(&b, &c, "a", CallResult::Success);
        call(&b, &c, "a", CallResult::Failure);
        call(&b, &c, "a", CallResult::Success);
        assert!(rx.try_recv().is_err());
        call(&b, &c, "a", CallResult::Failure); // 2/4 = 0.5: opens
        let e = rx.try_recv().unwrap();
        assert_eq!(
            (e.state, e.retry_after_ms),
            (HealthState::Unhealthy, Some(50))
        );
        assert!(e.reason.starts_with("breaker_open"), "{}", e.reason);
        let err = b.admit(&c, a).unwrap_err();
        assert_eq!(err.class, ErrorClass::NoCapacity);
        assert!(err.retryable && err.retry_after_ms.unwrap() <= 50);
        // Another target is not affected.
        call(&b, &c, "b", CallResult::Success);
        // The timer half-opens it.
        let e = rx.recv().await.unwrap();
        assert_eq!(e.state, HealthState::Degraded);
        let probe = b.admit(&c, a).unwrap();
        assert!(probe.is_probe());
        assert!(b.admit(&c, a).is_err(), "one probe at a time");
        probe.record(CallResult::Failure, Duration::from_millis(1));
        assert_eq!(rx.recv().await.unwrap().state, HealthState::Unhealthy);
        assert_eq!(rx.recv().await.unwrap().state, HealthState::Degraded);
        // A dropped probe gives its slot back.
        drop(b.admit(&c, a).unwrap());
        let probe = b.admit(&c, a).unwrap();
        probe.record(CallResult::Success, Duration::from_millis(1));
        assert_eq!(rx.recv().await.unwrap().state, HealthState::Healthy);
        assert!(!b.admit(&c, a).unwrap().is_probe());
    }

    #[tokio::test]
    async fn request_errors_and_stale_results_never_trip() {
        let c = config(serde_json::json!({"min_calls": 2, "failure_rate": 0.5, "open_ms": 10000}));
        let (b, mut rx) = Breakers::new("w");
        let bad = ErrorInfo::new(ErrorClass::InvalidRequest, "messages.0.content: invalid");
        for _ in 0..10 {
            call(&b, &c, "a", CallResult::of(Some(&bad)));
            call(
                &b,
                &c,
                "a",
                CallResult::of(Some(&ErrorInfo::new(ErrorClass::Cancelled, "x"))),
            );
        }
        assert!(rx.try_recv().is_err());
        // Calls admitted before it opened do not count afterwards.
        let t = c.target("b").unwrap();
        let late = b.admit(&c, t).unwrap();
        call(&b, &c, "b", CallResult::Failure);
        call(&b, &c, "b", CallResult::Failure);
        assert_eq!(rx.try_recv().unwrap().state, HealthState::Unhealthy);
        late.record(CallResult::Success, Duration::ZERO);
        assert!(b.admit(&c, t).is_err());
    }

    #[tokio::test]
    async fn slow_calls_open_it() {
        let c =
            config(serde_json::json!({"min_calls": 2, "slow_call_ms": 100, "slow_call_rate": 1.0}));
        let (b, mut rx) = Breakers::new("w");
        let a = c.target("a").unwrap();
        for _ in 0..2 {
            b.admit(&c, a)
                .unwrap()
                .record(CallResult::Success, Duration::from_millis(150));
        }
        assert_eq!(rx.try_recv().unwrap().state, HealthState::Unhealthy);
    }

    #[tokio::test]
    async fn repeated_429s_pause_the_provider() {
        let c = config(
            serde_json::json!({"cooldown_after_429s": 3, "cooldown_ms": 60,
            "window_ms": 10000}),
        );
        let (b, mut rx) = Breakers::new("w");
        call(&b, &c, "a", CallResult::RateLimited(None));
        call(&b, &c, "b", CallResult::RateLimited(Some(80)));
        assert!(rx.try_recv().is_err());
        call(&b, &c, "a", CallResult::RateLimited(None));
        let mut paused: Vec<_> = (0..2).map(|_| rx.try_recv().unwrap()).collect();
        paused.sort_by(|x, y| x.target.cmp(&y.target));
        assert_eq!(paused[0].target, "a");
        assert_eq!(paused[1].target, "b");
        // The largest Retry-After (80 ms) beats cooldown_ms (60).
        assert_eq!(paused[0].retry_after_ms, Some(80));
        assert!(paused[0].reason.starts_with("provider_cooldown"));
        for t in ["a", "b"] {
            let e = b.admit(&c, c.target(t).unwrap()).unwrap_err();
            assert_eq!(e.class, ErrorClass::NoCapacity);
        }
        // Other providers go on.
        assert!(b.admit(&c, c.target("c").unwrap()).is_ok());
        let over = rx.recv().await.unwrap();
        assert_eq!(
            (over.state, over.reason.as_str()),
            (HealthState::Healthy, "cooldown_over")
        );
        assert!(b.admit(&c, c.target("a").unwrap()).is_ok());
    }

    #[tokio::test]
    async fn disabled_breaker_lets_everything_through() {
        let c = config(serde_json::json!({"enabled": false, "min_calls": 1}));
        let (b, mut rx) = Breakers::new("w");
        for _ in 0..5 {
            call(&b, &c, "a", CallResult::Failure);
            call(&b, &c, "a", CallResult::RateLimited(None));
        }
        assert!(rx.try_recv().is_err());
    }
}
