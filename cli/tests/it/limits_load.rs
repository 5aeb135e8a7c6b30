//! Target limits at the concurrency users run: 1,000 concurrent requests through two worker
//! processes against a target with `rpm: 100`. The bucket refills continuously (100 per
//! 60,000 ms), so the admitted count is bounded from the elapsed time: exactly 100 plus at most
//! what refilled while the test ran.

use crate::common::*;
use serde_json::json;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

const REQUESTS: usize = 1_000;
const RPM: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_admits_exactly_capacity_of_1000_concurrent_through_two_workers() {
    let config = test_config(json!({
        "targets": [{"id": "hot", "provider": "openai", "base_url": "builtin:mock/x/target=hot",
                     "upstream_model": "mock", "limits": {"rpm": RPM}}],
        "models": [{"id": "test/hot", "targets": ["hot"]}],
        "timeouts": {"first_frame_ms": 30000, "worker_silence_ms": 30000, "heartbeat_ms": 1000, "total_ms": 120000}
    }));
    let gw = start_config(config).await;
    let stop = CancellationToken::new();
    spawn_worker(&gw, gw.config.clone(), "worker-b", stop.clone()).await;
    let _stop = stop.drop_guard();

    let started = Instant::now();
    let results = fan_out(REQUESTS, |client, _| {
        let base = gw.base.clone();
        async move {
            let resp = client
                .post(format!("{base}/v1/chat/completions"))
                .json(
                    &json!({"model": "test/hot", "messages": [{"role": "user", "content": "hi"}]}),
                )
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let worker = resp
                .headers()
                .get("x-switchyard-worker")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: serde_json::Value = resp.json().await.unwrap();
            (status, worker, body)
        }
    })
    .await;
    let ms = started.elapsed().as_millis();
    let bound = RPM + (ms as f64 * RPM as f64 / 60_000.0).ceil() as u64;

    let ok = results.iter().filter(|r| r.0 == 200).count() as u64;
    let limited: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    let other: Vec<_> = results
        .iter()
        .filter(|r| r.0 != 200 && r.0 != 429)
        .take(3)
        .collect();
    let mut workers: Vec<_> = results.iter().filter_map(|r| r.1.clone()).collect();
    workers.sort_unstable();
    workers.dedup();
    eprintln!(
        "{ok} × 200, {} × 429 in {ms} ms (bound [{RPM}, {bound}]); answered by {workers:?}",
        limited.len()
    );
    assert!(other.is_empty(), "{other:?}");
    assert!((RPM..=bound).contains(&ok), "{ok} admitted");
    assert_eq!(ok as usize + limited.len(), REQUESTS);
    for (_, _, body) in &limited {
        assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    }
    // Only admitted requests reached the upstream.
    let upstream = gw
        .mock
        .state()
        .count_matching(|r| r.path.starts_with("/x/target=hot/"));
    assert_eq!(upstream as u64, ok);
}
