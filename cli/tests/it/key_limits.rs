//! Per-key request limits (RPM, TPM, concurrency) across ingress replicas, the standard
//! `x-ratelimit-*` headers, upstream rate-limit headers under `x-upstream-`, upstream 429s, and
//! targets saturated by their own limits (FC-44).

use crate::common::*;
use serde_json::{Value, json};
use std::time::Duration;
use switchyard_schemas::now_ms;

const FC44_KEYS: [&str; 4] = [
    "sk-fc44-chat-0123456789",
    "sk-fc44-stream-0123456789",
    "sk-fc44-messages-0123456789",
    "sk-fc44-upstream429-0123456789",
];

fn minute() -> u64 {
    now_ms() / 60_000
}

fn h<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// [`send`] to `/v1/chat/completions`.
async fn send_chat(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    body: &Value,
) -> reqwest::Response {
    send(http, base, "/v1/chat/completions", key, body).await
}

async fn send(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    key: &str,
    body: &Value,
) -> reqwest::Response {
    http.post(format!("{base}{path}"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Waits until the key's scope has nothing in flight (every request settled) and returns its
/// requests and tokens of the current minute.
async fn settled(app: &switchyard_ingress::AppState, key_id: &str) -> (u64, u64) {
    let key = format!("key.{key_id}");
    eventually(Duration::from_secs(10), || {
        let key = key.clone();
        async move {
            let s = app.rates.store().peek(&key).await.unwrap();
            (s.in_flight() == 0).then_some((s.requests, s.tokens))
        }
    })
    .await
}

/// FC-44 (BerriAI/litellm #21553, #27748): a key with an RPM limit of 100; the upstream's 200s
/// carry `x-ratelimit-*` and its 429 carries `retry-after: 17`. Non-streaming, streaming and
/// `/v1/messages` answers carry the gateway's own headers for the key (limit 100, remaining 99)
/// in their initial headers; the upstream's appear only as `x-upstream-…`; the 429 reaches the
/// client as 429 `retry-after: 17` with an OpenAI-shaped `rate_limit_error` and gives its
/// request back.
#[tokio::test]
async fn fc44_key_headers_upstream_headers_under_a_prefix_and_an_upstream_429() {
    let keys: Vec<Value> = ["chat", "stream", "messages", "u429"]
        .iter()
        .zip(FC44_KEYS)
        .map(|(id, key)| json!({"id": id, "tenant": "acme", "key": key, "limits": {"rpm": 100}}))
        .collect();
    let config = test_config(json!({
        "targets": [
            {"id": "oai", "provider": "openai", "base_url": "builtin:mock/x/rate_headers=1", "upstream_model": "mock"},
            {"id": "ant", "provider": "anthropic", "base_url": "builtin:mock/x/rate_headers=1", "upstream_model": "claude-test"}
        ],
        "models": [{"id": "fc44/gpt", "targets": ["oai"]}, {"id": "fc44/claude", "targets": ["ant"]}],
        "keys": keys,
    }));
    let gw = start_config(config).await;
    let http = reqwest::Client::new();
    let own = |headers: &reqwest::header::HeaderMap| {
        assert_eq!(
            h(headers, "x-ratelimit-limit-requests"),
            "100",
            "{headers:?}"
        );
        assert_eq!(h(headers, "x-ratelimit-remaining-requests"), "99");
        let reset = h(headers, "x-ratelimit-reset-requests");
        assert!(
            reset.ends_with("ms") || reset.ends_with('s'),
            "reset {reset}"
        );
        // No TPM on the key: no token headers of the gateway's.
        assert!(headers.get("x-ratelimit-limit-tokens").is_none());
    };
    let upstream = |headers: &reqwest::header::HeaderMap| {
        assert_eq!(h(headers, "x-upstream-ratelimit-limit-requests"), "10000");
        assert_eq!(
            h(headers, "x-upstream-ratelimit-remaining-requests"),
            "9999"
        );
        assert_eq!(h(headers, "x-upstream-ratelimit-limit-tokens"), "30000000");
        assert_eq!(
            h(headers, "x-upstream-ratelimit-remaining-tokens"),
            "29999000"
        );
        assert_eq!(h(headers, "x-upstream-ratelimit-reset-requests"), "6ms");
    };
    let m = minute();

    // Non-streaming.
    let resp = send_chat(
        &http,
        &gw.base,
        FC44_KEYS[0],
        &json!({"model": "fc44/gpt", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    own(resp.headers());
    upstream(resp.headers());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");

    // Streaming: the headers come with the first bytes, before the body is read.
    let streamed = json!({"model": "fc44/gpt", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let resp = send_chat(&http, &gw.base, FC44_KEYS[1], &streamed).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(h(resp.headers(), "content-type"), "text/event-stream");
    own(resp.headers());
    upstream(resp.headers());
    assert!(resp.text().await.unwrap().ends_with("data: [DONE]\n\n"));

    // Anthropic Messages, streamed: Anthropic's headers under the prefix too.
    let resp = http
        .post(format!("{}/v1/messages", gw.base))
        .header("x-api-key", FC44_KEYS[2])
        .header("anthropic-version", "2023-06-01")
        .json(
            &json!({"model": "fc44/claude", "max_tokens": 64, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    own(resp.headers());
    assert_eq!(
        h(
            resp.headers(),
            "x-upstream-anthropic-ratelimit-requests-limit"
        ),
        "4000"
    );
    assert_eq!(
        h(
            resp.headers(),
            "x-upstream-anthropic-ratelimit-requests-remaining"
        ),
        "3999"
    );
    assert!(
        resp.headers()
            .get("anthropic-ratelimit-requests-limit")
            .is_none()
    );
    assert!(resp.text().await.unwrap().contains("event: message_stop"));

    // The upstream's 429 with `retry-after: 17`, no other target: passed on, the SDK's backoff
    // applies; the refused request is given back to the key's RPM.
    let resp = send_chat(
        &http,
        &gw.base,
        FC44_KEYS[3],
        &chat("fc44/gpt", "#mock status=429 retry_after=17", false),
    )
    .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(h(resp.headers(), "retry-after"), "17");
    assert_eq!(h(resp.headers(), "x-ratelimit-limit-requests"), "100");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    if minute() == m {
        assert_eq!(settled(&gw.ingress, "u429").await, (0, 0));
        let resp = send_chat(
            &http,
            &gw.base,
            FC44_KEYS[3],
            &chat("fc44/gpt", "hi", false),
        )
        .await;
        assert_eq!(resp.status(), 200);
        own(resp.headers());
    }
}

/// 1,000 concurrent requests of one key with `rpm: K` through two ingress processes: exactly K
/// are admitted — their `x-ratelimit-remaining-requests` are exactly K-1, …, 0, each once — the
/// rest get 429 `rate_limit_exceeded` with a bare integer `Retry-After`, none a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_k_of_1000_concurrent_requests_fit_a_key_rpm_through_two_ingresses() {
    const REQUESTS: usize = 1_000;
    const K: u64 = 100;
    let keys: Vec<Value> = (0..3)
        .map(|i| {
            json!({"id": format!("load{i}"), "tenant": "acme",
                        "key": format!("sk-rpm-load-{i}-0123456789"), "limits": {"rpm": K}})
        })
        .collect();
    let config = test_config(json!({
        "keys": keys,
        "timeouts": {"first_frame_ms": 30000, "worker_silence_ms": 30000, "heartbeat_ms": 1000, "total_ms": 120000}
    }));
    let gw = start_config(config).await;
    let (second, _) = spawn_ingress(&gw).await;
    let bases = [gw.base.clone(), second];
    // A round that straddles a minute boundary counts two windows: it runs again on a fresh key
    // (a round takes seconds, so the second one cannot straddle too).
    for round in 0..3 {
        let key = format!("sk-rpm-load-{round}-0123456789");
        let m = minute();
        let results = fan_out(REQUESTS, |http, i| {
            let (base, key) = (bases[i % 2].clone(), key.clone());
            async move {
                let resp = send(
                    &http,
                    &base,
                    "/v1/chat/completions",
                    &key,
                    &chat("demo/mock", "hi", false),
                )
                .await;
                let status = resp.status().as_u16();
                let headers = resp.headers().clone();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                (status, headers, body)
            }
        })
        .await;
        if minute() != m {
            eprintln!("round {round} straddled a minute boundary; again with a fresh key");
            continue;
        }
        assert_admitted(&results, |r| r.0, K as usize);
        let mut remaining: Vec<u64> = Vec::new();
        for (status, headers, body) in &results {
            assert_eq!(h(headers, "x-ratelimit-limit-requests"), K.to_string());
            if *status == 200 {
                remaining.push(
                    h(headers, "x-ratelimit-remaining-requests")
                        .parse()
                        .unwrap(),
                );
            } else {
                assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
                assert_eq!(body["error"]["type"], "rate_limit_error");
                let retry: u64 = h(headers, "retry-after").parse().unwrap();
                assert!((1..=60).contains(&retry), "retry-after {retry}");
                assert_eq!(h(headers, "x-ratelimit-remaining-requests"), "0");
            }
        }
        remaining.sort_unstable();
        assert_eq!(remaining, (0..K).collect::<Vec<_>>());
        let id = format!("load{round}");
        assert_eq!(settled(&gw.ingress, &id).await.0, K);
        return;
    }
    panic!("three rounds straddled minute boundaries");
}

/// `max_concurrent: 2` with slow streams held open on one ingress: requests through the other
/// ingress are refused at once with 429 `rate_limit_exceeded`, `Retry-After: 1`, and consume no
/// RPM — after the streams end, the next answer's `x-ratelimit-remaining-requests` is exactly
/// RPM minus the three admitted requests.
#[tokio::test]
async fn concurrency_refusals_do_not_use_up_rpm() {
    const RPM: u64 = 20;
    let keys: Vec<Value> = (0..3)
        .map(|i| {
            json!({"id": format!("conc{i}"), "tenant": "acme",
                        "key": format!("sk-conc-{i}-0123456789"),
                        "limits": {"rpm": RPM, "max_concurrent": 2}})
        })
        .collect();
    let gw = start_config(test_config(json!({"keys": keys}))).await;
    let (second, _) = spawn_ingress(&gw).await;
    let http = reqwest::Client::new();
    for round in 0..3 {
        let key = format!("sk-conc-{round}-0123456789");
        let m = minute();
        // Two streams: the first chunk at once, then 4 more 400 ms apart.
        let slow = chat("demo/mock", "#mock chunks=5 chunk_delay_ms=400", true);
        let mut streams = Vec::new();
        for _ in 0..2 {
            let resp = send_chat(&http, &gw.base, &key, &slow).await;
            assert_eq!(resp.status(), 200);
            streams.push(resp);
        }
        let mut left: Vec<String> = streams
            .iter()
            .map(|r| h(r.headers(), "x-ratelimit-remaining-requests").to_owned())
            .collect();
        left.sort_unstable();
        // Both in flight: five more through the other ingress are refused.
        let quick = chat("demo/mock", "hi", false);
        let refused = futures::future::join_all(
            (0..5).map(|_| send(&http, &second, "/v1/chat/completions", &key, &quick)),
        )
        .await;
        let mut bodies = Vec::new();
        for resp in refused {
            assert_eq!(resp.status(), 429);
            assert_eq!(h(resp.headers(), "retry-after"), "1");
            assert_eq!(
                h(resp.headers(), "x-ratelimit-remaining-requests"),
                (RPM - 2).to_string()
            );
            bodies.push(resp.json::<Value>().await.unwrap());
        }
        for b in &bodies {
            assert_eq!(b["error"]["code"], "rate_limit_exceeded");
            let msg = error_message(b);
            assert!(
                msg.contains("concurrent requests: limit 2, in flight 2"),
                "{msg}"
            );
        }
        for s in streams {
            assert!(s.text().await.unwrap().ends_with("data: [DONE]\n\n"));
        }
        let id = format!("conc{round}");
        let (requests, _) = settled(&gw.ingress, &id).await;
        let resp = send(
            &http,
            &second,
            "/v1/chat/completions",
            &key,
            &chat("demo/mock", "hi", false),
        )
        .await;
        assert_eq!(resp.status(), 200);
        let after = h(resp.headers(), "x-ratelimit-remaining-requests").to_owned();
        if minute() != m {
            eprintln!("round {round} straddled a minute boundary; again with a fresh key");
            continue;
        }
        assert_eq!(left, [(RPM - 2).to_string(), (RPM - 1).to_string()]);
        assert_eq!(requests, 2);
        assert_eq!(after, (RPM - 3).to_string());
        return;
    }
    panic!("three rounds straddled minute boundaries");
}

/// TPM: the estimate (prompt + `max_tokens`) is charged at admission and replaced by the tokens
/// the upstream reported when the request ends; a request over what is left is refused.
#[tokio::test]
async fn tpm_charges_the_estimate_then_settles_to_actual_tokens() {
    let key = "sk-tpm-0123456789abcdef";
    let gw = start(Options {
        config: test_config(json!({
            "keys": [{"id": "tpm", "tenant": "acme", "key": key, "limits": {"tpm": 1000}}]
        })),
        ..Options::default()
    })
    .await;
    let http = reqwest::Client::new();
    let m = minute();
    let body = json!({"model": "demo/mock", "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hello world\n#mock prompt_tokens=10 completion_tokens=20"}]});
    let resp = send_chat(&http, &gw.base, key, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(h(resp.headers(), "x-ratelimit-limit-tokens"), "1000");
    let estimate = 1000
        - h(resp.headers(), "x-ratelimit-remaining-tokens")
            .parse::<u64>()
            .unwrap();
    assert!(estimate > 100, "estimate {estimate}");
    assert!(resp.headers().get("x-ratelimit-limit-requests").is_none());
    let (_, tokens) = settled(&gw.ingress, "tpm").await;
    // One request over what is left: refused, nothing charged.
    let big = json!({"model": "demo/mock", "max_tokens": 990,
        "messages": [{"role": "user", "content": "hi"}]});
    let resp = send_chat(&http, &gw.base, key, &big).await;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    if minute() == m {
        assert_eq!(tokens, 30);
        assert_eq!(status, 429, "{body}");
        assert!(
            error_message(&body).contains("tokens per minute (TPM): limit 1000, used 30"),
            "{body}"
        );
        assert_eq!(settled(&gw.ingress, "tpm").await.1, 30);
    }
}

/// Every target of a model saturated by its own `max_concurrency`: 429 with `Retry-After`, not
/// 503 `no_capacity`.
#[tokio::test]
async fn saturated_targets_answer_429_with_retry_after() {
    let gw = start(Options {
        config: test_config(json!({
            "targets": [
                {"id": "s1", "provider": "openai", "base_url": "builtin:mock/x/ttft_ms=1500,target=s1", "upstream_model": "mock", "limits": {"max_concurrency": 1}},
                {"id": "s2", "provider": "openai", "base_url": "builtin:mock/x/ttft_ms=1500,target=s2", "upstream_model": "mock", "limits": {"max_concurrency": 1}}
            ],
            "models": [{"id": "sat/model", "targets": ["s1", "s2"]}],
            "timeouts": {"first_frame_ms": 5000, "worker_silence_ms": 5000, "heartbeat_ms": 200}
        })),
        ..Options::default()
    })
    .await;
    let base = gw.base.clone();
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let base = base.clone();
            tokio::spawn(async move { post_json(&base, &chat("sat/model", "hi", false)).await.0 })
        })
        .collect();
    // Both targets hold one call each.
    eventually(Duration::from_secs(5), || async {
        (gw.mock.request_count() == 2).then_some(())
    })
    .await;
    let (status, headers, body) = post_json(&gw.base, &chat("sat/model", "hi", false)).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(h(&headers, "retry-after"), "1");
    assert!(error_message(&body).contains("max_concurrency"), "{body}");
    for b in busy {
        assert_eq!(b.await.unwrap(), 200);
    }
    assert_eq!(gw.mock.request_count(), 2);
}

/// Embeddings and cache hits are requests of the key too: each takes one RPM (a cache hit no
/// tokens) and carries the key's `x-ratelimit-*` headers; over the limit both are 429.
#[tokio::test]
async fn embeddings_and_cache_hits_count_and_carry_the_headers() {
    const KEY: &str = "sk-limits-embed-cache-0123456789";
    let config = test_config(json!({
        "models": [{"id": "demo/mock", "targets": ["mock"], "cache": {"semantic": false}}],
        "keys": [{"id": "ec", "tenant": "acme", "key": KEY, "limits": {"rpm": 4}}],
    }));
    let gw = start(Options {
        config,
        cache: true,
        ..Options::default()
    })
    .await;
    let http = reqwest::Client::new();
    // Retried on a fresh minute if the four requests straddle a minute boundary.
    loop {
        let m = minute();
        let embed = json!({"model": "demo/mock", "input": "hello"});
        let chat = json!({"model": "demo/mock", "messages": [{"role": "user", "content": format!("cache me {m}")}]});
        let r1 = send(&http, &gw.base, "/v1/embeddings", KEY, &embed).await;
        let s1 = (
            r1.status().as_u16(),
            h(r1.headers(), "x-ratelimit-remaining-requests").to_owned(),
        );
        let entries = || async {
            let nats = async_nats::connect(gw.nats.url()).await.unwrap();
            let kv = async_nats::jetstream::new(nats)
                .get_key_value(switchyard_cache::BUCKET)
                .await
                .unwrap();
            kv.status().await.unwrap().values()
        };
        let before = entries().await;
        let r2 = send_chat(&http, &gw.base, KEY, &chat).await;
        let s2 = (
            r2.status().as_u16(),
            h(r2.headers(), "x-switchyard-cache").to_owned(),
        );
        drop(r2.bytes().await);
        // The store of the first answer is asynchronous: wait (without spending requests) until
        // the cache service has shared it in KV, which it does after indexing it.
        eventually(Duration::from_secs(10), || async {
            (entries().await > before).then_some(())
        })
        .await;
        // Then ask until the cache answers (a miss before it would take a request too).
        let tries = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let hit = eventually(Duration::from_secs(10), || {
            let (http, base, chat, tries) =
                (http.clone(), gw.base.clone(), chat.clone(), tries.clone());
            async move {
                tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let r = send(&http, &base, "/v1/chat/completions", KEY, &chat).await;
                let cache = h(r.headers(), "x-switchyard-cache").to_owned();
                let out = (
                    r.status().as_u16(),
                    h(r.headers(), "x-ratelimit-limit-requests").to_owned(),
                    h(r.headers(), "x-ratelimit-remaining-requests").to_owned(),
                );
                (cache == "hit").then_some(out)
            }
        })
        .await;
        let used = 2 + tries.load(std::sync::atomic::Ordering::Relaxed);
        // What is left is exactly what further embeddings get before the 429.
        let mut admitted = 0;
        let over = loop {
            let r = send(&http, &gw.base, "/v1/embeddings", KEY, &embed).await;
            if r.status() != 200 {
                break (
                    r.status().as_u16(),
                    r.headers().get("retry-after").is_some(),
                );
            }
            admitted += 1;
        };
        if minute() != m {
            continue;
        }
        assert_eq!(s1, (200, "3".to_owned()), "embeddings counted");
        assert_eq!(s2, (200, "miss".to_owned()));
        assert_eq!(hit.0, 200);
        assert_eq!(hit.1, "4");
        assert_eq!(
            hit.2,
            (4 - used).to_string(),
            "the cache hit took a request"
        );
        assert_eq!(admitted, 4 - used);
        assert_eq!(over, (429, true));
        break;
    }
}
