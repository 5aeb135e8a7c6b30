//! Field cases from the routing/resilience issue that need per-target upstream behaviour
//! (`builtin:mock/x/<spec>` targets): FC-08, FC-15, FC-21, FC-22.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use futures::StreamExt;
use serde_json::json;
use std::time::{Duration, Instant};
use switchyard_schemas::UsageKind;
use switchyard_schemas::usage::UsageStatus;

fn config() -> switchyard_schemas::config::GatewayConfig {
    let t = |id: &str, spec: &str, extra: serde_json::Value| {
        let mut v = json!({"id": id, "provider": "openai", "base_url": format!("builtin:mock/x/{spec}"), "upstream_model": "mock"});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let c: switchyard_schemas::config::GatewayConfig = serde_json::from_value(json!({
        "targets": [
            t("fc08", "fixture=fc08_openai_tools_no_done,hold=1,keepalive_ms=1000", json!({})),
            t("u1-empty", "fixture=fc21_openai_empty_then_quota", json!({})),
            t("u1-hel", "fixture=fc21_openai_hel_then_quota", json!({})),
            t("u2", "text=Fallback+OK", json!({})),
            t("silent", "ttft_ms=10000", json!({"timeouts": {"first_byte_ms": 2000, "idle_ms": 2000}, "retry": {"max_attempts": 1}})),
            t("trickle", "chunks=9,chunk_delay_ms=1000", json!({"timeouts": {"first_byte_ms": 2000, "idle_ms": 2000}})),
            t("long", "chunks=100,chunk_delay_ms=200", json!({})),
            t("slow-json", "ttft_ms=20000", json!({}))
        ],
        "models": [
            {"id": "fc08", "targets": ["fc08"]},
            {"id": "fc21", "targets": ["u1-empty", "u2"]},
            {"id": "fc21-hel", "targets": ["u1-hel", "u2"]},
            {"id": "fc22-silent", "targets": ["silent"]},
            {"id": "fc22-trickle", "targets": ["trickle"]},
            {"id": "fc15", "targets": ["long", "u2"]},
            {"id": "fc15-json", "targets": ["slow-json", "u2"]}
        ],
        "timeouts": {"first_frame_ms": 2000, "worker_silence_ms": 3000, "heartbeat_ms": 200}
    }))
    .unwrap();
    c.validate().unwrap();
    c
}

/// FC-08: tool-call delta, finish `tool_calls`, usage chunk, then keep-alives forever with no
/// `[DONE]`: the client gets the finish chunk and `[DONE]` at once, and usage is recorded.
#[tokio::test]
async fn fc08_keepalive_after_usage_without_done() {
    let gw = start_billed(config()).await;
    let started = Instant::now();
    let mut body = chat("fc08", "weather?", true);
    body["stream_options"] = json!({"include_usage": true});
    let r = post_sse(&gw.base, &body).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.finish_reason().as_deref(), Some("tool_calls"));
    assert_eq!(r.done_count(), 1);
    let usage = r.json_events().last().cloned().unwrap();
    assert_eq!(usage["usage"]["prompt_tokens"], 20);
    assert_eq!(usage["usage"]["completion_tokens"], 7);
    let id = r.headers["x-request-id"].to_str().unwrap().parse().unwrap();
    let rows = ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await;
    let up = rows.iter().find(|r| r.kind == UsageKind::Upstream).unwrap();
    assert_eq!(
        (up.usage.prompt_tokens, up.usage.completion_tokens),
        (20, 7)
    );
    assert_eq!(up.status, UsageStatus::Ok);
    // The upstream connection was closed by us (it would have held forever).
    eventually(Duration::from_secs(5), || {
        let n = gw.mock.state().early_closes().len();
        async move { (n >= 1).then_some(()) }
    })
    .await;
}

/// FC-21: U1 sends a role-only chunk then `insufficient_quota` and closes; fallback U2 streams
/// `Fallback OK`: one clean stream. Variant: U1 sent `Hel` first → `Hel` and an error, never
/// `HelFallback OK`.
#[tokio::test]
async fn fc21_fallback_only_before_content() {
    let gw = start_config(config()).await;
    let r = post_sse(&gw.base, &chat("fc21", "hi", true)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "Fallback OK");
    assert_eq!(r.finish_reason().as_deref(), Some("stop"));
    assert_eq!(r.done_count(), 1);
    assert!(r.json_events().iter().all(|e| e.get("error").is_none()));
    assert_eq!(r.headers["x-switchyard-target"], "u2");

    let r = post_sse(&gw.base, &chat("fc21-hel", "hi", true)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "Hel");
    assert_eq!(r.done_count(), 0);
    let last = r.json_events().last().cloned().unwrap();
    assert_eq!(last["error"]["code"], "rate_limit_exceeded");
    assert_eq!(
        calls_naming(&gw, "text=Fallback"),
        1,
        "only the first case used U2"
    );
}

/// FC-22: first-byte and idle timeouts of 2 s. An upstream silent for 10 s gives up in < 3 s; one
/// chunk at once then one per second for 8 s succeeds with all 9 chunks.
#[tokio::test]
async fn fc22_first_byte_and_idle_timeouts() {
    let gw = start_config(config()).await;
    let started = Instant::now();
    let (status, _, body) = post_json(&gw.base, &chat("fc22-silent", "hi", false)).await;
    let took = started.elapsed();
    assert_eq!(status, 504, "{body}");
    assert!(took < Duration::from_secs(3), "gave up after {took:?}");

    let r = post_sse(&gw.base, &chat("fc22-trickle", "hi", true)).await;
    assert_eq!(r.status, 200);
    let pieces = r
        .json_events()
        .iter()
        .filter(|e| {
            e.pointer("/choices/0/delta/content")
                .and_then(|c| c.as_str())
                .is_some_and(|c| !c.is_empty())
        })
        .count();
    assert_eq!(pieces, 9);
    assert_eq!(r.content(), switchyard_mock::DEFAULT_TEXT);
    assert_eq!(r.finish_reason().as_deref(), Some("stop"));
}

/// FC-15: the client reads 5 chunks of a 100-chunk / 20 s stream and closes; the upstream sees its
/// connection closed within 1 s; nothing is retried or sent to the fallback. Variant: a
/// non-streaming client leaves after 1 s while the upstream waits 20 s.
#[tokio::test]
async fn fc15_client_disconnect_reaches_the_upstream() {
    let gw = start_billed(config()).await;
    let resp = post(&gw.base, &chat("fc15", "hi", true)).await;
    let id = request_id(resp.headers());
    let mut stream = resp.bytes_stream();
    let mut seen = 0;
    let mut buf = Vec::new();
    while seen < 5 {
        buf.extend_from_slice(&stream.next().await.unwrap().unwrap());
        seen = String::from_utf8_lossy(&buf)
            .matches("\"content\":\"")
            .count();
    }
    drop(stream);
    let closed_at = Instant::now();
    let at = eventually(Duration::from_secs(5), || {
        let c = gw.mock.state().early_closes();
        async move { c.first().copied() }
    })
    .await;
    assert!(
        at.duration_since(closed_at) < Duration::from_secs(1),
        "upstream closed after {:?}",
        at.duration_since(closed_at)
    );
    for row in ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await {
        assert_eq!(row.status, UsageStatus::Cancelled);
    }
    assert_eq!(calls_naming(&gw, "Fallback"), 0);
    assert_eq!(calls_naming(&gw, "chunks=100"), 1);

    // Non-streaming variant: the client gives up after 1 s.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let r = client
        .post(format!("{}/v1/chat/completions", gw.base))
        .json(&chat("fc15-json", "hi", false))
        .send()
        .await;
    assert!(r.is_err());
    let left = Instant::now();
    eventually(Duration::from_secs(5), || {
        let n = gw.mock.state().early_closes().len();
        async move { (n >= 2).then_some(()) }
    })
    .await;
    assert!(left.elapsed() < Duration::from_secs(2));
    assert_eq!(calls_naming(&gw, "ttft_ms=20000"), 1);
    assert_eq!(calls_naming(&gw, "Fallback"), 0);
}
