//! What this ingress knows about each target, for ordering candidates.
//!
//! * [`HealthView`]: the latest [`HealthEvent`] per target and worker from `<prefix>.health.>`
//!   (one subscription per ingress process), each forgotten after [`HealthSettings::expiry`]
//!   without news. Breakers live in each worker, so the workers' reports are combined: all
//!   `unhealthy` → `unhealthy` (skipped), all `healthy` → `healthy`, a mix → `degraded` (tried
//!   last: a request may still land on a worker that serves it). An `unhealthy` report counts as
//!   `degraded` once its `retry_after_ms` has passed (the worker lets probes through again, even if
//!   its `degraded` event was missed). This is combined with a passive view: after
//!   [`HealthSettings::passive_failures`] consecutive retryable failures seen by this ingress a
//!   target is `degraded` here for [`HealthSettings::passive_hold`] (or until it serves again).
//!   The effective state is the worse of the two.
//! * [`TargetStats`]: requests in flight per target from this ingress (for `least_busy` and the
//!   `switchyard_in_flight` gauge) and the EWMA (α = [`EWMA_ALPHA`]) of the time to first content.

use crate::metrics::Metrics;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::health::{HealthEvent, HealthState};
use switchyard_schemas::subjects::Subjects;

/// Smoothing factor of the TTFT moving average: each new sample weighs 0.2.
pub const EWMA_ALPHA: f64 = 0.2;

/// Health view tuning.
#[derive(Debug, Clone, Copy)]
pub struct HealthSettings {
    /// A reported state without news for this long is forgotten (healthy again).
    pub expiry: Duration,
    /// Consecutive retryable failures after which this ingress marks a target degraded.
    pub passive_failures: u32,
    /// How long a passive `degraded` lasts without a success.
    pub passive_hold: Duration,
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            expiry: Duration::from_secs(60),
            passive_failures: 3,
            passive_hold: Duration::from_secs(30),
        }
    }
}

/// One worker's report about one target.
#[derive(Debug, Clone)]
struct Report {
    state: HealthState,
    /// The event's machine-readable first word (`breaker_open`, `provider_cooldown`, ...).
    reason: String,
    ts_ms: u64,
    /// When this ingress forgets the report.
    until: Instant,
    /// For `unhealthy`: when the worker lets probes through again.
    probe_at: Option<Instant>,
}

impl Report {
    fn state_at(&self, now: Instant) -> Option<HealthState> {
        if now >= self.until {
            return None;
        }
        match (self.state, self.probe_at) {
            (HealthState::Unhealthy, Some(at)) if now >= at => Some(HealthState::Degraded),
            (s, _) => Some(s),
        }
    }
}

#[derive(Debug, Default)]
struct Entry {
    /// Latest report per worker.
    reports: HashMap<String, Report>,
    /// Consecutive retryable failures seen here.
    failures: u32,
    /// Passive `degraded` until then.
    passive_until: Option<Instant>,
}

/// One worker's latest unexpired report about a target ([`HealthView::worker_reports`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerReport {
    /// The reporting worker's id.
    pub worker: String,
    /// Its state now (an `unhealthy` report past its `retry_after_ms` reads `degraded`).
    pub state: HealthState,
    /// The event's reason word: `breaker_open`, `breaker_half_open`, `breaker_closed`,
    /// `provider_cooldown` or `cooldown_over` ([`HealthEvent::reason`]).
    pub reason: String,
    /// When the worker saw the change, ms since the Unix epoch.
    pub ts_ms: u64,
}

/// Latest known health per target (see the module docs).
#[derive(Debug, Default)]
pub struct HealthView {
    entries: Mutex<HashMap<String, Entry>>,
    settings: HealthSettings,
}

impl HealthView {
    /// An empty view: every target healthy.
    pub fn new(settings: HealthSettings) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            settings,
        }
    }

    /// The effective state of `target` now.
    pub fn state(&self, target: &str) -> HealthState {
        self.state_at(target, Instant::now())
    }

    fn state_at(&self, target: &str, now: Instant) -> HealthState {
        let entries = self.entries.lock();
        let Some(e) = entries.get(target) else {
            return HealthState::Healthy;
        };
        let mut states = e
            .reports
            .values()
            .filter_map(|r| r.state_at(now))
            .peekable();
        let reported = match states.peek().copied() {
            None => HealthState::Healthy,
            Some(first) => {
                if states.all(|s| s == first) {
                    first
                } else {
                    HealthState::Degraded
                }
            }
        };
        let passive = match e.passive_until {
            Some(until) if now < until => HealthState::Degraded,
            _ => HealthState::Healthy,
        };
        worse(reported, passive)
    }

    /// The unexpired reports of each worker about `target`, by worker id: what the dashboard shows
    /// as per-worker breaker states.
    pub fn worker_reports(&self, target: &str) -> Vec<WorkerReport> {
        let now = Instant::now();
        let entries = self.entries.lock();
        let mut out: Vec<WorkerReport> = entries
            .get(target)
            .map(|e| {
                e.reports
                    .iter()
                    .filter_map(|(worker, r)| {
                        r.state_at(now).map(|state| WorkerReport {
                            worker: worker.clone(),
                            state,
                            reason: r.reason.clone(),
                            ts_ms: r.ts_ms,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.worker.cmp(&b.worker));
        out
    }

    /// Whether this ingress holds `target` passively degraded (consecutive failures it saw).
    pub fn passively_degraded(&self, target: &str) -> bool {
        let now = Instant::now();
        self.entries
            .lock()
            .get(target)
            .and_then(|e| e.passive_until)
            .is_some_and(|until| now < until)
    }

    /// Applies a reported event; an event older than the one held from the same worker is ignored.
    pub fn apply(&self, event: &HealthEvent) {
        self.apply_at(event, Instant::now());
    }

    fn apply_at(&self, event: &HealthEvent, now: Instant) {
        let mut entries = self.entries.lock();
        let e = entries.entry(event.target.clone()).or_default();
        if let Some(held) = e.reports.get(&event.worker)
            && now < held.until
            && event.ts_ms < held.ts_ms
        {
            return;
        }
        let probe_at = match event.state {
            HealthState::Unhealthy => event
                .retry_after_ms
                .and_then(|ms| now.checked_add(Duration::from_millis(ms))),
            _ => None,
        };
        e.reports.insert(
            event.worker.clone(),
            Report {
                state: event.state,
                reason: event
                    .reason
                    .split(':')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
                ts_ms: event.ts_ms,
                until: now + self.settings.expiry,
                probe_at,
            },
        );
    }

    /// Records a retryable failure of `target`; returns true when it just turned degraded here.
    pub fn failure(&self, target: &str) -> bool {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        let e = entries.entry(target.to_owned()).or_default();
        e.failures += 1;
        if e.failures >= self.settings.passive_failures {
            let was = e.passive_until.is_some_and(|u| now < u);
            e.passive_until = Some(now + self.settings.passive_hold);
            return !was;
        }
        false
    }

    /// Records a success of `target`: clears the passive failure count and state.
    pub fn success(&self, target: &str) {
        let mut entries = self.entries.lock();
        if let Some(e) = entries.get_mut(target) {
            e.failures = 0;
            e.passive_until = None;
        }
    }

    /// Subscribes `<prefix>.health.>` and applies every event, in a task on `tasks`, until the
    /// connection closes or `stop` fires. The subscription is confirmed with the server before
    /// this returns.
    pub async fn subscribe(
        self: &Arc<Self>,
        nats: &async_nats::Client,
        subjects: &Subjects,
        tasks: &tokio_util::task::TaskTracker,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), async_nats::SubscribeError> {
        let mut sub = nats
            .subscribe(format!("{}.health.>", subjects.prefix()))
            .await?;
        if !switchyard_publish::sync_with_server(nats).await {
            tracing::warn!("could not confirm the health subscription with the NATS server");
        }
        let view = self.clone();
        tasks.spawn(async move {
            while let Some(msg) = tokio::select! {
                msg = sub.next() => msg,
                _ = stop.cancelled() => None,
            } {
                match serde_json::from_slice::<HealthEvent>(&msg.payload) {
                    Ok(event) => {
                        tracing::info!(target_id = %event.target, state = event.state.as_str(),
                            reason = %event.reason, worker = %event.worker, "target health");
                        view.apply(&event);
                    }
                    Err(e) => {
                        tracing::warn!(subject = %msg.subject, error = %e, "bad health event")
                    }
                }
            }
        });
        Ok(())
    }
}

fn worse(a: HealthState, b: HealthState) -> HealthState {
    let rank = |s| match s {
        HealthState::Healthy => 0,
        HealthState::Degraded => 1,
        HealthState::Unhealthy => 2,
    };
    if rank(a) >= rank(b) { a } else { b }
}

#[derive(Debug, Default, Clone, Copy)]
struct Stat {
    in_flight: u64,
    ttft_ms: Option<f64>,
}

/// Per-target load and latency as seen by this ingress.
#[derive(Debug, Default)]
pub struct TargetStats {
    inner: Mutex<HashMap<String, Stat>>,
}

impl TargetStats {
    /// Requests in flight to `target` from this ingress.
    pub fn in_flight(&self, target: &str) -> u64 {
        self.inner.lock().get(target).map_or(0, |s| s.in_flight)
    }

    /// Requests in flight to every target from this ingress (batch items included).
    pub fn total_in_flight(&self) -> u64 {
        self.inner.lock().values().map(|s| s.in_flight).sum()
    }

    /// EWMA of `target`'s time to first content, ms; `None` before the first sample.
    pub fn ttft_ms(&self, target: &str) -> Option<f64> {
        self.inner.lock().get(target).and_then(|s| s.ttft_ms)
    }

    /// Adds one TTFT sample.
    pub fn record_ttft(&self, target: &str, ms: f64) {
        let mut inner = self.inner.lock();
        let s = inner.entry(target.to_owned()).or_default();
        s.ttft_ms = Some(match s.ttft_ms {
            Some(prev) => EWMA_ALPHA * ms + (1.0 - EWMA_ALPHA) * prev,
            None => ms,
        });
    }

    /// Counts one request in flight to `target` until the guard drops.
    pub fn start(self: &Arc<Self>, target: &str, metrics: &Metrics) -> InFlight {
        self.inner
            .lock()
            .entry(target.to_owned())
            .or_default()
            .in_flight += 1;
        metrics.in_flight(target, 1.0);
        InFlight {
            stats: self.clone(),
            metrics: metrics.clone(),
            target: target.to_owned(),
        }
    }
}

/// One request in flight to a target; dropping it ends the count.
pub struct InFlight {
    stats: Arc<TargetStats>,
    metrics: Metrics,
    target: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(s) = self.stats.inner.lock().get_mut(&self.target) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
        self.metrics.in_flight(&self.target, -1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(state: HealthState, ts_ms: u64) -> HealthEvent {
        from("w", state, ts_ms, None)
    }

    fn from(
        worker: &str,
        state: HealthState,
        ts_ms: u64,
        retry_after_ms: Option<u64>,
    ) -> HealthEvent {
        HealthEvent {
            target: "t".into(),
            state,
            reason: "breaker_open".into(),
            ts_ms,
            worker: worker.into(),
            retry_after_ms,
        }
    }

    #[test]
    fn reported_state_holds_until_newer_news_or_expiry() {
        let v = HealthView::new(HealthSettings::default());
        let t0 = Instant::now();
        assert_eq!(v.state_at("t", t0), HealthState::Healthy);
        v.apply_at(&event(HealthState::Unhealthy, 10), t0);
        assert_eq!(v.state_at("t", t0), HealthState::Unhealthy);
        // An older event arriving late changes nothing.
        v.apply_at(&event(HealthState::Healthy, 5), t0);
        assert_eq!(v.state_at("t", t0), HealthState::Unhealthy);
        v.apply_at(&event(HealthState::Degraded, 20), t0);
        assert_eq!(v.state_at("t", t0), HealthState::Degraded);
        // 60 s without news: healthy again.
        assert_eq!(
            v.state_at("t", t0 + Duration::from_secs(59)),
            HealthState::Degraded
        );
        assert_eq!(
            v.state_at("t", t0 + Duration::from_secs(60)),
            HealthState::Healthy
        );
        assert_eq!(v.state_at("other", t0), HealthState::Healthy);
    }

    #[test]
    fn workers_reports_combine_and_retry_after_allows_probes() {
        let v = HealthView::new(HealthSettings::default());
        let t0 = Instant::now();
        v.apply_at(&from("w1", HealthState::Unhealthy, 1, Some(15_000)), t0);
        v.apply_at(&from("w2", HealthState::Unhealthy, 2, None), t0);
        assert_eq!(v.state_at("t", t0), HealthState::Unhealthy);
        // w1 lets probes through after 15 s: the target is worth a last try again.
        let t15 = t0 + Duration::from_secs(15);
        assert_eq!(v.state_at("t", t15), HealthState::Degraded);
        // One worker healthy, one not: degraded.
        v.apply_at(&from("w1", HealthState::Healthy, 3, None), t0);
        assert_eq!(v.state_at("t", t0), HealthState::Degraded);
        v.apply_at(&from("w2", HealthState::Healthy, 4, None), t0);
        assert_eq!(v.state_at("t", t0), HealthState::Healthy);
    }

    #[test]
    fn consecutive_failures_degrade_until_a_success() {
        let v = HealthView::new(HealthSettings::default());
        assert!(!v.failure("t"));
        assert!(!v.failure("t"));
        assert_eq!(v.state("t"), HealthState::Healthy);
        assert!(v.failure("t"));
        assert_eq!(v.state("t"), HealthState::Degraded);
        assert!(!v.failure("t"));
        v.success("t");
        assert_eq!(v.state("t"), HealthState::Healthy);
        // The count restarted.
        assert!(!v.failure("t"));
        assert_eq!(v.state("t"), HealthState::Healthy);
        // Reported unhealthy beats passive degraded.
        v.failure("t");
        v.failure("t");
        v.apply(&event(HealthState::Unhealthy, 1));
        assert_eq!(v.state("t"), HealthState::Unhealthy);
    }

    #[test]
    fn ewma_and_in_flight() {
        let s = Arc::new(TargetStats::default());
        let m = Metrics::new();
        assert_eq!(s.ttft_ms("t"), None);
        s.record_ttft("t", 100.0);
        assert_eq!(s.ttft_ms("t"), Some(100.0));
        s.record_ttft("t", 200.0);
        assert_eq!(s.ttft_ms("t"), Some(120.0));
        let a = s.start("t", &m);
        let b = s.start("t", &m);
        assert_eq!(s.in_flight("t"), 2);
        drop(a);
        assert_eq!(s.in_flight("t"), 1);
        drop(b);
        assert_eq!(s.in_flight("t"), 0);
        assert!(m.render().contains("switchyard_in_flight{target=\"t\"} 0"));
    }
}
