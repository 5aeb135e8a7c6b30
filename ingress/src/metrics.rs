//! Prometheus metrics of one ingress, served as text at `GET /metrics`.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `switchyard_requests_total` | counter | `model`, `target` (`none` when no target was tried), `status` |
//! | `switchyard_fallbacks_total` | counter | `model` |
//! | `switchyard_ttft_seconds` | histogram | `model`, `target` |
//! | `switchyard_request_duration_seconds` | histogram | `model` |
//! | `switchyard_in_flight` | gauge | `target` |
//! | `switchyard_batches_total` | counter | `status` (`in_progress` when queued, `failed` when validation failed) |
//!
//! `model` is the configured model the request was routed by (never an unknown client string).
//! `status` is the HTTP status the outcome maps to: 200 on success; for an error the status of its
//! class, also when the error came after a stream had started; 499 when the client went away.
//! `switchyard_ttft_seconds` runs from admission to the first content the client gets;
//! the request duration from admission to the end.
//!
//! Each [`Metrics`] owns its own recorder (not the process-global one), so several gateways in one
//! process — the integration tests — keep separate counts.

use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests by outcome.
pub const REQUESTS: &str = "switchyard_requests_total";
/// Moves to a next target.
pub const FALLBACKS: &str = "switchyard_fallbacks_total";
/// Admission to first content.
pub const TTFT: &str = "switchyard_ttft_seconds";
/// Admission to end.
pub const DURATION: &str = "switchyard_request_duration_seconds";
/// Requests in flight per target.
pub const IN_FLIGHT: &str = "switchyard_in_flight";
/// Batches submitted, by the status they started in.
pub const BATCHES: &str = "switchyard_batches_total";
/// Counter: requests with tokens that had no price, by `side` (`charge` = sale price,
/// `cost` = the upstream model's cost price), `model` (standard or upstream id) and `component`
/// (`model`, `cache_write_1h`, `audio_input`, `audio_output`, `service_tier`).
pub const UNPRICED: &str = "switchyard_unpriced_total";

const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

/// The metrics registry of one ingress (cheap to clone).
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with the histogram buckets above.
    pub fn new() -> Self {
        let with_buckets = || {
            PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(TTFT.into()), TTFT_BUCKETS)?
                .set_buckets_for_metric(Matcher::Full(DURATION.into()), DURATION_BUCKETS)
        };
        let recorder = match with_buckets() {
            Ok(b) => b.build_recorder(),
            Err(e) => {
                tracing::warn!(error = %e, "histogram buckets refused; exporting summaries");
                PrometheusBuilder::new().build_recorder()
            }
        };
        let handle = recorder.handle();
        let m = Self {
            inner: Arc::new(Inner { recorder, handle }),
        };
        m.with(|| {
            metrics::describe_counter!(
                REQUESTS,
                "Requests by routed model, serving target and status."
            );
            metrics::describe_counter!(
                FALLBACKS,
                "Moves to the next target after a failed attempt."
            );
            metrics::describe_histogram!(
                TTFT,
                metrics::Unit::Seconds,
                "Time from admission to the first content."
            );
            metrics::describe_histogram!(
                DURATION,
                metrics::Unit::Seconds,
                "Time from admission to the end of the request."
            );
            metrics::describe_counter!(
                UNPRICED,
                "Requests with tokens that had no price, by side, model and component."
            );
            metrics::describe_gauge!(
                IN_FLIGHT,
                "Requests in flight per target from this ingress."
            );
        });
        m
    }

    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&self.inner.recorder, f)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.inner.handle.render()
    }

    /// Counts one finished request.
    pub fn request(&self, model: &str, target: &str, status: u16) {
        let labels = [
            ("model", model.to_owned()),
            ("target", target.to_owned()),
            ("status", status.to_string()),
        ];
        self.with(|| metrics::counter!(REQUESTS, &labels).increment(1));
    }

    /// Counts one submitted batch by its first status after validation.
    pub fn batch_submitted(&self, status: &'static str) {
        let labels = [("status", status)];
        self.with(|| metrics::counter!(BATCHES, &labels).increment(1));
    }

    /// Counts one move to a next target.
    pub fn fallback(&self, model: &str) {
        let labels = [("model", model.to_owned())];
        self.with(|| metrics::counter!(FALLBACKS, &labels).increment(1));
    }

    /// Records a time to first content.
    pub fn ttft(&self, model: &str, target: &str, d: Duration) {
        let labels = [("model", model.to_owned()), ("target", target.to_owned())];
        self.with(|| metrics::histogram!(TTFT, &labels).record(d.as_secs_f64()));
    }

    /// Records a request duration.
    pub fn duration(&self, model: &str, d: Duration) {
        let labels = [("model", model.to_owned())];
        self.with(|| metrics::histogram!(DURATION, &labels).record(d.as_secs_f64()));
    }

    /// Counts one request whose `component` had no price on `side` (`charge` / `cost`).
    pub fn unpriced(&self, side: &'static str, model: &str, component: &str) {
        let labels = [
            ("side", side.to_owned()),
            ("model", model.to_owned()),
            ("component", component.to_owned()),
        ];
        self.with(|| metrics::counter!(UNPRICED, &labels).increment(1));
    }

    /// Moves the in-flight gauge of `target` by `delta`.
    pub fn in_flight(&self, target: &str, delta: f64) {
        let labels = [("target", target.to_owned())];
        self.with(|| metrics::gauge!(IN_FLIGHT, &labels).increment(delta));
    }
}

/// The outcome record of one request: [`Outcome::finish`] counts it once; dropping it unfinished
/// counts it as 499 (the client went away).
pub struct Outcome {
    metrics: Metrics,
    model: String,
    target: Option<String>,
    admitted: Instant,
    done: bool,
}

impl Outcome {
    /// Starts the record of a request routed by `model`, admitted at `admitted`.
    pub fn new(metrics: &Metrics, model: &str, admitted: Instant) -> Self {
        Self {
            metrics: metrics.clone(),
            model: model.to_owned(),
            target: None,
            admitted,
            done: false,
        }
    }

    /// The routed model.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Records the target now being tried; from the second call on, that is a fallback.
    pub fn attempt(&mut self, target: &str) {
        if self.target.is_some() {
            self.metrics.fallback(&self.model);
        }
        self.target = Some(target.to_owned());
    }

    /// Records the time of the first content of the serving attempt.
    pub fn first_content(&self, at: Instant) {
        if let Some(t) = &self.target {
            self.metrics
                .ttft(&self.model, t, at.saturating_duration_since(self.admitted));
        }
    }

    /// Counts the request with `status` (once).
    pub fn finish(&mut self, status: u16) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let target = self.target.as_deref().unwrap_or("none");
        self.metrics.request(&self.model, target, status);
        self.metrics.duration(&self.model, self.admitted.elapsed());
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        self.finish(499);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_exact_counts() {
        let m = Metrics::new();
        let t0 = Instant::now();
        for status in [200, 200, 503] {
            let mut o = Outcome::new(&m, "demo/mock", t0);
            o.attempt("a");
            if status == 503 {
                o.attempt("b");
            }
            o.first_content(Instant::now());
            o.finish(status);
        }
        drop(Outcome::new(&m, "demo/mock", t0));
        let text = m.render();
        for line in [
            "switchyard_requests_total{model=\"demo/mock\",target=\"a\",status=\"200\"} 2",
            "switchyard_requests_total{model=\"demo/mock\",target=\"b\",status=\"503\"} 1",
            "switchyard_requests_total{model=\"demo/mock\",target=\"none\",status=\"499\"} 1",
            "switchyard_fallbacks_total{model=\"demo/mock\"} 1",
            "switchyard_ttft_seconds_count{model=\"demo/mock\",target=\"a\"} 2",
            "switchyard_request_duration_seconds_count{model=\"demo/mock\"} 4",
            "# TYPE switchyard_ttft_seconds histogram",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
        // A second registry counts on its own.
        assert!(
            !Metrics::new()
                .render()
                .contains("switchyard_requests_total{")
        );
    }
}
