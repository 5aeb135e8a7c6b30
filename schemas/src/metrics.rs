//! The Prometheus registry every Switchyard service records into, and the name of every metric
//! family (the one list; docs/metrics.md is its table).
//!
//! Names follow the Prometheus conventions, `<namespace>_<name>_<unit>`: namespace `switchyard`,
//! `_total` for counters, `_seconds` / `_bytes` / `_usd` for units. Label sets are bounded: the
//! request family carries `route` (the HTTP route of the front door), `model` (a configured model
//! id, never a client string) and `status` (the HTTP status); the provider family carries `target`
//! (a configured target id) and `status`; no metric carries both.
//!
//! A [`Registry`] owns its own recorder (not the process-global one), so several gateways in one
//! process (the integration tests) keep separate counts; `switchyard up` shares one registry
//! between its ingress, worker and billing, so its `/metrics` shows every family.
//!
//! Counters in USD are `f64` sums, which the `metrics` crate's `u64` counters cannot hold: the
//! registry keeps them itself ([`Registry::add_usd`]) and appends them to the exposition.

use futures::future::BoxFuture;
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

pub use metrics::{Counter, Gauge, Histogram};

/// Counter `{route, model, status}`: finished requests.
pub const REQUESTS: &str = "switchyard_requests_total";
/// Histogram `{route, model}`: admission to the end of the request, seconds.
pub const REQUEST_DURATION: &str = "switchyard_request_duration_seconds";
/// Histogram `{route, model}`: admission to the first content the client gets, seconds.
pub const TTFT: &str = "switchyard_time_to_first_token_seconds";
/// Histogram `{route, model}`: the gateway's own time before the response head (the
/// `x-switchyard-overhead-ms` header), seconds.
pub const OVERHEAD: &str = "switchyard_gateway_overhead_seconds";
/// Histogram `{route, model}`: gap between consecutive content chunks of a streamed answer, seconds.
pub const CHUNK_GAP: &str = "switchyard_stream_chunk_gap_seconds";
/// Counter `{model, depth}`: moves to a next target; `depth` 1 = the second target tried.
pub const FALLBACKS: &str = "switchyard_fallbacks_total";
/// Counter `{model, kind}`: tokens of upstream usage; `kind` = `input`, `cached_input`,
/// `cache_write`, `output`, `reasoning` (cached input and cache write are parts of input,
/// reasoning a part of output).
pub const TOKENS: &str = "switchyard_tokens_total";
/// USD counter `{model}`: what callers are charged (sale prices), USD.
pub const CHARGE_USD: &str = "switchyard_charge_usd_total";
/// USD counter `{target}`: what the upstream calls cost (cost prices), USD.
pub const COST_USD: &str = "switchyard_cost_usd_total";
/// Counter `{outcome}`: answer cache outcomes: `hit`, `semantic-hit`, `miss`,
/// `bypass` (not looked up: caching off for the route, a `no-cache` directive, the cache
/// unavailable), `store` (an answer sent to be stored).
pub const CACHE: &str = "switchyard_cache_outcomes_total";
/// Counter `{kind}`: requests refused by the caller's limits or budgets: `budget`
/// (`insufficient_quota`), `rate_limit_rpm`, `rate_limit_tpm`, `rate_limit_concurrency` (a key's
/// or tenant's limits, cache hits included),
/// `budget_store_unavailable`, `model_not_priced`, `target_limit` (a target's own RPM/TPM/
/// concurrency, refused by a worker).
pub const REFUSALS: &str = "switchyard_refusals_total";
/// Counter `{status}`: batches submitted, by the status they started in.
pub const BATCHES: &str = "switchyard_batches_total";
/// Counter (no labels): audit records of requests refused before admission that ingress dropped
/// instead of publishing (over its rate or in-flight cap; docs/audit.md).
pub const AUDIT_DROPPED: &str = "switchyard_audit_dropped_total";
/// Counter `{side, model, component}`: requests with tokens that had no price.
pub const UNPRICED: &str = "switchyard_unpriced_total";
/// Counter `{target, status}`: attempts on a target by their outcome's HTTP status.
pub const PROVIDER_REQUESTS: &str = "switchyard_provider_requests_total";
/// Histogram `{target}`: an attempt's dispatch to its first content, seconds.
pub const PROVIDER_TTFT: &str = "switchyard_provider_time_to_first_token_seconds";
/// Gauge `{target}`: requests in flight per target from this ingress.
pub const IN_FLIGHT: &str = "switchyard_in_flight";
/// Counter `{target}`: upstream calls a worker retried on the same target.
pub const RETRIES: &str = "switchyard_provider_retries_total";
/// Counter `{target, state}`: target health changes a worker announced (circuit breaker and
/// 429 cooldown; `healthy`, `degraded` = half-open, `unhealthy` = open or cooling down).
pub const BREAKER: &str = "switchyard_breaker_transitions_total";
/// Counter `{subject}`: failed NATS publishes: `usage` (each failed acknowledged publish
/// attempt of a usage event), `request` (a request ingress could not publish).
pub const NATS_PUBLISH_ERRORS: &str = "switchyard_nats_publish_errors_total";
/// Gauge: usage events in this process's local spool (published neither to JetStream nor
/// dropped), events.
pub const SPOOL_EVENTS: &str = "switchyard_usage_spool_events";
/// Gauge: size of this process's local spool files, bytes.
pub const SPOOL_BYTES: &str = "switchyard_usage_spool_bytes";
/// Gauge: age of the oldest usage event billing has not acknowledged, seconds (0 when none).
pub const BILLING_LAG: &str = "switchyard_billing_lag_seconds";
/// Gauge: usage messages billing has not acknowledged (pending + delivered unacked), messages.
pub const BILLING_PENDING: &str = "switchyard_billing_pending_messages";

const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Gateway overhead is sub-millisecond to a few ms when healthy.
const OVERHEAD_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
const GAP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Work run before each scrape ([`Registry::collect`]): reads a state (spool size, billing
/// lag) into gauges.
pub type Collector = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Longest wait for the collectors of one scrape; a slower one shows its previous value.
const COLLECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One USD family: its label name and the sums by label value, USD.
type UsdFamily = (&'static str, HashMap<String, f64>);

struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// USD sums by family, then label value.
    usd: Mutex<BTreeMap<&'static str, UsdFamily>>,
    collectors: Mutex<Vec<Collector>>,
}

/// A metrics registry (cheap to clone; clones share the counts).
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registry")
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// A fresh registry with the histogram buckets of each family and every family described.
    pub fn new() -> Self {
        let with_buckets = || {
            PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(TTFT.into()), TTFT_BUCKETS)?
                .set_buckets_for_metric(Matcher::Full(PROVIDER_TTFT.into()), TTFT_BUCKETS)?
                .set_buckets_for_metric(Matcher::Full(REQUEST_DURATION.into()), DURATION_BUCKETS)?
                .set_buckets_for_metric(Matcher::Full(OVERHEAD.into()), OVERHEAD_BUCKETS)?
                .set_buckets_for_metric(Matcher::Full(CHUNK_GAP.into()), GAP_BUCKETS)
        };
        let recorder = match with_buckets() {
            Ok(b) => b.build_recorder(),
            Err(e) => {
                tracing::warn!(error = %e, "histogram buckets refused; exporting summaries");
                PrometheusBuilder::new().build_recorder()
            }
        };
        let handle = recorder.handle();
        let r = Self {
            inner: Arc::new(Inner {
                recorder,
                handle,
                usd: Mutex::new(BTreeMap::new()),
                collectors: Mutex::new(Vec::new()),
            }),
        };
        r.with(describe);
        r
    }

    /// Runs `f` with this registry as the `metrics` crate's recorder.
    pub fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&self.inner.recorder, f)
    }

    /// The counter `name{labels}` (register once and keep the handle on hot paths: this
    /// allocates the key).
    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        let labels = owned(labels);
        self.with(|| metrics::counter!(name, &labels))
    }

    /// The gauge `name{labels}`.
    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        let labels = owned(labels);
        self.with(|| metrics::gauge!(name, &labels))
    }

    /// The histogram `name{labels}` (values in seconds for the `_seconds` families).
    pub fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        let labels = owned(labels);
        self.with(|| metrics::histogram!(name, &labels))
    }

    /// Adds `usd` to the USD counter `name{label="value"}` (one label per USD family).
    pub fn add_usd(&self, name: &'static str, label: &'static str, value: &str, usd: f64) {
        if !usd.is_finite() || usd <= 0.0 {
            return;
        }
        let mut families = self.inner.usd.lock();
        let (_, series) = families
            .entry(name)
            .or_insert_with(|| (label, HashMap::new()));
        match series.get_mut(value) {
            Some(v) => *v += usd,
            None => {
                series.insert(value.to_owned(), usd);
            }
        }
    }

    /// Adds work run before each scrape.
    pub fn add_collector(&self, c: Collector) {
        self.inner.collectors.lock().push(c);
    }

    /// Runs the collectors (at most [`COLLECT_TIMEOUT`] in all).
    pub async fn collect(&self) {
        let collectors: Vec<Collector> = self.inner.collectors.lock().clone();
        let all = futures::future::join_all(collectors.iter().map(|c| c()));
        if tokio::time::timeout(COLLECT_TIMEOUT, all).await.is_err() {
            tracing::warn!("metrics collectors timed out; their previous values are shown");
        }
    }

    /// The Prometheus text exposition (version 0.0.4) without running the collectors.
    pub fn render(&self) -> String {
        let mut text = self.inner.handle.render();
        for (name, (label, series)) in self.inner.usd.lock().iter() {
            let help = match *name {
                CHARGE_USD => "What callers are charged at sale prices, USD.",
                _ => "What the upstream calls cost at cost prices, USD.",
            };
            let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} counter");
            let mut sorted: Vec<_> = series.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            for (value, usd) in sorted {
                let value = value.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(text, "{name}{{{label}=\"{value}\"}} {usd}");
            }
        }
        text
    }

    /// Runs the collectors, then renders.
    pub async fn scrape(&self) -> String {
        self.collect().await;
        self.render()
    }
}

fn owned(labels: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        REQUESTS,
        "Finished requests by front-door route, routed model and HTTP status."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Admission to the end of the request."
    );
    describe_histogram!(TTFT, Unit::Seconds, "Admission to the first content.");
    describe_histogram!(
        OVERHEAD,
        Unit::Seconds,
        "The gateway's own time before the response head (not waiting on the upstream)."
    );
    describe_histogram!(
        CHUNK_GAP,
        Unit::Seconds,
        "Gap between consecutive content chunks of a streamed answer."
    );
    describe_counter!(
        FALLBACKS,
        "Moves to a next target, by model and depth (1 = second target)."
    );
    describe_counter!(TOKENS, "Tokens of upstream usage by model and kind.");
    describe_counter!(CACHE, "Answer cache outcomes.");
    describe_counter!(REFUSALS, "Requests refused by limits or budgets, by kind.");
    describe_counter!(BATCHES, "Batches submitted, by the status they started in.");
    describe_counter!(
        AUDIT_DROPPED,
        "Audit records of refused requests dropped over the publish caps."
    );
    describe_counter!(
        UNPRICED,
        "Requests with tokens that had no price, by side, model and component."
    );
    describe_counter!(
        PROVIDER_REQUESTS,
        "Attempts on a target by their outcome's HTTP status."
    );
    describe_histogram!(
        PROVIDER_TTFT,
        Unit::Seconds,
        "Dispatch of an attempt to its first content."
    );
    describe_gauge!(
        IN_FLIGHT,
        "Requests in flight per target from this ingress."
    );
    describe_counter!(RETRIES, "Upstream calls retried on the same target.");
    describe_counter!(
        BREAKER,
        "Circuit-breaker state changes by target and new state."
    );
    describe_counter!(
        NATS_PUBLISH_ERRORS,
        "Failed NATS publishes by subject kind."
    );
    describe_gauge!(SPOOL_EVENTS, "Usage events in the local spool.");
    describe_gauge!(SPOOL_BYTES, Unit::Bytes, "Size of the local spool files.");
    describe_gauge!(
        BILLING_LAG,
        Unit::Seconds,
        "Age of the oldest usage event billing has not acknowledged."
    );
    describe_gauge!(
        BILLING_PENDING,
        "Usage messages billing has not acknowledged."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usd_counters_render_as_counters() {
        let r = Registry::new();
        r.add_usd(CHARGE_USD, "model", "demo/mock", 0.25);
        r.add_usd(CHARGE_USD, "model", "demo/mock", 0.5);
        r.add_usd(COST_USD, "target", "a\"b", 0.125);
        r.add_usd(COST_USD, "target", "zero", 0.0);
        let text = r.render();
        for line in [
            "# TYPE switchyard_charge_usd_total counter",
            "switchyard_charge_usd_total{model=\"demo/mock\"} 0.75",
            "switchyard_cost_usd_total{target=\"a\\\"b\"} 0.125",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
        assert!(!text.contains("zero"));
        assert!(!Registry::new().render().contains(CHARGE_USD));
    }
}
