//! End-to-end pipeline tests: HTTP → ingress → NATS → worker → mock upstream → frames → SSE/JSON.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use futures::StreamExt as _;
use std::time::Duration;
use switchyard_mock::DEFAULT_TEXT;

#[tokio::test]
async fn non_streamed_completion_with_exact_usage() {
    let gw = start(Options::default()).await;
    let (status, headers, body) =
        post_json(&gw.base, &chat("demo/mock", "Say hello please", false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "demo/mock");
    assert_eq!(body["choices"][0]["message"]["content"], DEFAULT_TEXT);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    assert_eq!(body["usage"]["completion_tokens"], 13);
    assert_eq!(body["usage"]["total_tokens"], 16);
    assert_eq!(headers["x-switchyard-target"], "mock");
    assert_eq!(headers["x-switchyard-fallbacks"], "0");
    // A non-streaming client gets a non-streaming upstream call (usage comes in the body).
    let upstream = gw.mock.requests();
    assert_eq!(upstream.len(), 1);
    assert_eq!(upstream[0].body.get("stream"), None);
    assert_eq!(upstream[0].body.get("stream_options"), None);
    assert_eq!(upstream[0].body["model"], "mock");
}

#[tokio::test]
async fn streamed_completion_headers_chunks_and_done() {
    let gw = start(Options::default()).await;
    let r = post_sse(&gw.base, &chat("demo/mock", "hi", true)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    assert_eq!(r.headers["cache-control"], "no-cache");
    assert_eq!(r.headers["x-accel-buffering"], "no");
    assert_eq!(r.content(), DEFAULT_TEXT);
    assert_eq!(r.finish_reason().as_deref(), Some("stop"));
    assert_eq!(r.done_count(), 1);
    assert_eq!(r.events.last().map(String::as_str), Some("[DONE]"));
    // Usage was not asked for: no chunk carries a usage field.
    assert!(r.json_events().iter().all(|e| e.get("usage").is_none()));
    // One chunk per word plus the role chunk and the finish chunk.
    assert_eq!(r.json_events().len(), 13 + 2);
}

#[tokio::test]
async fn include_usage_adds_a_final_usage_chunk() {
    let gw = start(Options::default()).await;
    let mut body = chat("demo/mock", "one two three four", true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let r = post_sse(&gw.base, &body).await;
    let events = r.json_events();
    let last = events.last().unwrap();
    assert_eq!(last["choices"], serde_json::json!([]));
    assert_eq!(last["usage"]["prompt_tokens"], 4);
    assert_eq!(last["usage"]["completion_tokens"], 13);
    assert_eq!(last["usage"]["total_tokens"], 17);
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|e| e["usage"].is_null())
    );
}

/// FC-03: an upstream writing `data:{...}` with no space after the colon, ending `data:[DONE]`.
#[tokio::test]
async fn fc03_data_without_space() {
    let gw = start(Options::default()).await;
    let r = post_sse(
        &gw.base,
        &chat("demo/mock", "#mock compact=1 text=Hi", true),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "Hi");
    assert_eq!(r.finish_reason().as_deref(), Some("stop"));
    assert_eq!(r.done_count(), 1);
}

/// FC-01 (OpenAI form): every upstream event split mid-JSON across separate TCP writes, with
/// CRLF line endings and multi-byte characters split across writes.
#[tokio::test]
async fn fc01_events_split_mid_json() {
    let gw = start(Options::default()).await;
    let text = "Hello,+world+%E4%B8%96%E7%95%8C+%F0%9F%8E%89";
    for extra in ["", " crlf=1"] {
        let prompt = format!("#mock split_every=7 chunks=4 text={text}{extra}");
        let r = post_sse(&gw.base, &chat("demo/mock", &prompt, true)).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.content(), "Hello, world 世界 🎉");
        assert_eq!(r.finish_reason().as_deref(), Some("stop"));
        assert_eq!(r.done_count(), 1);
        assert!(r.json_events().iter().all(|e| e.get("error").is_none()));
    }
}

#[tokio::test]
async fn falls_back_before_first_content() {
    let gw = start(Options::default()).await;
    let r = post_sse(&gw.base, &chat("demo/fallback", "hi", true)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), DEFAULT_TEXT);
    assert_eq!(r.headers["x-switchyard-target"], "mock");
    assert_eq!(r.headers["x-switchyard-fallbacks"], "1");
    let (status, headers, body) = post_json(&gw.base, &chat("demo/fallback", "hi", false)).await;
    assert_eq!(status, 200);
    assert_eq!(body["choices"][0]["message"]["content"], DEFAULT_TEXT);
    assert_eq!(headers["x-switchyard-fallbacks"], "1");
}

#[tokio::test]
async fn error_after_content_is_an_error_event_not_a_silent_end() {
    let gw = start(Options::default()).await;
    let r = post_sse(&gw.base, &chat("demo/mock", "#mock error_after=2", true)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "Hello from ");
    assert_eq!(r.done_count(), 0);
    let last = r.json_events().last().cloned().unwrap();
    assert_eq!(last["error"]["type"], "upstream_error");
    assert_eq!(last["error"]["code"], "upstream_error");
    assert_eq!(r.finish_reason(), None);
}

#[tokio::test]
async fn upstream_errors_map_to_openai_shape_and_status() {
    let gw = start(Options::default()).await;
    // 429 with Retry-After, single target: passed on with the header.
    let resp = post_keyless(
        &gw.base,
        &chat("demo/mock", "#mock status=429 retry_after=7", false),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    // A 400 from the upstream is the caller's fault: 400, never retried.
    let (status, _, body) = post_json(&gw.base, &chat("demo/mock", "#mock status=400", true)).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(gw.mock.request_count(), 2);
    // Every target unreachable: 502 naming the cause.
    let (status, _, body) = post_json(&gw.base, &chat("demo/dead", "hi", false)).await;
    assert_eq!(status, 502);
    assert_eq!(body["error"]["code"], "upstream_unreachable");
}

#[tokio::test]
async fn bad_input_gets_a_400_naming_the_parameter() {
    let gw = start(Options::default()).await;
    let (status, _, body) = post_json(&gw.base, &serde_json::json!({"model": "demo/mock", "messages": [{"role": "user"}], "temperature": 9})).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "temperature");
    let (status, _, body) = post_json(&gw.base, &chat("nope/nope", "hi", false)).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "model_not_found");
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.base))
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(gw.mock.request_count(), 0);
}

#[tokio::test]
async fn no_worker_is_a_fast_503() {
    let gw = start(Options {
        worker: false,
        ..Options::default()
    })
    .await;
    let started = std::time::Instant::now();
    let (status, _, body) = post_json(&gw.base, &chat("demo/mock", "hi", false)).await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "no_capacity");
    // NATS "no responders" answers at once; no waiting for the first-frame timeout (2 s here).
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn heartbeats_keep_a_slow_model_alive() {
    // Worker silence limit 3 s, heartbeat 200 ms, first token after 3.5 s: succeeds only because
    // heartbeats prove the worker is alive.
    let mut config = test_config(serde_json::json!({}));
    config.timeouts.first_frame_ms = 1000;
    let gw = start_config(config).await;
    let r = post_sse(
        &gw.base,
        &chat("demo/mock", "#mock ttft_ms=3500 text=late", true),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "late");
}

#[tokio::test]
async fn usage_reaches_the_ledger_once_per_side() {
    let gw = billed_gateway().await;
    let (status, headers, _) = post_json(
        &gw.base,
        &chat(
            "demo/mock",
            "#mock prompt_tokens=11 completion_tokens=5 cached_tokens=3",
            false,
        ),
    )
    .await;
    assert_eq!(status, 200);
    let id: uuid::Uuid = headers["x-request-id"].to_str().unwrap().parse().unwrap();
    let ledger = gw.ledger.clone().unwrap();
    let rows = ledger_rows(&ledger, id, 2).await;
    for r in &rows {
        assert_eq!(r.usage.prompt_tokens, 11);
        assert_eq!(r.usage.cached_tokens, 3);
        assert_eq!(r.usage.completion_tokens, 5);
        assert_eq!(r.model, "demo/mock");
        assert_eq!(r.target.as_deref(), Some("mock"));
        assert!(!r.estimated);
    }
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_call() {
    let gw = billed_gateway().await;
    let resp = post_keyless(
        &gw.base,
        &chat("demo/mock", "#mock text_len=2000 chunk_delay_ms=100", true),
    )
    .await;
    let id = request_id(resp.headers());
    let mut stream = resp.bytes_stream();
    use futures::StreamExt;
    // Read the first content, then go away.
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(stream);
    let ledger = gw.ledger.clone().unwrap();
    // Both sides record the request as cancelled, with estimated usage for what was produced.
    let rows = ledger_rows(&ledger, id, 2).await;
    for r in &rows {
        assert_eq!(
            r.status,
            switchyard_schemas::usage::UsageStatus::Cancelled,
            "{r:?}"
        );
        assert!(
            r.latency_ms < 5_000,
            "the upstream call was not aborted: {r:?}"
        );
    }
}

/// FC-01: an Anthropic upstream whose `content_block_delta` event arrives as three TCP writes:
/// `event: content_block_delta\n` | `data: {..."type":"text_del` | `ta","text":"Hello, world"}}\n\n`.
#[tokio::test]
async fn fc01_anthropic_event_split_across_three_writes() {
    let gw = start(Options::default()).await;
    let prompt = "Greet me\n#mock text=Hello,+world chunks=1 id=msg_fc01";
    // The exact bytes the mock sends for this request (same word count, so the same usage), to
    // find the split offsets.
    let upstream_body = serde_json::json!({
        "model": "claude-test", "max_tokens": 4096, "stream": true,
        "messages": [{"role": "user", "content": [{"type": "text", "text": format!("{prompt} split=1")}]}]
    });
    let raw = post_text(
        format!("{}/v1/messages", gw.mock.base_url()),
        &upstream_body,
    )
    .await;
    let event = raw.find("event: content_block_delta\n").unwrap();
    let data = event + "event: content_block_delta\n".len();
    let mid = data + raw[data..].find("text_del").unwrap() + "text_del".len();
    let end = data + raw[data..].find("\n\n").unwrap() + 2;
    assert_eq!(
        &raw[data..mid],
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_del"#
    );
    assert_eq!(&raw[mid..end], "ta\",\"text\":\"Hello, world\"}}\n\n");
    let split = format!("{event},{data},{mid},{end}");
    let mut body = chat("demo/claude", &format!("{prompt} split={split}"), true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let r = post_sse(&gw.base, &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "Hello, world");
    assert_eq!(r.finish_reason().as_deref(), Some("stop"));
    assert_eq!(r.done_count(), 1);
    assert!(r.json_events().iter().all(|e| e.get("error").is_none()));
    assert_eq!(
        r.json_events().last().unwrap()["usage"]["completion_tokens"],
        2
    );
    assert_eq!(r.json_events()[0]["model"], "demo/claude");
    // The same bytes reached the adapter: one upstream call with the split applied.
    assert_eq!(gw.mock.request_count(), 2);
}

#[tokio::test]
async fn body_larger_than_nats_max_payload_is_413() {
    let gw = start(Options::default()).await;
    // The test server's max_payload is 8 MiB (natsd).
    let big = "x ".repeat(4_500_000);
    let (status, _, body) = post_json(&gw.base, &chat("demo/mock", &big, false)).await;
    assert_eq!(status, 413);
    assert_eq!(body["error"]["code"], "request_too_large");
    assert_eq!(gw.mock.request_count(), 0);
}

/// A worker replica that takes a request and then dies (here: a queue-group member that never
/// answers and leaves) costs the client nothing: the same target is tried once more, on the
/// worker that is left, and the client gets the answer (not 503 `no_capacity`).
#[tokio::test]
async fn a_lost_worker_is_replaced_by_another_replica_of_the_same_target() {
    use switchyard_schemas::subjects::{CAP_CHAT, Subjects};
    let gw = start(Options {
        worker: false,
        ..Options::default()
    })
    .await;
    let subjects = Subjects::new(gw.config.get().subject_prefix.clone());
    let nats = async_nats::connect(gw.nats.url()).await.unwrap();
    // The "dead" replica: in the workers' queue group, it swallows the first request.
    let mut dead = nats
        .queue_subscribe(
            subjects.request(CAP_CHAT, "openai"),
            Subjects::worker_queue_group("openai"),
        )
        .await
        .unwrap();
    nats.flush().await.unwrap();
    let base = gw.base.clone();
    let client = tokio::spawn(async move {
        post_json(
            &base,
            &chat("demo/mock", "#mock text=served-by-the-other", false),
        )
        .await
    });
    let swallowed = tokio::time::timeout(Duration::from_secs(20), dead.next())
        .await
        .expect("the first attempt reached the dead replica")
        .unwrap();
    let first: switchyard_schemas::ChatRequest =
        serde_json::from_slice(&swallowed.payload).unwrap();
    dead.unsubscribe().await.unwrap();
    // The live replica joins; the retry (after `first_frame_ms`, 2 s) goes to it.
    spawn_worker(&gw, gw.config.clone(), "live", gw.worker_shutdown.clone()).await;
    let (status, headers, body) = client.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "served-by-the-other"
    );
    assert_eq!(headers["x-switchyard-worker"], "live");
    assert_eq!(headers["x-request-id"], first.id.to_string().as_str());
    assert_eq!(gw.mock.request_count(), 1);
}
