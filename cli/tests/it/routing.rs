//! Candidate ordering end to end: strategies, client preferences, capability and health filters,
//! per-policy timeouts, context trimming and the `/metrics` counters, through HTTP → ingress →
//! NATS → worker → mock upstream.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use switchyard_ingress::strategy::{Capabilities, canary_bucket};
use switchyard_schemas::config::{GatewayConfig, ProviderKind};
use switchyard_schemas::health::{HealthEvent, HealthState};

fn target(id: &str, upstream_model: &str, extra: Value) -> Value {
    let mut t = json!({"id": id, "provider": "openai", "base_url": "builtin:mock",
        "upstream_model": upstream_model});
    if let (Some(t), Some(e)) = (t.as_object_mut(), extra.as_object()) {
        t.extend(e.clone());
    }
    t
}

/// Every target and model the tests below use.
fn config() -> GatewayConfig {
    let dead = json!({"base_url": "http://127.0.0.1:9/v1"});
    test_config(json!({
        "targets": [
            target("mock", "mock", json!({})),
            target("dead", "mock", dead.clone()),
            target("dead2", "mock", dead),
            {"id": "claude", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-test"},
            target("m1", "mock", json!({"priority": 0})),
            target("m2", "mock", json!({"priority": 1})),
            target("w3", "mock", json!({"weight": 3})),
            target("w1", "mock", json!({"weight": 1})),
            target("big", "gpt-4o", json!({"priority": 0})),
            target("mini", "gpt-4o-mini", json!({"priority": 1})),
            target("small240", "mock", json!({"context_window": 240})),
            target("small70", "mock", json!({"context_window": 70})),
        ],
        "models": [
            {"id": "demo/mock", "targets": ["mock"]},
            {"id": "demo/fallback", "targets": ["dead", "mock"]},
            {"id": "demo/dead", "targets": ["dead"]},
            {"id": "demo/claude", "targets": ["claude"]},
            {"id": "r/weighted", "targets": ["w3", "w1"], "policy": "weighted"},
            {"id": "r/canary", "targets": ["m1", "m2"], "policy": "canary"},
            {"id": "r/prefs", "targets": ["m1", "m2", "claude"]},
            {"id": "r/caps", "targets": ["m1", "claude"]},
            {"id": "r/json", "targets": ["claude", "m1"]},
            {"id": "r/health", "targets": ["m1", "m2"]},
            {"id": "r/least", "targets": ["m1", "m2"], "policy": "least_busy"},
            {"id": "r/latency", "targets": ["m1", "m2"], "policy": "lowest_latency"},
            {"id": "r/cost", "targets": ["big", "mini"], "policy": "lowest_cost"},
            {"id": "r/trim240", "targets": ["small240"], "policy": "trim"},
            {"id": "r/trim70", "targets": ["small70"], "policy": "trim"},
            {"id": "r/notrim", "targets": ["small240"]},
            {"id": "r/capped", "targets": ["dead", "dead2", "m1"], "policy": "capped"},
            {"id": "r/uncapped", "targets": ["dead", "dead2", "m1"]},
            {"id": "r/total", "targets": ["m1"], "policy": "total"},
            {"id": "r/first-byte", "targets": ["m1", "m2"], "policy": "first_byte"}
        ],
        "policies": [
            {"id": "weighted", "strategy": "weighted"},
            {"id": "canary", "strategy": "canary", "canary": {"target": "m2", "percent": 30}},
            {"id": "least_busy", "strategy": "least_busy"},
            {"id": "lowest_latency", "strategy": "lowest_latency"},
            {"id": "lowest_cost", "strategy": "lowest_cost"},
            {"id": "trim", "trim_context": true},
            {"id": "capped", "max_attempts": 2},
            {"id": "total", "timeouts": {"total_ms": 400}},
            {"id": "first_byte", "timeouts": {"first_byte_ms": 300}}
        ]
    }))
}

async fn gateway() -> Gateway {
    start_config(config()).await
}

/// A short non-streamed request to `model`; returns the serving target (or the status on error).
/// Turns off the 5 % of requests that try a degraded target first, so order is deterministic.
fn no_probes(gw: &Gateway) {
    gw.ingress
        .probe_per_mille
        .store(0, std::sync::atomic::Ordering::Relaxed);
}

async fn served_by(gw: &Gateway, model: &str, headers: &[(&str, &str)]) -> String {
    let (status, h, body) =
        post_with(&gw.base, headers, &chat(model, "#mock text=ok", false)).await;
    assert_eq!(status, 200, "{body}");
    h["x-switchyard-target"].to_str().unwrap().to_owned()
}

async fn publish_health(gw: &Gateway, target: &str, state: HealthState) {
    let client = async_nats::connect(gw.nats.url()).await.unwrap();
    let event = HealthEvent {
        target: target.into(),
        state,
        reason: "breaker_open: test".into(),
        ts_ms: switchyard_schemas::now_ms(),
        worker: "worker-test".into(),
        retry_after_ms: None,
    };
    client
        .publish(
            format!("sy.health.{target}"),
            serde_json::to_vec(&event).unwrap().into(),
        )
        .await
        .unwrap();
    client.flush().await.unwrap();
    let ingress = gw.ingress.clone();
    let target = target.to_owned();
    eventually(Duration::from_secs(5), || {
        let s = ingress.health.state(&target);
        async move { (s == state).then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn weighted_split_over_400_requests() {
    let gw = gateway().await;
    let counts: HashMap<String, usize> = futures::stream::iter(0..400)
        .map(|_| served_by(&gw, "r/weighted", &[]))
        .buffer_unordered(8)
        .fold(HashMap::new(), |mut m, t| async move {
            *m.entry(t).or_insert(0) += 1;
            m
        })
        .await;
    // Weights 3 : 1 → 300 : 100 expected; ±45 is over 5 standard deviations.
    let w3 = counts.get("w3").copied().unwrap_or(0);
    let w1 = counts.get("w1").copied().unwrap_or(0);
    assert_eq!(w3 + w1, 400, "{counts:?}");
    assert!((255..=345).contains(&w3), "{counts:?}");
}

#[tokio::test]
async fn canary_is_stable_per_user_and_splits_by_percent() {
    let gw = gateway().await;
    // The same user always lands on the same side, by header or by the body's `user`.
    for user in ["alice", "bob", "carol"] {
        let expected = if canary_bucket(user) < 30.0 {
            "m2"
        } else {
            "m1"
        };
        for _ in 0..5 {
            assert_eq!(
                served_by(&gw, "r/canary", &[("x-switchyard-user", user)]).await,
                expected
            );
        }
        let mut body = chat("r/canary", "#mock text=ok", false);
        body["user"] = json!(user);
        let (_, h, _) = post_json(&gw.base, &body).await;
        assert_eq!(h["x-switchyard-target"], expected);
    }
    // ~30 % of 200 users go to the canary, each exactly where the stable hash puts them.
    let mut canary = 0;
    for i in 0..200 {
        let user = format!("user-{i}");
        let got = served_by(&gw, "r/canary", &[("x-switchyard-user", &user)]).await;
        let expected = if canary_bucket(&user) < 30.0 {
            "m2"
        } else {
            "m1"
        };
        assert_eq!(got, expected, "{user}");
        canary += usize::from(got == "m2");
    }
    assert!((40..=80).contains(&canary), "{canary} of 200");
}

#[tokio::test]
async fn client_preference_headers() {
    let gw = gateway().await;
    assert_eq!(served_by(&gw, "r/prefs", &[]).await, "m1");
    assert_eq!(
        served_by(&gw, "r/prefs", &[("x-switchyard-only", "m2")]).await,
        "m2"
    );
    assert_eq!(
        served_by(&gw, "r/prefs", &[("x-switchyard-ignore", "m1, m2")]).await,
        "claude"
    );
    assert_eq!(
        served_by(&gw, "r/prefs", &[("x-switchyard-order", "claude,m2")]).await,
        "claude"
    );
    // Only targets that do not exist: a 400 naming the header, no upstream call.
    let before = gw.mock.request_count();
    let (status, _, body) = post_with(
        &gw.base,
        &[("x-switchyard-only", "nope")],
        &chat("r/prefs", "hi", false),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "x-switchyard-only");
    assert_eq!(gw.mock.request_count(), before);
    // A route header overrides the body's model for routing; the response echoes the body's.
    let (status, h, body) = post_with(
        &gw.base,
        &[("x-switchyard-route", "r/prefs")],
        &chat("my-app/anything", "#mock text=ok", false),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "my-app/anything");
    assert_eq!(h["x-switchyard-target"], "m1");
    let (status, _, body) = post_with(
        &gw.base,
        &[("x-switchyard-route", "r/none")],
        &chat("r/prefs", "hi", false),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["param"], "x-switchyard-route");
}

#[tokio::test]
async fn capability_table_matches_the_workers() {
    for kind in ProviderKind::ALL {
        let w = switchyard_workers::worker::adapter(*kind).capabilities();
        let i = Capabilities::of(*kind);
        assert_eq!(
            (i.streaming, i.tools, i.vision, i.json_mode, i.embeddings),
            (w.streaming, w.tools, w.vision, w.json_mode, w.embeddings),
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn capability_filter_skips_targets_that_cannot_serve() {
    let gw = gateway().await;
    // Test-only: this gateway's OpenAI targets lack tools.
    let mut no_tools = Capabilities::of(ProviderKind::Openai);
    no_tools.tools = false;
    gw.ingress.capabilities.set(ProviderKind::Openai, no_tools);
    let mut body = chat("r/caps", "weather?", false);
    body["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {}}}}]);
    let (status, h, resp) = post_json(&gw.base, &body).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(h["x-switchyard-target"], "claude");
    assert_eq!(h["x-switchyard-fallbacks"], "0");
    assert_eq!(gw.mock.requests().last().unwrap().path, "/v1/messages");
    // Without tools the first target serves.
    assert_eq!(served_by(&gw, "r/caps", &[]).await, "m1");
    // Only OpenAI targets left: a 400 naming `tools`, no upstream call.
    let before = gw.mock.request_count();
    let (status, _, resp) = post_with(&gw.base, &[("x-switchyard-only", "m1")], &body).await;
    assert_eq!(status, 400);
    assert_eq!(resp["error"]["param"], "tools");
    assert_eq!(
        resp["error"]["message"],
        "Model `r/caps` has no target that supports tools (m1: provider openai lacks tools)."
    );
    assert_eq!(gw.mock.request_count(), before);
    // Lacking on one target, unhealthy on the other: 503 listing both.
    publish_health(&gw, "claude", HealthState::Unhealthy).await;
    let (status, _, resp) = post_json(&gw.base, &body).await;
    assert_eq!(status, 503);
    assert_eq!(resp["error"]["code"], "no_capacity");
    assert_eq!(
        resp["error"]["message"],
        "Model `r/caps`: no target can serve this request (m1: provider openai lacks tools; claude: unhealthy)."
    );

    // JSON mode: Anthropic has it (a synthetic tool, see structured_output.rs); test-only, a
    // deployment whose Anthropic provider lacks it leaves the OpenAI target.
    let mut no_json = Capabilities::of(ProviderKind::Anthropic);
    assert!(no_json.json_mode);
    no_json.json_mode = false;
    gw.ingress
        .capabilities
        .set(ProviderKind::Anthropic, no_json);
    let mut body = chat("r/json", "#mock text=ok", false);
    body["response_format"] = json!({"type": "json_object"});
    let (status, h, _) = post_json(&gw.base, &body).await;
    assert_eq!(status, 200);
    assert_eq!(h["x-switchyard-target"], "m1");
    body["model"] = json!("demo/claude");
    let (status, _, resp) = post_json(&gw.base, &body).await;
    assert_eq!(status, 400);
    assert_eq!(resp["error"]["param"], "response_format");
    assert_eq!(
        resp["error"]["message"],
        "Model `demo/claude` has no target that supports json_mode (claude: provider anthropic lacks json_mode)."
    );
}

#[tokio::test]
async fn health_events_skip_then_restore_a_target() {
    let gw = gateway().await;
    no_probes(&gw);
    assert_eq!(served_by(&gw, "r/health", &[]).await, "m1");
    publish_health(&gw, "m1", HealthState::Unhealthy).await;
    let (status, h, _) = post_json(&gw.base, &chat("r/health", "#mock text=ok", false)).await;
    assert_eq!(status, 200);
    assert_eq!(h["x-switchyard-target"], "m2");
    assert_eq!(h["x-switchyard-fallbacks"], "0");
    // Degraded: still used, but after the healthy ones.
    publish_health(&gw, "m1", HealthState::Degraded).await;
    assert_eq!(served_by(&gw, "r/health", &[]).await, "m2");
    assert_eq!(
        served_by(&gw, "r/health", &[("x-switchyard-only", "m1")]).await,
        "m1"
    );
    publish_health(&gw, "m1", HealthState::Healthy).await;
    assert_eq!(served_by(&gw, "r/health", &[]).await, "m1");
    // Every target unhealthy: 503 saying so, no upstream call.
    publish_health(&gw, "m1", HealthState::Unhealthy).await;
    publish_health(&gw, "m2", HealthState::Unhealthy).await;
    let before = gw.mock.request_count();
    let (status, _, body) = post_json(&gw.base, &chat("r/health", "hi", false)).await;
    assert_eq!(status, 503);
    assert_eq!(
        body["error"]["message"],
        "Model `r/health`: every target is unhealthy (m1: unhealthy; m2: unhealthy)."
    );
    assert_eq!(gw.mock.request_count(), before);
}

#[tokio::test]
async fn consecutive_failures_degrade_a_target_in_this_ingress() {
    let gw = gateway().await;
    no_probes(&gw);
    for _ in 0..3 {
        let (status, h, _) =
            post_json(&gw.base, &chat("demo/fallback", "#mock text=ok", false)).await;
        assert_eq!(status, 200);
        assert_eq!(h["x-switchyard-fallbacks"], "1");
    }
    assert_eq!(gw.ingress.health.state("dead"), HealthState::Degraded);
    // Now `dead` is tried last: the mock serves at once.
    let (status, h, _) = post_json(&gw.base, &chat("demo/fallback", "#mock text=ok", false)).await;
    assert_eq!(status, 200);
    assert_eq!(h["x-switchyard-target"], "mock");
    assert_eq!(h["x-switchyard-fallbacks"], "0");
}

#[tokio::test]
async fn least_busy_avoids_the_target_with_a_request_in_flight() {
    let gw = gateway().await;
    // A slow stream holds m1.
    let resp = post(&gw.base, &chat("r/least", "#mock chunk_delay_ms=200", true)).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["x-switchyard-target"], "m1");
    assert_eq!(gw.ingress.stats.in_flight("m1"), 1);
    assert_eq!(served_by(&gw, "r/least", &[]).await, "m2");
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        chunk.unwrap();
    }
    assert_eq!(gw.ingress.stats.in_flight("m1"), 0);
    assert_eq!(served_by(&gw, "r/least", &[]).await, "m1");
}

#[tokio::test]
async fn lowest_latency_tries_unmeasured_targets_first() {
    let gw = gateway().await;
    // Neither measured: priority order. Then m1 has a TTFT and m2 (unmeasured, 0) goes first.
    assert_eq!(served_by(&gw, "r/latency", &[]).await, "m1");
    assert!(gw.ingress.stats.ttft_ms("m1").unwrap() > 0.0);
    assert_eq!(served_by(&gw, "r/latency", &[]).await, "m2");
}

#[tokio::test]
async fn lowest_cost_picks_the_cheaper_upstream_model() {
    let gw = gateway().await;
    // gpt-4o costs 2.50 + 10.00 per 1M, gpt-4o-mini 0.15 + 0.60: mini first despite priority.
    assert_eq!(served_by(&gw, "r/cost", &[]).await, "mini");
    assert_eq!(
        gw.mock.requests().last().unwrap().body["model"],
        "gpt-4o-mini"
    );
    assert_eq!(
        served_by(&gw, "r/cost", &[("x-switchyard-ignore", "mini")]).await,
        "big"
    );
    assert_eq!(gw.mock.requests().last().unwrap().body["model"], "gpt-4o");
}

#[tokio::test]
async fn max_attempts_caps_the_fallbacks() {
    let gw = gateway().await;
    let (status, _, body) = post_json(&gw.base, &chat("r/capped", "hi", false)).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "upstream_unreachable");
    let (status, h, _) = post_json(&gw.base, &chat("r/uncapped", "#mock text=ok", false)).await;
    assert_eq!(status, 200);
    assert_eq!(h["x-switchyard-target"], "m1");
    assert_eq!(h["x-switchyard-fallbacks"], "2");
}

#[tokio::test]
async fn policy_timeouts() {
    let gw = gateway().await;
    // total_ms 400 against a 2 s first token: 504 after ~0.4 s.
    let started = Instant::now();
    let (status, _, body) =
        post_json(&gw.base, &chat("r/total", "#mock ttft_ms=2000", false)).await;
    assert_eq!(status, 504, "{body}");
    // (The worker holds the same deadline, so either side may report it first.)
    assert_eq!(body["error"]["code"], "timeout");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    // first_byte_ms 300: each target gets 300 ms to send content, then the next one is tried.
    let started = Instant::now();
    let (status, _, body) =
        post_json(&gw.base, &chat("r/first-byte", "#mock ttft_ms=2000", true)).await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(
        body["error"]["message"],
        "target `m2` sent no content within 300 ms"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    let metrics = metrics_text(&gw.base).await;
    assert!(
        metrics.contains("switchyard_fallbacks_total{model=\"r/first-byte\",depth=\"1\"} 1\n"),
        "{metrics}"
    );
}

/// system, 100 × apple, 100 × banana, 100 × cherry, a tool call with its result, an assistant
/// answer, the last user turn. Estimated tokens: 10, 104, 104, 105, 18, 12, 12, 13 (+ 3).
fn long_conversation(model: &str) -> Value {
    let words = |w: &str| vec![w; 100].join(" ");
    json!({"model": model, "max_tokens": 20, "messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": words("apple")},
        {"role": "assistant", "content": words("banana")},
        {"role": "user", "content": words("cherry")},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\":18}"},
        {"role": "assistant", "content": "It is 18 degrees in Paris."},
        {"role": "user", "content": "#mock text=ok\nAnd tomorrow?"}
    ]})
}

/// Role and text (or tool call id) of each message the upstream received.
fn upstream_messages(gw: &Gateway) -> Vec<(String, String)> {
    let req = gw.mock.requests().last().cloned().unwrap();
    req.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = match &m["content"] {
                Value::String(s) => s.split_whitespace().next().unwrap_or("").to_owned(),
                _ => m["tool_calls"][0]["id"].as_str().unwrap_or("").to_owned(),
            };
            (m["role"].as_str().unwrap().to_owned(), text)
        })
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[tokio::test]
async fn trimming_keeps_system_prompts_and_the_latest_turns() {
    let gw = gateway().await;
    // 381 + 20 tokens against a 240-token window: the two oldest messages go; the kept part
    // starts at the `cherry` user turn.
    let (status, h, body) = post_json(&gw.base, &long_conversation("r/trim240")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(h["x-switchyard-trimmed"], "2");
    assert_eq!(body["model"], "r/trim240");
    assert_eq!(
        upstream_messages(&gw),
        pairs(&[
            ("system", "You"),
            ("user", "cherry"),
            ("assistant", "call_1"),
            ("tool", "{\"temp\":18}"),
            ("assistant", "It"),
            ("user", "#mock"),
        ])
    );
    // A 70-token window: everything but the system prompt and the last turn goes, the tool call
    // together with its result.
    let (status, h, _) = post_json(&gw.base, &long_conversation("r/trim70")).await;
    assert_eq!(status, 200);
    assert_eq!(h["x-switchyard-trimmed"], "6");
    assert_eq!(
        upstream_messages(&gw),
        pairs(&[("system", "You"), ("user", "#mock")])
    );
    // A request that fits is not touched and gets no header.
    let (status, h, _) = post_json(&gw.base, &chat("r/trim70", "#mock text=ok", false)).await;
    assert_eq!(status, 200);
    assert!(h.get("x-switchyard-trimmed").is_none());
    // Without trim_context the same conversation is a 400, and nothing goes upstream.
    let before = gw.mock.request_count();
    let (status, _, body) = post_json(&gw.base, &long_conversation("r/notrim")).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert_eq!(gw.mock.request_count(), before);
}

#[tokio::test]
async fn metrics_count_requests_exactly() {
    let gw = gateway().await;
    for stream in [false, false, false, true, true] {
        let body = chat("demo/mock", "#mock text=ok", stream);
        let resp = post(&gw.base, &body).await;
        assert_eq!(resp.status().as_u16(), 200);
        resp.bytes().await.unwrap();
    }
    let (status, _, _) = post_json(&gw.base, &chat("demo/fallback", "#mock text=ok", false)).await;
    assert_eq!(status, 200);
    let (status, _, _) = post_json(&gw.base, &chat("demo/dead", "hi", false)).await;
    assert_eq!(status, 502);
    let text = metrics_text(&gw.base).await;
    assert_metric_lines(
        &text,
        &[
            "switchyard_requests_total{route=\"/v1/chat/completions\",model=\"demo/mock\",status=\"200\"} 5",
            "switchyard_requests_total{route=\"/v1/chat/completions\",model=\"demo/fallback\",status=\"200\"} 1",
            "switchyard_requests_total{route=\"/v1/chat/completions\",model=\"demo/dead\",status=\"502\"} 1",
            "switchyard_provider_requests_total{target=\"mock\",status=\"200\"} 6",
            "switchyard_provider_requests_total{target=\"dead\",status=\"502\"} 2",
            "switchyard_fallbacks_total{model=\"demo/fallback\",depth=\"1\"} 1",
            "switchyard_time_to_first_token_seconds_count{route=\"/v1/chat/completions\",model=\"demo/mock\"} 5",
            "switchyard_time_to_first_token_seconds_count{route=\"/v1/chat/completions\",model=\"demo/fallback\"} 1",
            "switchyard_provider_time_to_first_token_seconds_count{target=\"mock\"} 6",
            "switchyard_request_duration_seconds_count{route=\"/v1/chat/completions\",model=\"demo/mock\"} 5",
            "switchyard_request_duration_seconds_count{route=\"/v1/chat/completions\",model=\"demo/dead\"} 1",
            "switchyard_gateway_overhead_seconds_count{route=\"/v1/chat/completions\",model=\"demo/mock\"} 5",
            "switchyard_in_flight{target=\"mock\"} 0",
            "switchyard_in_flight{target=\"dead\"} 0",
            "# TYPE switchyard_requests_total counter",
            "# TYPE switchyard_time_to_first_token_seconds histogram",
        ],
    );
    assert!(!text.contains("switchyard_fallbacks_total{model=\"demo/mock\""));
}
