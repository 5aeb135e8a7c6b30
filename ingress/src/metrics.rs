//! Prometheus metrics of one ingress, served as text at `GET /metrics`; the families and their
//! labels are listed in [`switchyard_schemas::metrics`] and docs/metrics.md.
//!
//! `model` is the configured model the request was routed by (never an unknown client string:
//! `none` when it was not routed); `route` the front door's HTTP route (`batch` for batch items);
//! `status` the HTTP status the outcome maps to: 200 on success; for an error the status of its
//! class, also when the error came after a stream had started; 499 when the client went away.
//!
//! Hot path: the series of one (route, model) and of one target are registered once and kept
//! ([`RequestSeries`], [`ProviderSeries`]); a request then only looks them up and updates atomics.
//!
//! **Gateway overhead** ([`HEADER_OVERHEAD`]): a [`Clock`] per HTTP request (in its
//! [`crate::context::RequestContext`]) starts when the body has been read ([`Clock::body_read`]) and accumulates the time the
//! request waited on an attempt (from dispatch to its commit or failure). The overhead is the time
//! to the response head minus that wait: for a streamed answer the time before the first byte
//! (the head goes out at the first content), for a complete answer everything but the upstream.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use switchyard_schemas::Usage;
use switchyard_schemas::metrics::{
    CACHE, CHARGE_USD, CHUNK_GAP, COST_USD, Counter, FALLBACKS, Gauge, Histogram, IN_FLIGHT,
    OVERHEAD, PROVIDER_REQUESTS, PROVIDER_TTFT, REFUSALS, REQUEST_DURATION, REQUESTS, Registry,
    TOKENS, TTFT,
};

pub use switchyard_schemas::metrics::{AUDIT_DROPPED, BATCHES, UNPRICED};

/// Response header: the gateway's own time for this request, ms with 3 decimals (see the module
/// docs; for a streamed answer the time before the first byte only).
pub const HEADER_OVERHEAD: &str = "x-switchyard-overhead-ms";

/// The `depth` label values of [`FALLBACKS`]; deeper moves count as the last.
const DEPTHS: [&str; 5] = ["1", "2", "3", "4", "5+"];

/// The series of one (route, model).
pub struct RequestSeries {
    route: &'static str,
    model: String,
    duration: Histogram,
    ttft: Histogram,
    overhead: Histogram,
    gap: Histogram,
    /// Finished requests by status (few per series).
    statuses: Mutex<Vec<(u16, Counter)>>,
}

/// Tokens of one model by kind: input, cached_input, cache_write, output, reasoning.
type Tokens = [Counter; 5];

/// The series of one target.
pub struct ProviderSeries {
    target: String,
    ttft: Histogram,
    in_flight: Gauge,
    statuses: Mutex<Vec<(u16, Counter)>>,
}

fn by_status(
    registry: &Registry,
    statuses: &Mutex<Vec<(u16, Counter)>>,
    name: &'static str,
    labels: &[(&'static str, &str)],
    status: u16,
) {
    let mut s = statuses.lock();
    if let Some((_, c)) = s.iter().find(|(st, _)| *st == status) {
        c.increment(1);
        return;
    }
    let code = status.to_string();
    let mut all: Vec<(&'static str, &str)> = labels.to_vec();
    all.push(("status", &code));
    let c = registry.counter(name, &all);
    c.increment(1);
    s.push((status, c));
}

struct Inner {
    registry: Registry,
    /// Request series by route, then model.
    requests: RwLock<HashMap<&'static str, HashMap<String, Arc<RequestSeries>>>>,
    providers: RwLock<HashMap<String, Arc<ProviderSeries>>>,
    tokens: RwLock<HashMap<String, Arc<Tokens>>>,
    cache: RwLock<HashMap<&'static str, Counter>>,
}

/// The metrics of one ingress (cheap to clone).
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
    /// A fresh registry of its own.
    pub fn new() -> Self {
        Self::with_registry(Registry::new())
    }

    /// Records into `registry` (shared with the other services of `switchyard up`).
    pub fn with_registry(registry: Registry) -> Self {
        Self {
            inner: Arc::new(Inner {
                registry,
                requests: RwLock::new(HashMap::new()),
                providers: RwLock::new(HashMap::new()),
                tokens: RwLock::new(HashMap::new()),
                cache: RwLock::new(HashMap::new()),
            }),
        }
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The Prometheus text exposition (collectors not run).
    pub fn render(&self) -> String {
        self.inner.registry.render()
    }

    /// The series of (`route`, `model`), registered on first use.
    pub fn request_series(&self, route: &'static str, model: &str) -> Arc<RequestSeries> {
        if let Some(s) = self
            .inner
            .requests
            .read()
            .get(route)
            .and_then(|m| m.get(model))
        {
            return s.clone();
        }
        let r = &self.inner.registry;
        let labels = [("route", route), ("model", model)];
        let series = Arc::new(RequestSeries {
            route,
            model: model.to_owned(),
            duration: r.histogram(REQUEST_DURATION, &labels),
            ttft: r.histogram(TTFT, &labels),
            overhead: r.histogram(OVERHEAD, &labels),
            gap: r.histogram(CHUNK_GAP, &labels),
            statuses: Mutex::new(Vec::new()),
        });
        self.inner
            .requests
            .write()
            .entry(route)
            .or_default()
            .entry(model.to_owned())
            .or_insert(series)
            .clone()
    }

    fn tokens(&self, model: &str) -> Arc<Tokens> {
        if let Some(t) = self.inner.tokens.read().get(model) {
            return t.clone();
        }
        let r = &self.inner.registry;
        let kind = |k: &str| r.counter(TOKENS, &[("model", model), ("kind", k)]);
        let tokens = Arc::new([
            kind("input"),
            kind("cached_input"),
            kind("cache_write"),
            kind("output"),
            kind("reasoning"),
        ]);
        self.inner
            .tokens
            .write()
            .entry(model.to_owned())
            .or_insert(tokens)
            .clone()
    }

    /// The series of `target`, registered on first use.
    pub fn provider_series(&self, target: &str) -> Arc<ProviderSeries> {
        if let Some(s) = self.inner.providers.read().get(target) {
            return s.clone();
        }
        let series = Arc::new(ProviderSeries {
            target: target.to_owned(),
            ttft: self
                .inner
                .registry
                .histogram(PROVIDER_TTFT, &[("target", target)]),
            in_flight: self.inner.registry.gauge(IN_FLIGHT, &[("target", target)]),
            statuses: Mutex::new(Vec::new()),
        });
        self.inner
            .providers
            .write()
            .entry(target.to_owned())
            .or_insert(series)
            .clone()
    }

    fn request_status(&self, s: &RequestSeries, status: u16) {
        by_status(
            &self.inner.registry,
            &s.statuses,
            REQUESTS,
            &[("route", s.route), ("model", &s.model)],
            status,
        );
    }

    fn provider_status(&self, s: &ProviderSeries, status: u16) {
        by_status(
            &self.inner.registry,
            &s.statuses,
            PROVIDER_REQUESTS,
            &[("target", &s.target)],
            status,
        );
    }

    /// Counts one submitted batch by its first status after validation.
    pub fn batch_submitted(&self, status: &'static str) {
        self.inner
            .registry
            .counter(BATCHES, &[("status", status)])
            .increment(1);
    }

    /// Counts one refused request's audit record dropped over the caps ([`AUDIT_DROPPED`]).
    pub fn audit_dropped(&self) {
        self.inner.registry.counter(AUDIT_DROPPED, &[]).increment(1);
    }

    /// Counts one request whose `component` had no price on `side` (`charge` / `cost`).
    pub fn unpriced(&self, side: &'static str, model: &str, component: &str) {
        self.inner
            .registry
            .counter(
                UNPRICED,
                &[("side", side), ("model", model), ("component", component)],
            )
            .increment(1);
    }

    /// Moves the in-flight gauge of `target` by `delta`.
    pub fn in_flight(&self, target: &str, delta: f64) {
        self.provider_series(target).in_flight.increment(delta);
    }

    /// Counts one answer cache outcome (`hit`, `semantic-hit`, `miss`, `bypass`, `store`).
    pub fn cache(&self, outcome: &'static str) {
        if let Some(c) = self.inner.cache.read().get(outcome) {
            c.increment(1);
            return;
        }
        let c = self.inner.registry.counter(CACHE, &[("outcome", outcome)]);
        c.increment(1);
        self.inner.cache.write().insert(outcome, c);
    }

    /// Counts one refusal by a limit or budget of `kind` (see [`REFUSALS`]).
    pub fn refusal(&self, kind: &'static str) {
        self.inner
            .registry
            .counter(REFUSALS, &[("kind", kind)])
            .increment(1);
    }

    /// Records the upstream usage of one request routed by `model` and served by `target`,
    /// charged `charge` USD and costing `cost` USD.
    pub fn usage(&self, model: &str, target: Option<&str>, usage: &Usage, charge: f64, cost: f64) {
        let tokens = self.tokens(model);
        let [input, cached, write, output, reasoning] = &*tokens;
        input.increment(usage.prompt_tokens);
        cached.increment(usage.cached_tokens);
        write.increment(usage.cache_write_tokens);
        output.increment(usage.completion_tokens);
        reasoning.increment(usage.reasoning_tokens);
        let r = &self.inner.registry;
        r.add_usd(CHARGE_USD, "model", model, charge);
        if let Some(t) = target {
            r.add_usd(COST_USD, "target", t, cost);
        }
    }
}

/// The label `kind` of [`REFUSALS`] for an admission error's `code`, if it is a budget refusal
/// (rate-limit refusals are counted by [`crate::rate_limit`], which knows their dimension).
pub fn refusal_kind(code: Option<&str>) -> Option<&'static str> {
    match code? {
        "insufficient_quota" => Some("budget"),
        "budget_store_unavailable" => Some("budget_store_unavailable"),
        "model_not_priced" => Some("model_not_priced"),
        _ => None,
    }
}

/// The per-request clock of the gateway overhead (see the module docs): a cheap handle, shared
/// by the request's context and its [`Outcome`] (which adds the attempts' waits).
#[derive(Clone)]
pub struct Clock(Arc<ClockState>);

struct ClockState {
    /// The `route` label; `None`: not an HTTP model request (a batch item), which records no
    /// overhead and is labelled `batch`.
    route: Option<&'static str>,
    base: Instant,
    /// When the gateway's time started, µs after `base`.
    started_us: AtomicU64,
    /// Time waited on attempts, µs.
    upstream_us: AtomicU64,
    series: OnceLock<Arc<RequestSeries>>,
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clock")
            .field("route", &self.0.route)
            .finish()
    }
}

impl Clock {
    /// A clock started now for a request on `route` ([`route_of`]; `None` for a batch item).
    pub fn new(route: Option<&'static str>) -> Self {
        Self(Arc::new(ClockState {
            route,
            base: Instant::now(),
            started_us: AtomicU64::new(0),
            upstream_us: AtomicU64::new(0),
            series: OnceLock::new(),
        }))
    }

    /// The `route` label (`batch` outside an HTTP model request).
    fn route(&self) -> &'static str {
        self.0.route.unwrap_or("batch")
    }

    /// Restarts the clock: the body has been read (a slow upload is not the gateway's time).
    pub fn body_read(&self) {
        let us = self.0.base.elapsed().as_micros() as u64;
        self.0.started_us.store(us, Ordering::Relaxed);
    }

    /// Adds `d` of waiting on an attempt.
    fn waited(&self, d: Duration) {
        self.0
            .upstream_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// The gateway's own time so far.
    fn overhead(&self) -> Duration {
        let s = &self.0;
        let now = s.base.elapsed().as_micros() as u64;
        let own = now
            .saturating_sub(s.started_us.load(Ordering::Relaxed))
            .saturating_sub(s.upstream_us.load(Ordering::Relaxed));
        Duration::from_micros(own)
    }
}

/// The `route` label of a front-door path (`None`: not a model request).
pub fn route_of(path: &str) -> Option<&'static str> {
    Some(match path {
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/messages" => "/v1/messages",
        "/v1/responses" => "/v1/responses",
        "/v1/embeddings" => "/v1/embeddings",
        _ => return None,
    })
}

/// Ends the clock of the request being handled at its response head: sets
/// [`HEADER_OVERHEAD`] on `resp` and records the overhead. A request that was never routed
/// (a client error before admission, a cache hit) is counted here in [`REQUESTS`] with
/// `model` = `model` when it is a configured model id, else `none`.
pub fn response_head(
    app: &crate::AppState,
    clock: &Clock,
    model: Option<&str>,
    resp: &mut axum::response::Response,
) {
    if clock.0.route.is_none() {
        return;
    }
    let overhead = clock.overhead();
    let series = match clock.0.series.get() {
        Some(s) => s.clone(),
        None => {
            let config = app.config.get();
            let label = model
                .and_then(|m| config.models.iter().find(|c| c.id == m))
                .map_or("none", |m| m.id.as_str());
            let s = app.metrics.request_series(clock.route(), label);
            app.metrics.request_status(&s, resp.status().as_u16());
            s
        }
    };
    series.overhead.record(overhead.as_secs_f64());
    let ms = format!("{:.3}", overhead.as_secs_f64() * 1000.0);
    if let Ok(v) = axum::http::HeaderValue::from_str(&ms) {
        resp.headers_mut().insert(HEADER_OVERHEAD, v);
    }
}

/// The outcome record of one admitted request: [`Outcome::finish`] counts it once; dropping it
/// unfinished counts it as 499 (the client went away).
pub struct Outcome {
    metrics: Metrics,
    clock: Clock,
    series: Arc<RequestSeries>,
    /// The target being tried, and whether its attempt's outcome is still to be counted.
    target: Option<(Arc<ProviderSeries>, bool)>,
    attempt_started: Instant,
    attempts: usize,
    admitted: Instant,
    /// A streamed answer: chunk gaps are recorded.
    stream: bool,
    done: bool,
}

impl Outcome {
    /// Starts the record of a request routed by `model`, admitted at `admitted`, timed by
    /// `clock` (its request's).
    pub fn new(metrics: &Metrics, clock: &Clock, model: &str, admitted: Instant) -> Self {
        let series = metrics.request_series(clock.route(), model);
        let _ = clock.0.series.set(series.clone());
        Self {
            metrics: metrics.clone(),
            clock: clock.clone(),
            series,
            target: None,
            attempt_started: admitted,
            attempts: 0,
            admitted,
            stream: false,
            done: false,
        }
    }

    /// The routed model.
    pub fn model(&self) -> &str {
        &self.series.model
    }

    /// Marks the answer as streamed (chunk gaps are recorded).
    pub fn streamed(&mut self, stream: bool) {
        self.stream = stream;
    }

    /// Records the target now being tried; from the second call on, that is a fallback.
    pub fn attempt(&mut self, target: &str) {
        if self.attempts > 0 {
            let depth = DEPTHS[(self.attempts - 1).min(DEPTHS.len() - 1)];
            self.metrics
                .inner
                .registry
                .counter(
                    FALLBACKS,
                    &[("model", &self.series.model), ("depth", depth)],
                )
                .increment(1);
        }
        self.attempts += 1;
        self.target = Some((self.metrics.provider_series(target), true));
        self.attempt_started = Instant::now();
    }

    /// The attempt being tried failed with `status` (before committing).
    pub fn attempt_failed(&mut self, status: u16) {
        self.clock.waited(self.attempt_started.elapsed());
        if let Some((t, open)) = self.target.as_mut()
            && std::mem::replace(open, false)
        {
            self.metrics.provider_status(t, status);
        }
    }

    /// The attempt being tried committed (its outcome is counted when the request finishes).
    pub fn committed(&self) {
        self.clock.waited(self.attempt_started.elapsed());
    }

    /// Records the time of the first content of the serving attempt.
    pub fn first_content(&self, at: Instant) {
        self.series
            .ttft
            .record(at.saturating_duration_since(self.admitted).as_secs_f64());
        if let Some((t, _)) = &self.target {
            t.ttft.record(
                at.saturating_duration_since(self.attempt_started)
                    .as_secs_f64(),
            );
        }
    }

    /// Records the gap `gap` between two content chunks (streamed answers only).
    pub fn chunk_gap(&self, gap: Duration) {
        if self.stream {
            self.series.gap.record(gap.as_secs_f64());
        }
    }

    /// Counts the request with `status` (once), and the serving attempt with it.
    pub fn finish(&mut self, status: u16) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        self.metrics.request_status(&self.series, status);
        self.series
            .duration
            .record(self.admitted.elapsed().as_secs_f64());
        if let Some((t, open)) = self.target.as_mut()
            && std::mem::replace(open, false)
        {
            self.metrics.provider_status(t, status);
        }
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
            let mut o = Outcome::new(&m, &Clock::new(None), "demo/mock", t0);
            o.attempt("a");
            if status == 503 {
                o.attempt_failed(502);
                o.attempt("b");
            }
            o.committed();
            o.first_content(Instant::now());
            o.finish(status);
        }
        drop(Outcome::new(&m, &Clock::new(None), "demo/mock", t0));
        let text = m.render();
        let r = "route=\"batch\",model=\"demo/mock\"";
        for line in [
            format!("switchyard_requests_total{{{r},status=\"200\"}} 2"),
            format!("switchyard_requests_total{{{r},status=\"503\"}} 1"),
            format!("switchyard_requests_total{{{r},status=\"499\"}} 1"),
            "switchyard_provider_requests_total{target=\"a\",status=\"200\"} 2".into(),
            "switchyard_provider_requests_total{target=\"a\",status=\"502\"} 1".into(),
            "switchyard_provider_requests_total{target=\"b\",status=\"503\"} 1".into(),
            "switchyard_fallbacks_total{model=\"demo/mock\",depth=\"1\"} 1".into(),
            format!("switchyard_time_to_first_token_seconds_count{{{r}}} 3"),
            "switchyard_provider_time_to_first_token_seconds_count{target=\"a\"} 2".into(),
            format!("switchyard_request_duration_seconds_count{{{r}}} 4"),
            "# TYPE switchyard_time_to_first_token_seconds histogram".into(),
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

    /// The per-request cost of the metrics on the hot path (run with `--ignored --nocapture`,
    /// release for real numbers).
    #[test]
    #[ignore]
    fn outcome_cost_per_request() {
        let m = Metrics::new();
        let n = 200_000u32;
        let t0 = Instant::now();
        for _ in 0..n {
            let mut o = Outcome::new(&m, &Clock::new(None), "demo/mock", Instant::now());
            o.streamed(true);
            o.attempt("a");
            o.committed();
            o.first_content(Instant::now());
            for _ in 0..10 {
                o.chunk_gap(Duration::from_micros(50));
            }
            o.finish(200);
        }
        let per = t0.elapsed() / n;
        println!("metrics per request (10 chunks), cached series: {per:?}");
        // The same events with the series looked up by label strings each time (as before).
        let r = m.registry();
        let t0 = Instant::now();
        for _ in 0..n {
            let labels = [("route", "/v1/chat/completions"), ("model", "demo/mock")];
            r.counter(REQUESTS, &[labels[0], labels[1], ("status", "200")])
                .increment(1);
            r.histogram(TTFT, &labels).record(0.1);
            r.histogram(REQUEST_DURATION, &labels).record(0.1);
            r.histogram(OVERHEAD, &labels).record(0.001);
            r.histogram(PROVIDER_TTFT, &[("target", "a")]).record(0.1);
            for _ in 0..10 {
                r.histogram(CHUNK_GAP, &labels).record(0.00005);
            }
        }
        let per = t0.elapsed() / n;
        println!("metrics per request (10 chunks), labels built per event: {per:?}");
    }
}
