//! Limits, circuit breaker, retries and per-target timeouts end to end: HTTP → ingress → NATS →
//! worker(s) → mock upstream, on a real nats-server. Targets share one mock and differ by their
//! `builtin:mock/x/<spec>` path prefix, which also tells their upstream calls apart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use futures::StreamExt as _;
use std::time::{Duration, Instant};
use switchyard_schemas::health::{HealthEvent, HealthState};
use switchyard_schemas::{ErrorClass, Frame, FrameBody};
use switchyard_workers::limits::{BucketState, LimitKind, bucket_key, count_tokens};
use tokio_util::sync::CancellationToken;

/// A gateway whose config is the standard test config plus `targets` and `models`.
fn config(targets: serde_json::Value, models: serde_json::Value) -> Options {
    let mut c = test_config(serde_json::json!({}));
    let extra: Vec<switchyard_schemas::config::TargetConfig> =
        serde_json::from_value(targets).unwrap();
    c.targets.extend(extra);
    let extra: Vec<switchyard_schemas::config::ModelConfig> =
        serde_json::from_value(models).unwrap();
    c.models.extend(extra);
    c.validate().unwrap();
    Options {
        config: c,
        ..Options::default()
    }
}

/// Upstream calls whose path starts with `/x/<spec>/`.
fn calls(gw: &Gateway, spec: &str) -> usize {
    let prefix = format!("/x/{spec}/");
    gw.mock
        .state()
        .count_matching(|r| r.path.starts_with(&prefix))
}

/// Subscribes to `sy.health.<target>` (`>` for all) and confirms the subscription.
async fn health(gw: &Gateway, target: &str) -> (async_nats::Client, async_nats::Subscriber) {
    let c = async_nats::connect(gw.nats.url()).await.unwrap();
    let sub = c.subscribe(format!("sy.health.{target}")).await.unwrap();
    assert!(switchyard_publish::sync_with_server(&c).await);
    (c, sub)
}

/// The next health event, within `limit`.
async fn next_event(sub: &mut async_nats::Subscriber, limit: Duration) -> HealthEvent {
    let msg = tokio::time::timeout(limit, sub.next())
        .await
        .expect("no health event in time")
        .unwrap();
    serde_json::from_slice(&msg.payload).unwrap()
}

/// A started second worker replica, sharing the gateway's NATS, mock and live config.
async fn second_worker(gw: &Gateway, id: &str) -> CancellationToken {
    let stop = CancellationToken::new();
    spawn_worker(gw, gw.config.clone(), id, stop.clone()).await;
    stop
}

async fn bucket(gw: &Gateway, target: &str, kind: LimitKind) -> Option<BucketState> {
    let c = async_nats::connect(gw.nats.url()).await.unwrap();
    let kv = async_nats::jetstream::new(c)
        .get_key_value(switchyard_schemas::subjects::LIMITS_BUCKET)
        .await
        .unwrap();
    let bytes = kv.get(bucket_key(target, kind)).await.unwrap()?;
    Some(serde_json::from_slice(&bytes).unwrap())
}

/// Sends one chat request for `target` (an `openai` target) straight to the workers over NATS and
/// returns the frames of the answer.
async fn worker_frames(gw: &Gateway, target: &str) -> Vec<Frame> {
    let c = async_nats::connect(gw.nats.url()).await.unwrap();
    let inbox = c.new_inbox();
    let mut sub = c.subscribe(inbox.clone()).await.unwrap();
    let req = serde_json::json!({"id": uuid::Uuid::now_v7(), "model": "demo/x",
        "target": {"id": target, "provider": "openai", "upstream_model": "mock"},
        "messages": [{"role": "user", "content": "hi"}], "stream": false,
        "deadline_ms": switchyard_schemas::now_ms() + 10_000});
    c.publish_with_reply(
        "sy.req.chat.openai",
        inbox,
        serde_json::to_vec(&req).unwrap().into(),
    )
    .await
    .unwrap();
    let mut frames = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("no frame in time")
            .unwrap();
        let frame: Frame = serde_json::from_slice(&msg.payload).unwrap();
        let last = frame.body.is_terminal();
        frames.push(frame);
        if last {
            return frames;
        }
    }
}

struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: serde_json::Value,
    elapsed: Duration,
}

async fn send(http: &reqwest::Client, base: &str, body: &serde_json::Value) -> Answer {
    let started = Instant::now();
    let resp = http
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.json().await.unwrap_or(serde_json::Value::Null);
    Answer {
        status,
        headers,
        body,
        elapsed: started.elapsed(),
    }
}

/// [`send`] on a client of its own.
async fn send_one(base: &str, body: &serde_json::Value) -> Answer {
    send(&reqwest::Client::new(), base, body).await
}

/// Fires `n` copies of `body` at once.
async fn burst(base: &str, body: &serde_json::Value, n: usize) -> Vec<Answer> {
    let http = reqwest::Client::new();
    futures::future::join_all((0..n).map(|_| send(&http, base, body))).await
}

fn header<'a>(a: &'a Answer, name: &str) -> &'a str {
    a.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Two worker replicas share one RPM bucket through NATS KV: of 20 requests fired at once at a
/// target with `rpm: 10`, exactly 10 reach the upstream; without a fallback the rest get 429 with
/// `Retry-After`, with one they are served by the next target. A changed `rpm` applies at once.
#[tokio::test]
async fn rpm_limit_holds_across_two_worker_replicas() {
    let gw = start(config(
        serde_json::json!([
            {"id": "lim", "provider": "openai", "base_url": "builtin:mock/x/target=lim",
             "upstream_model": "mock", "limits": {"rpm": 10}},
            {"id": "lim2", "provider": "openai", "base_url": "builtin:mock/x/target=lim2",
             "upstream_model": "mock", "limits": {"rpm": 10}},
            {"id": "spare", "provider": "openai", "base_url": "builtin:mock/x/target=spare",
             "upstream_model": "mock"}
        ]),
        serde_json::json!([
            {"id": "demo/lim", "targets": ["lim"]},
            {"id": "demo/lim-fb", "targets": ["lim2", "spare"]}
        ]),
    ))
    .await;
    let _b = second_worker(&gw, "worker-b").await.drop_guard();

    let answers = burst(&gw.base, &chat("demo/lim", "hi", false), 20).await;
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let limited: Vec<_> = answers.iter().filter(|a| a.status == 429).collect();
    assert_eq!(
        (ok, limited.len()),
        (10, 10),
        "statuses: {:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    assert_eq!(calls(&gw, "target=lim"), 10);
    for a in &limited {
        assert_eq!(a.body["error"]["code"], "rate_limit_exceeded", "{}", a.body);
        // 10 per minute: the next token is up to 6 s away.
        let s: u64 = header(a, "retry-after").parse().unwrap();
        assert!((1..=6).contains(&s), "retry-after {s}");
    }
    let mut workers: Vec<&str> = answers
        .iter()
        .filter(|a| a.status == 200)
        .map(|a| header(a, "x-switchyard-worker"))
        .collect();
    workers.sort_unstable();
    workers.dedup();
    eprintln!("admitted by workers {workers:?}");
    let state = bucket(&gw, "lim", LimitKind::Rpm).await.unwrap();
    assert!(state.tokens < 1.0, "{state:?}");

    // With a fallback target nobody sees the limit.
    let answers = burst(&gw.base, &chat("demo/lim-fb", "hi", false), 20).await;
    assert!(answers.iter().all(|a| a.status == 200));
    let on = |t: &str| {
        answers
            .iter()
            .filter(|a| header(a, "x-switchyard-target") == t)
            .count()
    };
    assert_eq!((on("lim2"), on("spare")), (10, 10));
    assert_eq!(calls(&gw, "target=lim2"), 10);
    assert!(
        answers
            .iter()
            .filter(|a| header(a, "x-switchyard-target") == "spare")
            .all(|a| header(a, "x-switchyard-fallbacks") == "1")
    );

    // Limits follow the live config: a raised rpm admits the next request at once.
    let mut c = (*gw.config.get()).clone();
    c.targets
        .iter_mut()
        .find(|t| t.id == "lim")
        .unwrap()
        .limits
        .rpm = Some(600_000);
    assert!(gw.config.set(1, c));
    let a = send_one(&gw.base, &chat("demo/lim", "hi", false)).await;
    assert_eq!(a.status, 200, "{}", a.body);
}

/// `max_concurrency` rejects at once, without queueing and without an upstream call: a 429
/// `rate_limit_exceeded` with `Retry-After: 1` (the target is saturated by its own limit).
#[tokio::test]
async fn concurrency_limit_rejects_at_once() {
    let gw = start(config(
        serde_json::json!([
            {"id": "conc", "provider": "openai", "base_url": "builtin:mock/x/ttft_ms=800",
             "upstream_model": "mock", "limits": {"max_concurrency": 2}}
        ]),
        serde_json::json!([{"id": "demo/conc", "targets": ["conc"]}]),
    ))
    .await;
    let answers = burst(&gw.base, &chat("demo/conc", "hi", false), 5).await;
    let ok: Vec<_> = answers.iter().filter(|a| a.status == 200).collect();
    let rejected: Vec<_> = answers.iter().filter(|a| a.status == 429).collect();
    assert_eq!((ok.len(), rejected.len()), (2, 3));
    for a in &rejected {
        assert_eq!(a.body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(header(a, "retry-after"), "1");
        assert!(a.elapsed < Duration::from_millis(500), "{:?}", a.elapsed);
    }
    assert!(ok.iter().all(|a| a.elapsed >= Duration::from_millis(800)));
    assert_eq!(calls(&gw, "ttft_ms=800"), 2);
    // The slots are free again.
    let answers = burst(&gw.base, &chat("demo/conc", "hi", false), 2).await;
    assert!(answers.iter().all(|a| a.status == 200));
}

/// The breaker opens after `min_calls` failures, answers at once while open (no upstream call),
/// half-opens after `open_ms` and closes on a successful probe; each change is published.
#[tokio::test]
async fn breaker_opens_after_failures_and_recovers() {
    let gw = start(config(
        serde_json::json!([
            {"id": "flaky", "provider": "openai", "base_url": "builtin:mock/x/status=500",
             "upstream_model": "mock", "retry": {"max_attempts": 1},
             "breaker": {"min_calls": 4, "failure_rate": 0.5, "window_ms": 60000,
                         "open_ms": 400, "half_open_probes": 1}}
        ]),
        serde_json::json!([{"id": "demo/flaky", "targets": ["flaky"]}]),
    ))
    .await;
    let (_c, mut events) = health(&gw, "flaky").await;
    let http = reqwest::Client::new();
    let body = chat("demo/flaky", "hi", false);
    for _ in 0..4 {
        assert_eq!(send(&http, &gw.base, &body).await.status, 502);
    }
    assert_eq!(calls(&gw, "status=500"), 4);
    let e = next_event(&mut events, Duration::from_secs(5)).await;
    assert_eq!(
        (e.target.as_str(), e.state),
        ("flaky", HealthState::Unhealthy)
    );
    assert_eq!(
        (e.worker.as_str(), e.retry_after_ms),
        ("worker-a", Some(400))
    );
    assert!(e.reason.starts_with("breaker_open: 4/4"), "{}", e.reason);
    // Open: the worker answers at once — one retryable `no_capacity` error frame with the time
    // until half-open, no `start`, no upstream call.
    let frames = worker_frames(&gw, "flaky").await;
    let [
        Frame {
            seq: 0,
            body:
                FrameBody::Error {
                    error,
                    content_sent: false,
                },
        },
    ] = &frames[..]
    else {
        panic!("{frames:?}")
    };
    assert_eq!(error.class, ErrorClass::NoCapacity);
    assert!(error.retryable);
    assert!(matches!(error.retry_after_ms, Some(1..=400)), "{error:?}");
    // Through ingress (which also reads the health events and may skip the target itself).
    let a = send(&http, &gw.base, &body).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.body["error"]["code"], "no_capacity");
    assert_eq!(calls(&gw, "status=500"), 4);

    // The upstream recovers (live config), the timer half-opens the breaker, a probe closes it.
    let mut c = (*gw.config.get()).clone();
    c.targets
        .iter_mut()
        .find(|t| t.id == "flaky")
        .unwrap()
        .base_url = "builtin:mock/x/target=flaky".into();
    assert!(gw.config.set(1, c));
    let e = next_event(&mut events, Duration::from_secs(5)).await;
    assert_eq!(e.state, HealthState::Degraded);
    assert_eq!(e.reason, "breaker_half_open");
    let a = send(&http, &gw.base, &body).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let e = next_event(&mut events, Duration::from_secs(5)).await;
    assert_eq!(
        (e.state, e.reason.as_str()),
        (HealthState::Healthy, "breaker_closed")
    );
    assert_eq!(calls(&gw, "target=flaky"), 1);
    assert_eq!(send(&http, &gw.base, &body).await.status, 200);
}

/// The acceptance case: the primary answers 503, the fallback is healthy. 1,000 requests at
/// concurrency 16 all succeed through the fallback; once the primary's breaker is open it only
/// receives the half-open probes.
#[tokio::test]
async fn primary_503_fallback_healthy_1000_requests() {
    const MIN_CALLS: usize = 5;
    const CONCURRENCY: usize = 16;
    let gw = start(config(
        serde_json::json!([
            {"id": "primary", "provider": "openai", "base_url": "builtin:mock/x/status=503",
             "upstream_model": "mock", "retry": {"max_attempts": 1},
             "breaker": {"min_calls": MIN_CALLS, "failure_rate": 0.5, "window_ms": 60000,
                         "open_ms": 250, "half_open_probes": 1}},
            {"id": "backup", "provider": "openai", "base_url": "builtin:mock/x/target=backup",
             "upstream_model": "mock"}
        ]),
        serde_json::json!([{"id": "demo/ha", "targets": ["primary", "backup"]}]),
    ))
    .await;
    let (c, mut events) = health(&gw, "primary").await;
    let http = reqwest::Client::new();
    let body = chat("demo/ha", "hi", false);
    let started = Instant::now();
    let answers: Vec<Answer> = futures::stream::iter(0..1000)
        .map(|_| send(&http, &gw.base, &body))
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let took = started.elapsed();
    let failed: Vec<_> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} failed, e.g. {}",
        failed.len(),
        failed[0].body
    );
    assert!(
        answers
            .iter()
            .all(|a| header(a, "x-switchyard-target") == "backup")
    );
    assert_eq!(calls(&gw, "target=backup"), 1000);

    // Count the breaker's transitions: every half-open admits one probe.
    // Drain until quiet: without traffic the breaker rests open or half-open.
    assert!(switchyard_publish::sync_with_server(&c).await);
    let mut opened = 0;
    let mut half_opened = 0;
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(600), events.next()).await
    {
        let e: HealthEvent = serde_json::from_slice(&msg.payload).unwrap();
        match e.state {
            HealthState::Unhealthy => opened += 1,
            HealthState::Degraded => half_opened += 1,
            HealthState::Healthy => panic!("the primary never recovers: {e:?}"),
        }
    }
    let primary = calls(&gw, "status=503");
    eprintln!(
        "1000 requests in {took:?}: primary got {primary} calls; breaker opened {opened}x, \
         half-opened {half_opened}x"
    );
    assert!(opened >= 1);
    // Before it opened: `min_calls` failures, plus at most the other calls already in flight
    // (concurrency − 1) when the last of them came back; after: one probe per half-open.
    assert!(primary >= MIN_CALLS);
    assert!(
        primary <= MIN_CALLS + (CONCURRENCY - 1) + half_opened,
        "primary got {primary} calls"
    );
    // Every reopening was caused by a failed probe.
    assert!(opened <= 1 + half_opened);
}

/// FC-19: both targets answer 400 invalid_request_error with `retry.max_attempts: 3`: one upstream
/// call, the client gets that 400, and nothing trips (with `min_calls: 1` any counted failure
/// would open the breaker and stop the next request).
#[tokio::test]
async fn fc19_request_errors_are_not_retried_and_trip_nothing() {
    let spec = "status=400,error_message=messages.0.content%3A+invalid";
    let target = |id: &str| {
        serde_json::json!({"id": id, "provider": "openai",
            "base_url": format!("builtin:mock/x/{spec}"), "upstream_model": "mock",
            "retry": {"max_attempts": 3, "base_ms": 1},
            "breaker": {"min_calls": 1, "failure_rate": 0.1, "cooldown_after_429s": 1}})
    };
    let gw = start(config(
        serde_json::json!([target("fc19a"), target("fc19b")]),
        serde_json::json!([{"id": "demo/fc19", "targets": ["fc19a", "fc19b"]}]),
    ))
    .await;
    let (c, mut events) = health(&gw, ">").await;
    let http = reqwest::Client::new();
    for n in 1..=4 {
        let a = send(&http, &gw.base, &chat("demo/fc19", "hi", false)).await;
        assert_eq!(a.status, 400);
        assert_eq!(a.body["error"]["type"], "invalid_request_error");
        let msg = error_message(&a.body);
        assert!(msg.contains("messages.0.content: invalid"), "{msg}");
        assert_eq!(calls(&gw, spec), n, "exactly one upstream call per request");
    }
    let paths: Vec<String> = gw.mock.requests().into_iter().map(|r| r.path).collect();
    assert!(
        paths
            .iter()
            .all(|p| p.starts_with(&format!("/x/{spec}/v1/"))),
        "{paths:?}"
    );
    assert!(switchyard_publish::sync_with_server(&c).await);
    let none = tokio::time::timeout(Duration::from_millis(100), events.next()).await;
    assert!(none.is_err(), "unexpected health event {none:?}");
}

/// A `Retry-After` longer than the retry budget ends the retries at once: the client gets 429 with
/// that `Retry-After` after one upstream call. One within the budget is waited out, never less.
#[tokio::test]
async fn retry_after_beyond_the_budget_is_a_429_at_once() {
    let gw = start(config(
        serde_json::json!([
            {"id": "slow", "provider": "openai", "base_url": "builtin:mock/x/status=429,retry_after=3",
             "upstream_model": "mock", "retry": {"max_attempts": 3, "budget_ms": 1000}},
            {"id": "soon", "provider": "openai",
             "base_url": "builtin:mock/x/status=429,retry_after=1,fail_times=1",
             "upstream_model": "mock", "retry": {"max_attempts": 3, "budget_ms": 2000}}
        ]),
        serde_json::json!([
            {"id": "demo/slow", "targets": ["slow"]},
            {"id": "demo/soon", "targets": ["soon"]}
        ]),
    ))
    .await;
    let http = reqwest::Client::new();
    let a = send(&http, &gw.base, &chat("demo/slow", "hi", false)).await;
    assert_eq!(a.status, 429, "{}", a.body);
    assert_eq!(header(&a, "retry-after"), "3");
    assert_eq!(a.body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(calls(&gw, "status=429,retry_after=3"), 1);
    assert!(a.elapsed < Duration::from_millis(900), "{:?}", a.elapsed);

    let a = send(&http, &gw.base, &chat("demo/soon", "hi", false)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.elapsed >= Duration::from_millis(1000), "{:?}", a.elapsed);
    assert_eq!(calls(&gw, "status=429,retry_after=1,fail_times=1"), 2);
}

/// A 429 then a success: retried once inside the worker with the same idempotency key; the client
/// gets 200 and the ledger one `upstream` row for the attempt (usage summed over both calls).
#[tokio::test]
async fn a_429_then_success_is_retried_once() {
    let mut opts = config(
        serde_json::json!([
            {"id": "once", "provider": "openai", "base_url": "builtin:mock/x/status=429,fail_times=1",
             "upstream_model": "mock", "retry": {"max_attempts": 3, "base_ms": 10, "max_ms": 50}}
        ]),
        serde_json::json!([{"id": "demo/once", "targets": ["once"]}]),
    );
    opts.billing = true;
    let gw = start(opts).await;
    let a = send_one(&gw.base, &chat("demo/once", "one two three", false)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(header(&a, "x-switchyard-fallbacks"), "0");
    let reqs = gw.mock.requests();
    assert_eq!(reqs.len(), 2);
    let key = reqs[0].header("idempotency-key").unwrap();
    assert_eq!(reqs[1].header("idempotency-key"), Some(key));
    assert_eq!(key, header(&a, "x-request-id"));
    let id: uuid::Uuid = key.parse().unwrap();
    let rows = ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await;
    let up: Vec<_> = rows
        .iter()
        .filter(|r| r.kind == switchyard_schemas::UsageKind::Upstream)
        .collect();
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].attempt, 0);
    assert_eq!(up[0].status, switchyard_schemas::usage::UsageStatus::Ok);
    assert_eq!(
        (up[0].usage.prompt_tokens, up[0].usage.completion_tokens),
        (3, 13)
    );
}

/// TPM is charged with the tokenizer estimate before the call and corrected with the actual usage
/// after it (the bucket's stored value shows both).
#[tokio::test]
async fn tpm_estimate_is_corrected_after_usage() {
    let gw = start(config(
        serde_json::json!([
            {"id": "tok", "provider": "openai",
             "base_url": "builtin:mock/x/ttft_ms=500,prompt_tokens=20,completion_tokens=30",
             "upstream_model": "mock", "limits": {"tpm": 600}}
        ]),
        serde_json::json!([{"id": "demo/tok", "targets": ["tok"]}]),
    ))
    .await;
    let prompt = "How many tokens is this prompt, roughly?";
    let mut body = chat("demo/tok", prompt, false);
    body["max_tokens"] = serde_json::json!(400);
    // o200k tokens of the text + 3 per message + 3 + max_tokens.
    let estimate = count_tokens(prompt) + 3 * 2 + 400;
    let base = gw.base.clone();
    let call = tokio::spawn(async move { send(&reqwest::Client::new(), &base, &body).await });
    // During the call: the full bucket minus the estimate.
    let during = eventually(Duration::from_secs(5), || async {
        bucket(&gw, "tok", LimitKind::Tpm).await
    })
    .await;
    assert_eq!(
        during.tokens,
        600.0 - estimate as f64,
        "estimate {estimate}"
    );
    let a = call.await.unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["usage"]["total_tokens"], 50);
    // After: corrected to the actual 50 tokens (plus what refilled meanwhile, 10 per second).
    let after = eventually(Duration::from_secs(5), || async {
        let s = bucket(&gw, "tok", LimitKind::Tpm).await?;
        (s.tokens > during.tokens).then_some(s)
    })
    .await;
    let refilled = after.tokens - (600.0 - 50.0);
    assert!((0.0..20.0).contains(&refilled), "{after:?}");
}

/// Per-target timeouts; keep-alive comments are not data: they reset neither the first-byte nor
/// the idle timeout.
#[tokio::test]
async fn keepalive_comments_do_not_reset_target_timeouts() {
    let gw = start(config(
        serde_json::json!([
            {"id": "idle", "provider": "openai",
             "base_url": "builtin:mock/x/chunks=3,chunk_delay_ms=3000,keepalive_ms=50",
             "upstream_model": "mock", "retry": {"max_attempts": 1}, "timeouts": {"idle_ms": 300}},
            {"id": "ttft", "provider": "openai",
             "base_url": "builtin:mock/x/ttft_ms=3000,keepalive_ms=50",
             "upstream_model": "mock", "retry": {"max_attempts": 1},
             "timeouts": {"first_byte_ms": 300}}
        ]),
        serde_json::json!([
            {"id": "demo/idle", "targets": ["idle"]},
            {"id": "demo/ttft", "targets": ["ttft"]}
        ]),
    ))
    .await;
    let started = Instant::now();
    let r = post_sse(&gw.base, &chat("demo/idle", "hi", true)).await;
    assert_eq!(r.status, 200);
    assert!(!r.content().is_empty());
    let last = r.json_events().last().cloned().unwrap();
    assert_eq!(last["error"]["code"], "timeout", "{last}");
    assert!(
        started.elapsed() < Duration::from_millis(2000),
        "{:?}",
        started.elapsed()
    );

    let a = send_one(&gw.base, &chat("demo/ttft", "hi", false)).await;
    assert_eq!(a.status, 504, "{}", a.body);
    assert!(a.elapsed < Duration::from_millis(2000), "{:?}", a.elapsed);
    // The mock did send keep-alives while silent.
    let raw = post_text(format!("{}/x/ttft_ms=300,keepalive_ms=50/v1/chat/completions", gw.mock.base_url()), &serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert!(raw.starts_with(": keepalive\n\n"), "{raw}");
    assert!(raw.matches(": keepalive").count() >= 3, "{raw}");
    assert!(raw.ends_with("data: [DONE]\n\n"));
}

/// Measures what the shared limits cost per request: the KV round trips of one RPM take, and the
/// end-to-end latency with RPM + TPM limits against none. Run with
/// `cargo test -p switchyard --test it resilience:: -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "measurement, prints numbers"]
async fn kv_limit_overhead() {
    let gw = start(config(
        serde_json::json!([
            {"id": "free", "provider": "openai", "base_url": "builtin:mock/x/target=free",
             "upstream_model": "mock"},
            {"id": "capped", "provider": "openai", "base_url": "builtin:mock/x/target=capped",
             "upstream_model": "mock", "limits": {"rpm": 100000000, "tpm": 1000000000}}
        ]),
        serde_json::json!([
            {"id": "demo/free", "targets": ["free"]},
            {"id": "demo/capped", "targets": ["capped"]}
        ]),
    ))
    .await;
    let c = async_nats::connect(gw.nats.url()).await.unwrap();
    let limiter =
        switchyard_workers::limits::Limiter::connect(&async_nats::jetstream::new(c)).await;
    assert!(limiter.is_shared());
    let target = gw.config.get().target("capped").unwrap().clone();
    let pct = |h: &hdrhistogram::Histogram<u64>| {
        format!(
            "p50 {:.3} ms, p99 {:.3} ms, mean {:.3} ms",
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.mean() / 1000.0
        )
    };
    let mut take = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    for _ in 0..2000 {
        let t = Instant::now();
        limiter.take_request(&target, false).await.unwrap();
        take.record(t.elapsed().as_micros() as u64).unwrap();
    }
    eprintln!(
        "RPM take (one KV compare-and-set, uncontended): {}",
        pct(&take)
    );
    // Two limiters on one key: every take conflicts with the other's writes.
    let c2 = async_nats::connect(gw.nats.url()).await.unwrap();
    let other = switchyard_workers::limits::Limiter::connect(&async_nats::jetstream::new(c2)).await;
    let mut contended = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    for _ in 0..1000 {
        let t = Instant::now();
        let (a, b) = tokio::join!(
            limiter.take_request(&target, false),
            other.take_request(&target, false)
        );
        a.unwrap();
        b.unwrap();
        contended.record(t.elapsed().as_micros() as u64).unwrap();
    }
    eprintln!("two replicas taking at once (pair): {}", pct(&contended));
    let http = reqwest::Client::new();
    for model in ["demo/free", "demo/capped", "demo/free", "demo/capped"] {
        let body = chat(model, "Say hello please", false);
        let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        for _ in 0..500 {
            let a = send(&http, &gw.base, &body).await;
            assert_eq!(a.status, 200);
            h.record(a.elapsed.as_micros() as u64).unwrap();
        }
        eprintln!("{model:12} end to end: {}", pct(&h));
    }
}
