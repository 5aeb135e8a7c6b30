//! `/metrics` end to end (docs/metrics.md): one scrape after mixed traffic shows every family,
//! with the exact counts of the simple ones; 1,000 distinct keys through two ingress processes
//! add no series.

use crate::common::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

const KEY: &str = "sk-metrics-main-0123456789";
const BROKE: &str = "sk-metrics-broke-0123456789";
const LIMITED: &str = "sk-metrics-limited-0123456789";

fn catalog(dir: &std::path::Path) -> String {
    catalog_file(
        dir,
        "currency: USD\nas_of: 2026-11-29\n\
         upstream:\n  mock: {input: 1, output: 2}\n\
         standard:\n  demo/mock: {input: 2, output: 4}\n  demo/fallback: {input: 2, output: 4}\n  \
         demo/retry: {input: 2, output: 4}\n  demo/cached: {input: 2, output: 4}\n  demo/slow: {input: 2, output: 4}\n",
    )
}

async fn send(base: &str, key: &str, body: &Value) -> reqwest::Response {
    chat_request(&reqwest::Client::new(), base, key, body)
        .send()
        .await
        .unwrap()
}

/// The `x-switchyard-overhead-ms` header of `r`, as a number.
fn overhead_ms(r: &reqwest::Response) -> f64 {
    r.headers()["x-switchyard-overhead-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn one_scrape_shows_every_family_after_mixed_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let no_cache = json!({"enabled": false});
    let config = test_config(json!({
        "pricing_file": catalog(dir.path()),
        "targets": [
            {"id": "mock", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "mock"},
            {"id": "dead", "provider": "openai", "base_url": "http://127.0.0.1:9/v1",
             "upstream_model": "mock", "retry": {"max_attempts": 1}},
            {"id": "flaky", "provider": "openai", "base_url": "builtin:mock/x/status=500",
             "upstream_model": "mock", "retry": {"max_attempts": 2, "base_ms": 1},
             "breaker": {"min_calls": 1, "failure_rate": 0.1}}
        ],
        "models": [
            {"id": "demo/mock", "targets": ["mock"], "cache": no_cache},
            {"id": "demo/cached", "targets": ["mock"], "cache": {"semantic": false}},
            {"id": "demo/fallback", "targets": ["dead", "mock"], "cache": no_cache},
            {"id": "demo/retry", "targets": ["flaky", "mock"], "cache": no_cache},
            {"id": "demo/slow", "targets": ["mock"], "cache": no_cache}
        ],
        "keys": [
            {"id": "main", "tenant": "acme", "key": KEY},
            {"id": "broke", "tenant": "acme", "key": BROKE, "budget": {"daily_usd": "0.0000001"}},
            {"id": "limited", "tenant": "acme", "key": LIMITED, "limits": {"rpm": 1}}
        ],
    }));
    let gw = start(Options {
        config,
        billing: true,
        cache: true,
        ..Options::default()
    })
    .await;
    let base = &gw.base;
    let ok = "#mock text=hello+world prompt_tokens=10 completion_tokens=5";

    // 3 complete successes (distinct prompts), with the overhead header.
    for i in 0..3 {
        let r = send(base, KEY, &chat("demo/mock", &format!("{ok}\nq{i}"), false)).await;
        assert_eq!(r.status(), 200);
        let ms = overhead_ms(&r);
        assert!((0.0..1000.0).contains(&ms), "{ms}");
        r.bytes().await.unwrap();
    }
    // 2 streamed successes of 4 text chunks each.
    for i in 0..2 {
        let body = chat(
            "demo/mock",
            &format!("#mock text=a+b+c+d chunks=4 prompt_tokens=10 completion_tokens=5\ns{i}"),
            true,
        );
        let r = send(base, KEY, &body).await;
        assert_eq!(r.status(), 200);
        assert!(r.headers().contains_key("x-switchyard-overhead-ms"));
        r.bytes().await.unwrap();
    }
    // A fallback (dead → mock) and a retry on `flaky` before its fallback to mock.
    let r = send(base, KEY, &chat("demo/fallback", ok, false)).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let r = send(base, KEY, &chat("demo/retry", ok, false)).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    // Client errors: a body without messages (400) and an unknown model (404), not routed.
    let r = send(base, KEY, &json!({"model": "demo/mock"})).await;
    assert_eq!(r.status(), 400);
    let r = send(base, KEY, &chat("no/such-model", "hi", false)).await;
    assert_eq!(r.status(), 404);
    // A budget refusal and a rate-limit refusal.
    let r = send(base, BROKE, &chat("demo/mock", ok, false)).await;
    assert_eq!(r.status(), 429);
    for expected in [200, 429] {
        let r = send(
            base,
            LIMITED,
            &chat("demo/mock", &format!("{ok}\nl"), false),
        )
        .await;
        assert_eq!(r.status(), expected);
        r.bytes().await.unwrap();
    }
    // A cache miss + store, then hits once the asynchronous store landed.
    let cached = chat("demo/cached", ok, false);
    let mut misses = 0;
    eventually(Duration::from_secs(10), || {
        let (base, cached) = (base.clone(), cached.clone());
        misses += 1;
        async move {
            let r = send(&base, KEY, &cached).await;
            assert_eq!(r.status(), 200);
            let hit = r.headers()["x-switchyard-cache"] == "hit";
            r.bytes().await.unwrap();
            hit.then_some(())
        }
    })
    .await;
    let misses = misses - 1;
    // A cancelled stream: the client reads the first chunk and goes away.
    let slow = chat(
        "demo/slow",
        "#mock text_len=200 chunks=50 chunk_delay_ms=50\ncancel me",
        true,
    );
    let mut r = send(base, KEY, &slow).await;
    assert_eq!(r.status(), 200);
    r.chunk().await.unwrap().unwrap();
    drop(r);

    let chat_route = "route=\"/v1/chat/completions\"";
    let series =
        format!("switchyard_requests_total{{{chat_route},model=\"demo/slow\",status=\"499\"}}");
    let text = wait_metrics(base, Duration::from_secs(10), |t| {
        let billed = metric_value(t, "switchyard_billing_pending_messages") == Some(0.0);
        metric_value(t, &series) == Some(1.0) && billed
    })
    .await;
    let exact = |series: String, want: f64| {
        assert_eq!(
            metric_value(&text, &series),
            Some(want),
            "{series} in\n{text}"
        );
    };
    let req = |model: &str, status: u16| {
        format!("switchyard_requests_total{{{chat_route},model=\"{model}\",status=\"{status}\"}}")
    };
    // 3 + 2 + 1 (limited) successes; the cached ones count on demo/cached.
    exact(req("demo/mock", 200), 6.0);
    exact(req("demo/mock", 429), 2.0);
    exact(req("demo/fallback", 200), 1.0);
    exact(req("demo/retry", 200), 1.0);
    exact(req("demo/cached", 200), f64::from(misses + 1));
    exact(req("none", 400), 1.0);
    exact(req("none", 404), 1.0);
    exact(
        "switchyard_fallbacks_total{model=\"demo/fallback\",depth=\"1\"}".into(),
        1.0,
    );
    exact(
        "switchyard_fallbacks_total{model=\"demo/retry\",depth=\"1\"}".into(),
        1.0,
    );
    exact(
        "switchyard_provider_requests_total{target=\"flaky\",status=\"502\"}".into(),
        1.0,
    );
    exact(
        "switchyard_provider_retries_total{target=\"flaky\"}".into(),
        1.0,
    );
    exact("switchyard_refusals_total{kind=\"budget\"}".into(), 1.0);
    exact(
        "switchyard_refusals_total{kind=\"rate_limit_rpm\"}".into(),
        1.0,
    );
    exact(
        "switchyard_cache_outcomes_total{outcome=\"hit\"}".into(),
        1.0,
    );
    exact(
        "switchyard_cache_outcomes_total{outcome=\"miss\"}".into(),
        f64::from(misses),
    );
    // Each stream: the OpenAI role chunk (empty content) and 4 text chunks = 5 content frames,
    // 4 gaps.
    exact(
        format!("switchyard_stream_chunk_gap_seconds_count{{{chat_route},model=\"demo/mock\"}}"),
        8.0,
    );
    // 3 + 2 + 1 successes with 10 + 5 tokens each.
    let tokens =
        |kind: &str| format!("switchyard_tokens_total{{model=\"demo/mock\",kind=\"{kind}\"}}");
    exact(tokens("input"), 60.0);
    exact(tokens("output"), 30.0);
    assert!(metric_value(&text, "switchyard_charge_usd_total{model=\"demo/mock\"}").unwrap() > 0.0);
    assert!(metric_value(&text, "switchyard_cost_usd_total{target=\"mock\"}").unwrap() > 0.0);
    assert!(
        metric_value(
            &text,
            "switchyard_breaker_transitions_total{target=\"flaky\",state=\"unhealthy\"}"
        )
        .unwrap()
            >= 1.0,
        "{text}"
    );
    assert!(
        metric_value(&text, "switchyard_cache_outcomes_total{outcome=\"store\"}").unwrap() >= 1.0
    );
    for family in [
        "switchyard_requests_total",
        "switchyard_request_duration_seconds",
        "switchyard_time_to_first_token_seconds",
        "switchyard_gateway_overhead_seconds",
        "switchyard_stream_chunk_gap_seconds",
        "switchyard_fallbacks_total",
        "switchyard_tokens_total",
        "switchyard_charge_usd_total",
        "switchyard_cost_usd_total",
        "switchyard_cache_outcomes_total",
        "switchyard_refusals_total",
        "switchyard_provider_requests_total",
        "switchyard_provider_time_to_first_token_seconds",
        "switchyard_provider_retries_total",
        "switchyard_breaker_transitions_total",
        "switchyard_in_flight",
        "switchyard_nats_publish_errors_total",
        "switchyard_usage_spool_events",
        "switchyard_usage_spool_bytes",
        "switchyard_billing_lag_seconds",
        "switchyard_billing_pending_messages",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("# TYPE ") && l[7..].starts_with(&format!("{family} "))),
            "no family {family} in\n{text}"
        );
    }
    for kind in [
        "input",
        "cached_input",
        "cache_write",
        "output",
        "reasoning",
    ] {
        assert!(
            metric_value(&text, &tokens(kind)).is_some(),
            "{kind} in\n{text}"
        );
    }
    exact(
        format!("switchyard_gateway_overhead_seconds_count{{{chat_route},model=\"demo/mock\"}}"),
        8.0,
    );
}

/// The series (name and labels, no values) of a `/metrics` text.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_owned()))
        .collect()
}

/// 1,000 keys, each making one request through one of two ingress processes: neither gains a
/// series over what one key's requests made.
#[tokio::test]
async fn a_thousand_keys_through_two_ingresses_add_no_series() {
    let key = |i: usize| format!("sk-metrics-card-{i:04}-0123456789");
    let keys: Vec<Value> = (0..1000)
        .map(|i| json!({"id": format!("k{i}"), "tenant": format!("t{i}"), "key": key(i)}))
        .collect();
    let gw = start_config(test_config(json!({"keys": keys}))).await;
    let (second, _state) = spawn_ingress(&gw).await;
    let bases = [gw.base.clone(), second];
    let body = chat("demo/mock", "#mock text=ok", true);
    for base in &bases {
        let r = send(base, &key(0), &body).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let before: Vec<BTreeSet<String>> =
        futures::future::join_all(bases.iter().map(|b| metrics_text(b)))
            .await
            .iter()
            .map(|t| series(t))
            .collect();
    let calls = (1..1000).map(|i| {
        let (base, key, body) = (bases[i % 2].clone(), key(i), body.clone());
        async move {
            let r = send(&base, &key, &body).await;
            let status = r.status().as_u16();
            r.bytes().await.unwrap();
            status
        }
    });
    let statuses: Vec<u16> = futures::stream::iter(calls)
        .buffer_unordered(100)
        .collect()
        .await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    for (base, before) in bases.iter().zip(&before) {
        let text = metrics_text(base).await;
        assert_eq!(&series(&text), before, "series changed on {base}");
        let n = |s: &str| metric_value(&text, s).unwrap();
        let total = n(
            "switchyard_requests_total{route=\"/v1/chat/completions\",model=\"demo/mock\",status=\"200\"}",
        );
        assert_eq!(total, if base == &gw.base { 500.0 } else { 501.0 });
    }
}

use futures::StreamExt as _;

/// Billing lag: with the `billing` consumer created but not consuming, a request's usage events
/// wait in the stream and `/metrics` shows their age and count; nothing pending reads 0.
#[tokio::test]
async fn billing_lag_is_the_age_of_the_oldest_unacknowledged_event() {
    let gw = start(Options::default()).await;
    let js = async_nats::jetstream::new(async_nats::connect(gw.nats.url()).await.unwrap());
    let stream = js
        .get_stream(switchyard_schemas::subjects::USAGE_STREAM)
        .await
        .unwrap();
    switchyard_billing::ensure_billing_consumer(&stream, 100, Duration::from_secs(30))
        .await
        .unwrap();
    let idle = metrics_text(&gw.base).await;
    assert_eq!(
        metric_value(&idle, "switchyard_billing_lag_seconds"),
        Some(0.0),
        "{idle}"
    );
    assert_eq!(
        metric_value(&idle, "switchyard_billing_pending_messages"),
        Some(0.0)
    );
    let r = post(&gw.base, &chat("demo/mock", "#mock text=ok", false)).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    // The worker's `upstream` and ingress's `charge` events: two messages, unacknowledged.
    let text = wait_metrics(&gw.base, Duration::from_secs(10), |t| {
        let lag = metric_value(t, "switchyard_billing_lag_seconds");
        lag.is_some_and(|lag| {
            metric_value(t, "switchyard_billing_pending_messages") == Some(2.0) && lag > 0.0
        })
    })
    .await;
    let lag = metric_value(&text, "switchyard_billing_lag_seconds").unwrap();
    assert!(lag < 60.0, "{lag}");
}

/// The mock upstream's wait before its first content, ms, in [`both_front_doors_carry_the_overhead_header`].
const UPSTREAM_MS: u64 = 300;

/// Both front doors carry `x-switchyard-overhead-ms`, streamed or not, and count under their
/// own route. The upstream takes 300 ms before its first content: the client waits at least
/// that long, the header (the gateway's own time, not the wait on the upstream) stays under
/// 100 ms, and every observation of `switchyard_gateway_overhead_seconds` is in its `le="0.1"`
/// bucket.
#[tokio::test]
async fn both_front_doors_carry_the_overhead_header() {
    let gw = start(Options::default()).await;
    let http = reqwest::Client::new();
    let slow = format!("#mock text=hi ttft_ms={UPSTREAM_MS}");
    let check = |door: &str, stream: bool, waited: Duration, r: &reqwest::Response| {
        assert_eq!(r.status(), 200, "{door} stream={stream}");
        let ms = overhead_ms(r);
        assert!(
            waited >= Duration::from_millis(UPSTREAM_MS),
            "{door} stream={stream}: answered after {waited:?}"
        );
        assert!(
            (0.0..100.0).contains(&ms),
            "{door} stream={stream}: overhead {ms} ms of {waited:?}"
        );
    };
    for stream in [false, true] {
        let started = std::time::Instant::now();
        let r = http
            .post(format!("{}/v1/messages", gw.base))
            .header("x-api-key", "sk-anything")
            .header("anthropic-version", "2023-06-01")
            .json(
                &json!({"model": "demo/claude", "max_tokens": 16, "stream": stream,
                "messages": [{"role": "user", "content": slow}]}),
            )
            .send()
            .await
            .unwrap();
        // A streamed answer's head goes out with its first content (after the upstream's wait).
        check("/v1/messages", stream, started.elapsed(), &r);
        r.bytes().await.unwrap();
        let started = std::time::Instant::now();
        let r = post(&gw.base, &chat("demo/mock", &slow, stream)).await;
        check("/v1/chat/completions", stream, started.elapsed(), &r);
        r.bytes().await.unwrap();
    }
    let text = metrics_text(&gw.base).await;
    for (route, model) in [
        ("/v1/messages", "demo/claude"),
        ("/v1/chat/completions", "demo/mock"),
    ] {
        let labels = format!("route=\"{route}\",model=\"{model}\"");
        let exact = |series: String, want: f64| {
            assert_eq!(
                metric_value(&text, &series),
                Some(want),
                "{series} in\n{text}"
            );
        };
        exact(
            format!("switchyard_requests_total{{{labels},status=\"200\"}}"),
            2.0,
        );
        exact(
            format!("switchyard_gateway_overhead_seconds_count{{{labels}}}"),
            2.0,
        );
        exact(
            format!("switchyard_gateway_overhead_seconds_bucket{{{labels},le=\"0.1\"}}"),
            2.0,
        );
    }
}
