//! `switchyard cache bench`: lookup latency of one instance, in process (the NATS hop adds about
//! 0.1 ms on loopback and is not the cache's cost).
//!
//! The index is filled with `entries` answers spread over `scopes` scopes; then every lookup is
//! timed end to end ([`crate::Service::lookup`]: canonicalise, hash, exact probe, and for the
//! semantic path embed, scan the scope, verify):
//!
//! * **exact** — the same request as a stored one;
//! * **semantic, short** — a reworded question of about 12 tokens (embedding included);
//! * **semantic, 256 tokens** — a reworded prompt of about 256 tokens (the speed target's size);
//! * **miss, empty scope** — a question on a route (scope) with no entries: no embedding needed.

use crate::embed::Embed;
use crate::service::{Service, ServiceOptions};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::FinishReason;
use switchyard_schemas::cache::{CacheKey, CachedAnswer, LookupRequest, StoreRequest};
use switchyard_schemas::subjects::Subjects;

/// Latency percentiles of one path, milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    /// Which path.
    pub path: String,
    /// Lookups timed.
    pub n: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
    /// Outcome of the last lookup (`hit`, `semantic-hit`, `miss`).
    pub outcome: String,
}

fn percentiles(path: &str, mut v: Vec<Duration>, outcome: &str) -> Percentiles {
    v.sort();
    let at = |q: f64| {
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1;
        v.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Percentiles {
        path: path.to_owned(),
        n: v.len(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        max_ms: v.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
        outcome: outcome.to_owned(),
    }
}

fn key(route: &str, text: &str) -> CacheKey {
    CacheKey {
        route: route.to_owned(),
        messages: vec![switchyard_schemas::request::Message {
            role: switchyard_schemas::request::Role::User,
            content: Some(switchyard_schemas::request::Content::Text(text.to_owned())),
            name: None,
            tool_calls: vec![],
            tool_call_id: None,
            thinking_blocks: Vec::new(),
            cache_control: None,
        }],
        tools: vec![],
        tenant: None,
        tool_choice: None,
        params: Default::default(),
    }
}

const TOPICS: &[&str] = &[
    "reset my password",
    "change my email address",
    "cancel my subscription",
    "download my invoice",
    "enable dark mode",
    "contact customer support",
    "update my billing address",
    "export my data",
    "delete my account",
    "invite a teammate",
];

/// A long prompt of about 256 model tokens around `topic`.
fn long_prompt(topic: &str, variant: bool) -> String {
    let lead = if variant {
        format!("Could you explain how I can {topic}?")
    } else {
        format!("How do I {topic}?")
    };
    let filler = "I have been using the web application for a while and I read the help pages \
        but the settings page looks different from the screenshots and I am not sure which menu \
        holds the option I need so a clear walkthrough would be appreciated";
    let mut s = lead;
    while s.split_whitespace().count() < 185 {
        s.push(' ');
        s.push_str(filler);
    }
    s.split_whitespace().take(185).collect::<Vec<_>>().join(" ")
}

/// Runs the benchmark: `entries` stored answers over `scopes` routes, `n` timed lookups per path.
pub fn run(
    embedder: Arc<dyn Embed>,
    entries: usize,
    scopes: usize,
    n: usize,
) -> Result<Vec<Percentiles>, String> {
    let opts = ServiceOptions::new(Subjects::default(), Some(embedder));
    let svc = Service::new(ServiceOptions {
        max_entries: entries.max(1) * 2,
        ..opts
    });
    let answer = CachedAnswer {
        chunks: vec!["Open Settings, then Account.".into()],
        tool_calls: vec![],
        finish_reason: FinishReason::Stop,
        usage: Default::default(),
    };
    let scopes = scopes.max(1);
    // Fill: distinct questions per scope (vectors embedded once, in batches of the same texts).
    let per_scope = entries.div_ceil(scopes);
    let filled = Instant::now();
    let mut stored = 0;
    'fill: for s in 0..scopes {
        for i in 0..per_scope {
            if stored >= entries {
                break 'fill;
            }
            let topic = TOPICS[i % TOPICS.len()];
            let text = if i < TOPICS.len() {
                format!("How do I {topic}?")
            } else {
                format!("How do I {topic} for workspace {i}?")
            };
            let req = StoreRequest {
                key: key(&format!("route-{s}"), &text),
                answer: answer.clone(),
                target: None,
                upstream_model: Some("m".into()),
                ttl_s: 3600,
                semantic: true,
            };
            let entry = svc.prepare(&req).ok_or("store rejected")?;
            svc.apply(entry);
            stored += 1;
        }
    }
    tracing::info!(
        entries = stored,
        ms = filled.elapsed().as_millis() as u64,
        "bench index filled"
    );
    let threshold = 0.5;
    let time = |text: &dyn Fn(usize) -> String, route: &str| {
        let mut v = Vec::with_capacity(n);
        let mut last = String::new();
        for i in 0..n {
            let req = LookupRequest {
                key: key(route, &text(i)),
                semantic: true,
                threshold,
            };
            let t = Instant::now();
            let r = svc.lookup(&req);
            v.push(t.elapsed());
            last = r.outcome.as_str().to_owned();
        }
        (v, last)
    };
    // Warm-up.
    let _ = time(&|i| format!("warm up {i}"), "route-0");
    let mut out = Vec::new();
    let (v, o) = time(
        &|i| format!("How do I {}?", TOPICS[i % TOPICS.len()]),
        "route-0",
    );
    out.push(percentiles("exact", v, &o));
    let (v, o) = time(
        &|i| format!("How can I {}", TOPICS[i % TOPICS.len()]),
        "route-0",
    );
    out.push(percentiles("semantic, ~12 tokens", v, &o));
    // Long prompts: store one per topic first, then look up the reworded variant.
    for topic in TOPICS {
        let req = StoreRequest {
            key: key("route-0", &long_prompt(topic, false)),
            answer: answer.clone(),
            target: None,
            upstream_model: Some("m".into()),
            ttl_s: 3600,
            semantic: true,
        };
        if let Some(e) = svc.prepare(&req) {
            svc.apply(e);
        }
    }
    let (v, o) = time(&|i| long_prompt(TOPICS[i % TOPICS.len()], true), "route-0");
    out.push(percentiles("semantic, ~256 tokens", v, &o));
    let (v, o) = time(&|i| long_prompt(TOPICS[i % TOPICS.len()], false), "route-0");
    out.push(percentiles("exact, ~256 tokens", v, &o));
    let (v, o) = time(
        &|i| format!("How can I {}", TOPICS[i % TOPICS.len()]),
        "route-new",
    );
    out.push(percentiles("miss, empty scope", v, &o));
    out.push(scan(per_scope.max(1), n));
    Ok(out)
}

/// The exact scan alone: one scope of `entries` 384-dimension vectors, `n` timed searches.
fn scan(entries: usize, n: usize) -> Percentiles {
    use crate::index::{Entry, Index, encode_vector};
    let dims = 384;
    // Deterministic pseudo-random unit vectors.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 2000) as f32 / 1000.0 - 1.0
    };
    let mut unit = || {
        let mut v: Vec<f32> = (0..dims).map(|_| next()).collect();
        crate::embed::normalise(&mut v);
        v
    };
    let mut ix = Index::new(entries + 1);
    for i in 0..entries {
        ix.insert(Entry {
            key: format!("k{i}"),
            scope: "s".into(),
            route: "r".into(),
            target: None,
            upstream_model: None,
            query: None,
            vector: Some(encode_vector(&unit())),
            embed_model: Some("m".into()),
            answer: CachedAnswer {
                chunks: vec![],
                tool_calls: vec![],
                finish_reason: FinishReason::Stop,
                usage: Default::default(),
            },
            stored_ms: 0,
            expires_ms: u64::MAX,
        });
    }
    let q = unit();
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        std::hint::black_box(ix.candidates("s", "m", &q, 0.5, 1));
        v.push(t.elapsed());
    }
    percentiles(&format!("scan only, {entries} in scope"), v, "-")
}

/// A plain-text table of the results.
pub fn table(rows: &[Percentiles]) -> String {
    let mut s = String::from("path                      n     p50 ms   p99 ms   max ms  outcome\n");
    for r in rows {
        s.push_str(&format!(
            "{:<24} {:>5} {:>9.3} {:>8.3} {:>8.3}  {}\n",
            r.path, r.n, r.p50_ms, r.p99_ms, r.max_ms, r.outcome
        ));
    }
    s
}
