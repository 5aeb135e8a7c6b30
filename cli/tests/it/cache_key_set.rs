//! The cache key set in ingress (the default, `cache_replica.key_set`) at the concurrency users
//! run; its single-request behaviour is tested beside the replica's (`cache_replica.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::cache_replica::{EXACT, Mode, WAIT, ask, cache_gateway, user};
use crate::common::*;
use std::collections::HashMap;

/// 1,000 concurrent requests of 100 prompts through two ingress processes: every answer is a 200
/// with the prompt's own answer (a hit replays what a miss stored), and afterwards every prompt is
/// a hit on both ingresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_requests_through_two_ingresses() {
    const PROMPTS: usize = 100;
    let gw = cache_gateway(Mode::KeySet, false).await;
    let (other, state) = spawn_ingress(&gw).await;
    // The 50 ms lookup timeout turns a held key into a `bypass` when a loaded machine (CI runs
    // tests side by side) delays the cache service; this test is about the set, not the timeout.
    for app in [&gw.ingress, &state] {
        app.cache.set_timeout(std::time::Duration::from_secs(5));
    }
    let bases = [gw.base.clone(), other.clone()];
    let prompt = |i: usize| {
        let p = i % PROMPTS;
        format!("Question {p} about the weather\n#mock text=Answer+{p}")
    };
    let results = fan_out(1_000, |client, i| {
        let base = bases[i % 2].clone();
        let body = user(EXACT, &prompt(i));
        async move {
            let resp = chat_request(&client, &base, "sk-test", &body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let outcome = resp
                .headers()
                .get("x-switchyard-cache")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let v: serde_json::Value = resp.json().await.unwrap();
            let content = v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            (i, status, outcome, content)
        }
    })
    .await;
    let mut outcomes: HashMap<&str, usize> = HashMap::new();
    for (i, status, outcome, content) in &results {
        assert_eq!(*status, 200, "request {i}");
        // `bypass`: a held key whose lookup the busy cache service did not answer within the
        // timeout (50 ms), served by the upstream as designed.
        assert!(
            matches!(outcome.as_str(), "hit" | "miss" | "bypass"),
            "request {i}: {outcome}"
        );
        assert_eq!(
            content,
            &format!("Answer {}", i % PROMPTS),
            "request {i} ({outcome})"
        );
        *outcomes.entry(outcome.as_str()).or_default() += 1;
    }
    assert_eq!(outcomes.values().sum::<usize>(), 1_000, "{outcomes:?}");
    for base in &bases {
        for p in 0..PROMPTS {
            let q = user(EXACT, &prompt(p));
            let seen = std::sync::Mutex::new(Vec::new());
            let hit = tokio::time::timeout(WAIT, async {
                loop {
                    let outcome = ask(base, &q, &[]).await.0;
                    if outcome == "hit" {
                        return;
                    }
                    seen.lock().unwrap().push(outcome);
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
            .await;
            assert!(
                hit.is_ok(),
                "prompt {p} on {base}: {:?}",
                seen.lock().unwrap()
            );
        }
    }
}
