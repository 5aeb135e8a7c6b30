//! The answer cache end to end: real nats-server, the cache service with the real embedding model
//! (all-MiniLM-L6-v2 via ONNX Runtime, installed by `scripts/bootstrap`), ingress, a worker and
//! the mock upstream. Field cases FC-25, FC-27, FC-28; restart from KV; purge; client control.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use switchyard_schemas::cache::PurgeRequest;
use switchyard_schemas::subjects::Subjects;
use switchyard_schemas::usage::UsageKind;
use tokio_util::sync::CancellationToken;

fn header(h: &reqwest::header::HeaderMap, name: &str) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

async fn cached_gateway(models: Value, billing: bool) -> Gateway {
    start(Options {
        config: test_config(json!({"models": models})),
        billing,
        cache: true,
        ..Options::default()
    })
    .await
}

fn user(model: &str, text: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": text}]})
}

/// Sends `body` and returns (x-switchyard-cache, content, headers).
async fn ask(
    base: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (String, String, reqwest::header::HeaderMap) {
    let resp = send_with(base, headers, body).await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    let v: Value = resp.json().await.unwrap();
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    (header(&h, "x-switchyard-cache"), content, h)
}

/// FC-25: threshold 0.8; "Hello world", "What is 1+1?", "How do I turn on dark mode?", "How do I
/// turn off dark mode?" in order: every one misses and is answered by the upstream (the 2nd
/// catches distance-as-similarity, the 4th the negation/opposite guard).
#[tokio::test]
async fn fc25_unrelated_and_opposite_questions_miss() {
    let gw = cached_gateway(
        json!([{"id": "demo/mock", "targets": ["mock"], "cache": {"threshold": 0.8}}]),
        false,
    )
    .await;
    let texts = [
        "Hello world",
        "What is 1+1?",
        "How do I turn on dark mode?",
        "How do I turn off dark mode?",
    ];
    for (i, t) in texts.iter().enumerate() {
        let before = gw.mock.request_count();
        let (outcome, content, _) = ask(&gw.base, &user("demo/mock", t), &[]).await;
        assert_eq!(outcome, "miss", "message {} `{t}`", i + 1);
        assert!(!content.is_empty());
        assert_eq!(
            gw.mock.request_count(),
            before + 1,
            "`{t}` reached the upstream"
        );
    }
    // The same question again is an exact hit; a paraphrase is a semantic hit with its score.
    let before = gw.mock.request_count();
    let (outcome, _, _) = ask(
        &gw.base,
        &user("demo/mock", "How do I turn on dark mode?"),
        &[],
    )
    .await;
    assert_eq!(outcome, "hit");
    let (outcome, _, h) = ask(
        &gw.base,
        &user("demo/mock", "How can I enable dark mode?"),
        &[],
    )
    .await;
    assert_eq!(outcome, "semantic-hit");
    let similarity: f32 = header(&h, "x-switchyard-cache-similarity").parse().unwrap();
    assert!((0.8..=1.0).contains(&similarity), "{similarity}");
    assert_eq!(
        gw.mock.request_count(),
        before,
        "hits never reach the upstream"
    );
}

/// FC-27: the same messages with model a/max_tokens 16, model b/max_tokens 16 and model
/// a/max_tokens 400 are three upstream calls with three different answers; `Cache-Control:
/// no-cache` is honoured.
#[tokio::test]
async fn fc27_model_and_max_tokens_scope_the_cache() {
    let a_text = "Alpha+one+two+three+four+five+six+seven+eight+nine+ten+eleven+twelve+thirteen+fourteen+fifteen+sixteen+seventeen+eighteen+nineteen";
    let b_text = "Bravo+one+two+three+four+five+six+seven+eight+nine+ten+eleven+twelve+thirteen+fourteen+fifteen+sixteen+seventeen+eighteen+nineteen";
    let gw = start(Options {
        config: test_config(json!({
            "targets": [
                {"id": "mock", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "mock"},
                {"id": "ta", "provider": "openai", "base_url": format!("builtin:mock/x/text={a_text}"), "upstream_model": "mock-a"},
                {"id": "tb", "provider": "openai", "base_url": format!("builtin:mock/x/text={b_text}"), "upstream_model": "mock-b"}
            ],
            "models": [
                {"id": "a", "targets": ["ta"]},
                {"id": "b", "targets": ["tb"]},
                {"id": "off", "targets": ["ta"], "cache": {"enabled": false}}
            ]
        })),
        cache: true,
        ..Options::default()
    })
    .await;
    let body = |model: &str, max_tokens: u32| {
        json!({"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": "Answer briefly."},
                         {"role": "user", "content": "Describe the release process."}]})
    };
    let mut answers = Vec::new();
    for (model, max) in [("a", 16), ("b", 16), ("a", 400)] {
        let before = gw.mock.request_count();
        let (outcome, content, _) = ask(&gw.base, &body(model, max), &[]).await;
        assert_eq!(outcome, "miss", "{model}/{max}");
        assert_eq!(
            gw.mock.request_count(),
            before + 1,
            "{model}/{max} called the upstream"
        );
        answers.push(content);
    }
    assert_ne!(answers[0], answers[1]);
    assert_ne!(answers[0], answers[2]);
    assert_ne!(answers[1], answers[2]);
    // Now each is cached under its own scope.
    let before = gw.mock.request_count();
    for ((model, max), expected) in [("a", 16), ("b", 16), ("a", 400)].iter().zip(&answers) {
        let (outcome, content, _) = ask(&gw.base, &body(model, *max), &[]).await;
        assert_eq!(outcome, "hit", "{model}/{max}");
        assert_eq!(&content, expected);
    }
    assert_eq!(gw.mock.request_count(), before);
    // no-cache: answered by the upstream again.
    let (outcome, content, _) =
        ask(&gw.base, &body("a", 16), &[("cache-control", "no-cache")]).await;
    assert_eq!(outcome, "bypass");
    assert_eq!(content, answers[0]);
    assert_eq!(gw.mock.request_count(), before + 1);
    // no-store: the answer is not kept.
    let fresh = body("a", 17);
    let (outcome, _, _) = ask(&gw.base, &fresh, &[("cache-control", "no-store")]).await;
    assert_eq!(outcome, "miss");
    let (outcome, _, _) = ask(&gw.base, &fresh, &[]).await;
    assert_eq!(outcome, "miss", "a no-store answer was served");
    // TTL override: gone after it expires.
    let short = body("a", 18);
    ask(&gw.base, &short, &[("x-switchyard-cache-ttl", "1")]).await;
    assert_eq!(ask(&gw.base, &short, &[]).await.0, "hit");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        ask(&gw.base, &short, &[]).await.0,
        "miss",
        "expired entry served"
    );
    // Route opt-out.
    for _ in 0..2 {
        assert_eq!(ask(&gw.base, &body("off", 16), &[]).await.0, "bypass");
    }
}

/// FC-28: a streaming request with include_usage sent twice; the upstream (usage 12/5) is called
/// once; the second answer is a valid SSE replay with the same content ending with a usage
/// chunk; the ledger shows a cache hit with zero upstream cost.
#[tokio::test]
async fn fc28_streaming_replay_with_usage_and_ledger() {
    let gw = cached_gateway(json!([{"id": "demo/mock", "targets": ["mock"]}]), true).await;
    let body = json!({"model": "demo/mock", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Stream me the answer.\n#mock prompt_tokens=12 completion_tokens=5"}]});
    let before = gw.mock.request_count();
    let first = post_sse(&gw.base, &body).await;
    let second = post_sse(&gw.base, &body).await;
    assert_eq!(
        gw.mock.request_count(),
        before + 1,
        "the upstream was called once"
    );
    assert_eq!(header(&first.headers, "x-switchyard-cache"), "miss");
    assert_eq!(header(&second.headers, "x-switchyard-cache"), "hit");
    assert_eq!(second.status, 200);
    assert_eq!(header(&second.headers, "content-type"), "text/event-stream");
    // Same content, chunked like the original.
    assert_eq!(second.content(), first.content());
    let pieces = |s: &SseBody| {
        s.json_events()
            .iter()
            .filter(|e| {
                e.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
                    .is_some_and(|c| !c.is_empty())
            })
            .count()
    };
    assert!(pieces(&second) > 1);
    assert_eq!(pieces(&second), pieces(&first));
    // Valid stream: one id, role first, finish, usage chunk last, then [DONE].
    let events = second.json_events();
    let id = events[0]["id"].as_str().unwrap();
    assert!(events.iter().all(|e| e["id"] == id));
    assert_ne!(
        first.json_events()[0]["id"],
        events[0]["id"],
        "a hit has a new id"
    );
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(second.finish_reason().as_deref(), Some("stop"));
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["prompt_tokens"], 12);
    assert_eq!(last["usage"]["completion_tokens"], 5);
    assert_eq!(second.events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(second.done_count(), 1);
    // Ledger: the hit is a charge row with cache_hit and the original usage, no upstream call.
    let ledger = gw.ledger.as_ref().unwrap();
    let hit_id: uuid::Uuid = header(&second.headers, "x-request-id").parse().unwrap();
    let rows = ledger_rows(ledger, hit_id, 1).await;
    assert_eq!(rows[0].kind, UsageKind::Charge);
    assert!(rows[0].cache_hit);
    assert_eq!(
        (rows[0].usage.prompt_tokens, rows[0].usage.completion_tokens),
        (12, 5)
    );
    assert_eq!(rows[0].target, None);
    let first_id: uuid::Uuid = header(&first.headers, "x-request-id").parse().unwrap();
    let first_rows = ledger_rows(ledger, first_id, 2).await;
    assert!(first_rows.iter().any(|r| r.kind == UsageKind::Upstream));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rows = ledger.usage_for(hit_id).await.unwrap();
    assert_eq!(rows.len(), 1, "no upstream row for a cache hit: {rows:?}");
    assert_eq!(
        ledger
            .cost_of(hit_id, UsageKind::Upstream, 0)
            .await
            .unwrap(),
        None
    );
}

/// Kill a cache instance and start another: it serves hits (exact and semantic) for entries
/// stored before, from the KV bucket.
#[tokio::test]
async fn a_new_instance_rebuilds_from_kv() {
    let gw = cached_gateway(json!([{"id": "demo/mock", "targets": ["mock"]}]), false).await;
    let q = user("demo/mock", "How do I reset my password?");
    assert_eq!(ask(&gw.base, &q, &[]).await.0, "miss");
    assert_eq!(ask(&gw.base, &q, &[]).await.0, "hit");
    // Let the KV put land, then stop the instance.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.cache_shutdown.cancel();
    let subjects = Subjects::default();
    // No instance: bypass, answered by the upstream.
    eventually(Duration::from_secs(5), || {
        let (base, q) = (gw.base.clone(), q.clone());
        async move { (ask(&base, &q, &[]).await.0 == "bypass").then_some(()) }
    })
    .await;
    let token = CancellationToken::new();
    spawn_cache(&gw, &subjects, token.clone()).await;
    let before = gw.mock.request_count();
    assert_eq!(ask(&gw.base, &q, &[]).await.0, "hit");
    let (outcome, _, _) = ask(
        &gw.base,
        &user("demo/mock", "How can I reset my password?"),
        &[],
    )
    .await;
    assert_eq!(outcome, "semantic-hit");
    assert_eq!(gw.mock.request_count(), before);
    token.cancel();
}

/// Admin purge by route and of everything, through NATS (what `switchyard cache purge` sends).
#[tokio::test]
async fn purge_by_route_and_all() {
    let gw = cached_gateway(
        json!([{"id": "demo/mock", "targets": ["mock"]}, {"id": "demo/other", "targets": ["mock"]}]),
        false,
    )
    .await;
    let a = user("demo/mock", "What is the capital of France?");
    let b = user("demo/other", "What is the capital of France?");
    for q in [&a, &b] {
        ask(&gw.base, q, &[]).await;
        assert_eq!(ask(&gw.base, q, &[]).await.0, "hit");
    }
    let purge = |req: PurgeRequest| purge_cache(&gw, req);
    let r = purge(PurgeRequest::default()).await;
    assert!(r.error.is_some(), "a purge without a filter is refused");
    let r = purge(PurgeRequest {
        route: Some("demo/mock".into()),
        ..Default::default()
    })
    .await;
    assert_eq!((r.deleted, r.error), (1, None));
    assert_eq!(
        ask(&gw.base, &a, &[("cache-control", "no-store")]).await.0,
        "miss"
    );
    assert_eq!(ask(&gw.base, &b, &[]).await.0, "hit");
    let r = purge(PurgeRequest {
        all: true,
        ..Default::default()
    })
    .await;
    assert_eq!(r.deleted, 1);
    assert_eq!(ask(&gw.base, &b, &[]).await.0, "miss");
}

/// The Anthropic front door shares the cache: the second identical request is a hit with a valid
/// Message and a new id.
#[tokio::test]
async fn anthropic_front_door_hit() {
    let gw = cached_gateway(json!([{"id": "demo/mock", "targets": ["mock"]}]), false).await;
    let body = json!({"model": "demo/mock", "max_tokens": 64,
        "messages": [{"role": "user", "content": "Name a prime number."}]});
    let send = || async {
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/messages", gw.base))
            .header("x-api-key", "sk-test")
            .json(&body)
            .send()
            .await
            .unwrap();
        let h = resp.headers().clone();
        (
            header(&h, "x-switchyard-cache"),
            resp.json::<Value>().await.unwrap(),
        )
    };
    let (o1, m1) = send().await;
    let (o2, m2) = send().await;
    assert_eq!((o1.as_str(), o2.as_str()), ("miss", "hit"));
    assert_eq!(m2["content"], m1["content"]);
    assert_eq!(m2["type"], "message");
    assert_ne!(m2["id"], m1["id"]);
    // A streamed request for the same conversation replays Anthropic events.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/messages", gw.base))
        .json(&sbody)
        .send()
        .await
        .unwrap();
    assert_eq!(header(resp.headers(), "x-switchyard-cache"), "hit");
    let text = resp.text().await.unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    assert!(
        text.trim_end()
            .ends_with("data: {\"type\":\"message_stop\"}"),
        "{text}"
    );
}

/// A cache that does not answer in time is a bypass after the timeout, never an error.
#[tokio::test]
async fn a_silent_cache_is_a_bypass_within_the_timeout() {
    let gw = start(Options::default()).await;
    // No cache instance at all: NATS says "no responders" at once.
    let (outcome, content, _) = ask(&gw.base, &user("demo/mock", "hi"), &[]).await;
    assert_eq!(outcome, "bypass");
    assert!(!content.is_empty());
    // An instance that never answers.
    let nats = async_nats::connect(gw.nats.url()).await.unwrap();
    let _sub = nats
        .queue_subscribe("sy.cache.lookup", "cache".into())
        .await
        .unwrap();
    nats.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (outcome, content, _) = ask(&gw.base, &user("demo/mock", "hi"), &[]).await;
    assert_eq!(outcome, "bypass");
    assert!(!content.is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        gw.ingress.cache.timeout(),
        Duration::from_millis(switchyard_ingress::cache_client::DEFAULT_TIMEOUT_MS)
    );
}

/// With API keys on, the cache is scoped by tenant: tenant B never gets tenant A's answer.
#[tokio::test]
async fn answers_are_never_shared_across_tenants() {
    let gw = start(Options {
        config: test_config(json!({"keys": [
            {"id": "a", "tenant": "tenant-a", "key": "sk-tenant-a-0123456789"},
            {"id": "b", "tenant": "tenant-b", "key": "sk-tenant-b-0123456789"}
        ]})),
        cache: true,
        ..Options::default()
    })
    .await;
    let body = user("demo/mock", "What is the refund policy for annual plans?");
    let ask_as = |key: &'static str| {
        let (base, body) = (gw.base.clone(), body.clone());
        async move {
            let resp = post_keyed(&base, key, &body).await;
            assert_eq!(resp.status(), 200);
            header(resp.headers(), "x-switchyard-cache")
        }
    };
    assert_eq!(ask_as("sk-tenant-a-0123456789").await, "miss");
    assert_eq!(ask_as("sk-tenant-a-0123456789").await, "hit");
    assert_eq!(ask_as("sk-tenant-b-0123456789").await, "miss");
    assert_eq!(ask_as("sk-tenant-b-0123456789").await, "hit");
}

/// A provider passthrough field that may shape the answer (here OpenAI's `logit_bias`) is not
/// part of the cache key, so such requests bypass the cache; `metadata`/`store` do not.
#[tokio::test]
async fn answer_shaping_passthrough_bypasses_the_cache() {
    let gw = cached_gateway(json!([{"id": "demo/mock", "targets": ["mock"]}]), false).await;
    let mut body = user("demo/mock", "Which color is the sky on a clear day?");
    body["logit_bias"] = json!({"1234": -100});
    for _ in 0..2 {
        let (cache, content, _) = ask(&gw.base, &body, &[]).await;
        assert_eq!(
            (cache.as_str(), content.as_str()),
            ("bypass", switchyard_mock::DEFAULT_TEXT)
        );
    }
    assert_eq!(gw.mock.request_count(), 2);
    let mut plain = user("demo/mock", "Which color is the sky at night?");
    plain["store"] = json!(false);
    plain["metadata"] = json!({"k": "v"});
    assert_eq!(ask(&gw.base, &plain, &[]).await.0, "miss");
    assert_eq!(ask(&gw.base, &plain, &[]).await.0, "hit");
}
