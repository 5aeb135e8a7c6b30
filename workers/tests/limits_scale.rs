//! RPM/TPM limits at scale: two worker processes' worth of limiters (separate NATS connections,
//! one shared `SY_LIMITS` bucket) and 1,000+ concurrent requests on one target. The buckets
//! refill continuously, so each bound is computed from the elapsed time: with capacity N per
//! minute, at most `elapsed_ms × N / 60 000` tokens came back during the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, reason = "tasks end with their test")]

use std::sync::Arc;
use std::time::Instant;
use switchyard_schemas::config::TargetConfig;
use switchyard_schemas::{ChatRequest, ErrorClass};
use switchyard_workers::limits::{Admission, LimitKind, Limiter};

/// The server, two limiters on their own connections, and those connections (their message
/// counters count KV round trips: every read or compare-and-set is one request message).
async fn limiters() -> (
    switchyard_natsd::NatsServer,
    [Arc<Limiter>; 2],
    Vec<async_nats::Client>,
) {
    let nats = switchyard_natsd::NatsServer::start_temp().unwrap();
    let (mut out, mut clients) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let c = async_nats::connect(nats.url()).await.unwrap();
        let l = Limiter::connect(&async_nats::jetstream::new(c.clone())).await;
        assert!(l.is_shared());
        out.push(Arc::new(l));
        clients.push(c);
    }
    let [a, b]: [Arc<Limiter>; 2] = out.try_into().unwrap();
    (nats, [a, b], clients)
}

/// Messages published by both connections so far (KV reads + writes, after set-up).
fn sent(clients: &[async_nats::Client]) -> u64 {
    clients
        .iter()
        .map(|c| {
            c.statistics()
                .out_messages
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum()
}

fn target(id: &str, limits: serde_json::Value) -> TargetConfig {
    serde_json::from_value(serde_json::json!({"id": id, "provider": "openai",
        "base_url": "builtin:mock", "upstream_model": "m", "limits": limits}))
    .unwrap()
}

/// "Hello world" with `max_tokens` 50: a TPM estimate of 2 + 6 + 50 = 58 tokens.
fn request() -> ChatRequest {
    let mut r: ChatRequest = serde_json::from_value(serde_json::json!({
        "id": uuid::Uuid::now_v7(), "model": "m",
        "target": {"id": "t", "provider": "openai", "upstream_model": "m"},
        "messages": [{"role": "user", "content": "Hello world"}],
        "stream": false, "deadline_ms": 0}))
    .unwrap();
    r.params.max_tokens = Some(50);
    r
}
const ESTIMATE: u64 = 58;

/// Tokens a bucket of `capacity` per minute can refill in `ms`.
fn refill(capacity: u64, ms: u128) -> f64 {
    ms as f64 * capacity as f64 / 60_000.0
}

/// `n` concurrent admissions, one task each (as a worker runs requests), alternating between
/// the two limiters: the admitted (with the index of their limiter), the number rejected
/// `rate_limited`, and any other error.
async fn admit_all(
    ls: &[Arc<Limiter>; 2],
    t: &TargetConfig,
    n: usize,
) -> (Vec<(usize, Admission)>, usize, Vec<String>) {
    let req = Arc::new(request());
    let t = Arc::new(t.clone());
    let calls = (0..n).map(|i| {
        let (l, req, t) = (ls[i % 2].clone(), req.clone(), t.clone());
        tokio::spawn(async move { (i % 2, l.admit(&t, &req).await) })
    });
    let mut admitted = Vec::new();
    let (mut limited, mut other) = (0, Vec::new());
    for joined in futures::future::join_all(calls).await {
        let (w, r) = joined.unwrap();
        match r {
            Ok(a) => admitted.push((w, a)),
            Err(e) if e.class == ErrorClass::RateLimited => limited += 1,
            Err(e) => other.push(e.message),
        }
    }
    (admitted, limited, other)
}

/// 2,000 concurrent requests through two limiters against `rpm: 250`: exactly 250 admitted
/// (plus what refilled while the test ran), the rest `rate_limited`, nothing failed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_is_exact_across_two_workers_at_2000_concurrent() {
    let (_nats, ls, clients) = limiters().await;
    let base = sent(&clients);
    const N: u64 = 250;
    let t = target("hot-rpm", serde_json::json!({"rpm": N}));
    let started = Instant::now();
    let (admitted, limited, other) = admit_all(&ls, &t, 2_000).await;
    let ms = started.elapsed().as_millis();
    let bound = N + refill(N, ms).ceil() as u64;
    eprintln!(
        "rpm: {} admitted ({} by worker 0), {limited} rate_limited in {ms} ms (bound [{N}, \
         {bound}]); {}",
        admitted.len(),
        admitted.iter().filter(|(w, _)| *w == 0).count(),
        per_request(&clients, base, 2_000)
    );
    assert!(other.is_empty(), "{other:?}");
    assert!(
        (N..=bound).contains(&(admitted.len() as u64)),
        "{} admitted",
        admitted.len()
    );
    assert_eq!(admitted.len() + limited, 2_000);
    // Each limiter alone would admit 250: the exact total shows the bucket is shared (which
    // limiter's batch got there first is up to scheduling).
}

/// Replicas contending: 400 tasks per limiter, each admitting 5 times in a row (4,000 requests,
/// 800 in flight), against `rpm: 3000`: many small batches from both sides on one key, so
/// compare-and-set conflicts are certain. Still exact, nothing failed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_is_exact_under_replica_contention() {
    let (_nats, ls, clients) = limiters().await;
    let base = sent(&clients);
    const N: u64 = 3_000;
    let t = Arc::new(target("contended", serde_json::json!({"rpm": N})));
    let req = Arc::new(request());
    let started = Instant::now();
    let tasks = (0..800).map(|i| {
        let (l, t, req) = (ls[i % 2].clone(), t.clone(), req.clone());
        tokio::spawn(async move {
            let (mut ok, mut limited, mut other) = (0u64, 0u64, Vec::new());
            for _ in 0..5 {
                match l.admit(&t, &req).await {
                    Ok(_) => ok += 1,
                    Err(e) if e.class == ErrorClass::RateLimited => limited += 1,
                    Err(e) => other.push(e.message),
                }
            }
            (i % 2, ok, limited, other)
        })
    });
    let (mut ok, mut limited, mut by_worker) = (0, 0, [0u64; 2]);
    for joined in futures::future::join_all(tasks).await {
        let (w, o, l, other) = joined.unwrap();
        assert!(other.is_empty(), "{other:?}");
        (ok, limited) = (ok + o, limited + l);
        by_worker[w] += o;
    }
    let ms = started.elapsed().as_millis();
    let bound = N + refill(N, ms).ceil() as u64;
    eprintln!(
        "contended rpm: {ok} admitted {by_worker:?}, {limited} rate_limited in {ms} ms (bound \
         [{N}, {bound}]); {}",
        per_request(&clients, base, 4_000)
    );
    assert_eq!(ok + limited, 4_000);
    assert!((N..=bound).contains(&ok), "{ok} admitted");
    assert!(by_worker.iter().all(|n| *n > 0), "{by_worker:?}");
}

/// TPM with settlement corrections, in three phases so every count is exact: 1,000 concurrent
/// admissions against 200 estimates' worth; settle every admitted request concurrently with
/// its actual usage (30 or 70 tokens, refund or extra charge); the bucket then holds exactly
/// capacity − Σ actual (plus refill); 1,000 more concurrent admissions get exactly that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpm_with_settlements_is_exact_across_two_workers() {
    let (_nats, ls, clients) = limiters().await;
    let base = sent(&clients);
    const T: u64 = 200 * ESTIMATE;
    let t = target("hot-tpm", serde_json::json!({"tpm": T}));
    let started = Instant::now();
    let (admitted, limited, other) = admit_all(&ls, &t, 1_000).await;
    let ms = started.elapsed().as_millis();
    assert!(other.is_empty(), "{other:?}");
    let bound = 200 + (refill(T, ms) / ESTIMATE as f64).floor() as usize;
    assert!(
        (200..=bound).contains(&admitted.len()),
        "{} admitted, bound [200, {bound}]",
        admitted.len()
    );
    assert_eq!(admitted.len() + limited, 1_000);
    assert!(admitted.iter().all(|(_, a)| a.tpm_estimate() == ESTIMATE));

    let actual = |i: usize| if i.is_multiple_of(2) { 30 } else { 70 };
    let spent: u64 = (0..admitted.len()).map(actual).sum();
    let settles = admitted
        .iter()
        .enumerate()
        .map(|(i, (w, a))| ls[*w].settle(a, actual(i)));
    futures::future::join_all(settles).await;
    let ms = started.elapsed().as_millis();
    let low = (T - spent) as f64;
    let high = low + refill(T, ms);
    let stored = ls[0]
        .bucket("hot-tpm", LimitKind::Tpm)
        .await
        .unwrap()
        .tokens;
    assert!(
        stored > low - 1e-6 && stored < high + 1e-6,
        "bucket {stored}, expected [{low}, {high}]"
    );
    drop(admitted);

    let (again, limited, other) = admit_all(&ls, &t, 1_000).await;
    let ms = started.elapsed().as_millis();
    assert!(other.is_empty(), "{other:?}");
    let (min, max) = (
        (low / ESTIMATE as f64).floor() as usize,
        ((low + refill(T, ms)) / ESTIMATE as f64).floor() as usize,
    );
    eprintln!(
        "tpm: bucket {stored} after settling (expected [{low}, {high}]); phase 3 {} admitted in \
         [{min}, {max}] after {ms} ms; {}",
        again.len(),
        per_request(&clients, base, 2_000 + 200)
    );
    assert!(
        (min..=max).contains(&again.len()),
        "{} admitted",
        again.len()
    );
    assert_eq!(again.len() + limited, 1_000);
}

/// Throughput of admissions on one hot target (limit never reached) through two limiters,
/// 1,000 in flight at a time. A measurement, not a check: `cargo test -p switchyard-workers
/// --test limits_scale throughput -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_on_one_hot_target() {
    let (_nats, ls, clients) = limiters().await;
    let t = target(
        "hot",
        serde_json::json!({"rpm": 1_000_000_000u64, "tpm": 1_000_000_000_000u64}),
    );
    // Warm up (tokenizer, bucket creation).
    admit_all(&ls, &t, 10).await;
    let base = sent(&clients);
    const ROUNDS: usize = 10;
    let started = Instant::now();
    for _ in 0..ROUNDS {
        let (admitted, _, other) = admit_all(&ls, &t, 1_000).await;
        assert!(other.is_empty(), "{other:?}");
        let settles = admitted.iter().map(|(w, a)| ls[*w].settle(a, 40));
        futures::future::join_all(settles).await;
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "throughput: {:.0} requests/s (admit RPM+TPM, settle TPM), {} requests in {secs:.2} s; {}",
        (ROUNDS * 1_000) as f64 / secs,
        ROUNDS * 1_000,
        per_request(&clients, base, ROUNDS * 1_000)
    );
}

/// KV round trips (messages sent) per operation since `base`.
fn per_request(clients: &[async_nats::Client], base: u64, ops: usize) -> String {
    let n = sent(clients) - base;
    format!(
        "{n} KV round trips, {:.3} per request",
        n as f64 / ops as f64
    )
}
