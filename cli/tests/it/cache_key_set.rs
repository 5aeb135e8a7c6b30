//! The cache key set in ingress (on by default, `cache_replica.key_set`): an exact-only route's
//! miss is answered without a `<prefix>.cache.lookup` round trip when no cache instance holds its
//! key; a held key is asked for and served by the cache service; stores through another ingress
//! and purges reach the set through the bucket's headers-only consumer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::cache_replica::{EXACT, LookupCounter, SEMANTIC, WAIT, ask, user};
use crate::common::*;
use serde_json::json;
use std::collections::HashMap;
use switchyard_schemas::cache::PurgeRequest;

async fn key_set_gateway(auth: bool) -> Gateway {
    start(Options {
        config: test_config(json!({
            "models": [
                {"id": EXACT, "targets": ["mock"], "cache": {"semantic": false}},
                {"id": SEMANTIC, "targets": ["mock"]}
            ]
        })),
        cache: true,
        auth,
        ..Options::default()
    })
    .await
}

/// A miss asks nobody; the hit that follows is asked for and served by the service; a semantic
/// route's exact miss still goes to the service (its semantic layer may answer).
#[tokio::test]
async fn an_absent_key_is_a_miss_without_a_lookup() {
    absent_keys(false).await;
}

/// The same under `up`'s NATS identities: ingress may create its headers-only consumer.
#[tokio::test]
async fn the_key_set_works_under_nats_auth() {
    absent_keys(true).await;
}

async fn absent_keys(auth: bool) {
    let gw = key_set_gateway(auth).await;
    let lookups = LookupCounter::start(&gw).await;
    let q = user(EXACT, "What is the boiling point of water?");
    let (first, content) = ask(&gw.base, &q, &[]).await;
    assert_eq!(first, "miss");
    assert!(!content.is_empty());
    assert_eq!(lookups.count().await, 0, "a miss asked the cache service");
    let upstream = gw.mock.request_count();
    let (second, replayed) = ask(&gw.base, &q, &[]).await;
    assert_eq!(second, "hit");
    assert_eq!(replayed, content);
    assert_eq!(gw.mock.request_count(), upstream);
    assert_eq!(lookups.count().await, 1, "the hit was asked for once");
    let s = user(SEMANTIC, "What is the boiling point of mercury?");
    assert_eq!(ask(&gw.base, &s, &[]).await.0, "miss");
    assert_eq!(lookups.count().await, 2);
}

/// Another ingress learns a store from the bucket (and asks for it), and a purge takes the key out
/// of both sets: after it, misses ask nobody again.
#[tokio::test]
async fn stores_and_purges_reach_another_ingress() {
    let gw = key_set_gateway(false).await;
    let (other, _state) = spawn_ingress(&gw).await;
    let lookups = LookupCounter::start(&gw).await;
    let q = user(EXACT, "How many legs does a spider have?");
    let no_store = [("cache-control", "no-store")];
    assert_eq!(ask(&other, &q, &no_store).await.0, "miss");
    let (first, content) = ask(&gw.base, &q, &[]).await;
    assert_eq!(first, "miss");
    assert_eq!(lookups.count().await, 0);
    let replayed = eventually(WAIT, || {
        let (other, q) = (other.clone(), q.clone());
        async move {
            let (outcome, content) = ask(&other, &q, &no_store).await;
            (outcome == "hit").then_some(content)
        }
    })
    .await;
    assert_eq!(replayed, content);
    let req = PurgeRequest {
        route: Some(EXACT.into()),
        ..Default::default()
    };
    let r = purge_cache(&gw, req).await;
    assert_eq!((r.deleted, r.error), (1, None));
    for base in [gw.base.clone(), other.clone()] {
        eventually(WAIT, || {
            let (base, q) = (base.clone(), q.clone());
            async move { (ask(&base, &q, &no_store).await.0 == "miss").then_some(()) }
        })
        .await;
    }
    // Both sets have dropped the key: misses make no lookup.
    let before = lookups.count().await;
    for base in [&gw.base, &other] {
        assert_eq!(ask(base, &q, &no_store).await.0, "miss");
    }
    assert_eq!(lookups.count().await, before);
}

/// 1,000 concurrent requests of 100 prompts through two ingress processes: every answer is a 200
/// with the prompt's own answer (a hit replays what a miss stored), and afterwards every prompt is
/// a hit on both ingresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_requests_through_two_ingresses() {
    const PROMPTS: usize = 100;
    let gw = key_set_gateway(false).await;
    let (other, _state) = spawn_ingress(&gw).await;
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
            eventually(WAIT, || {
                let (base, q) = (base.clone(), q.clone());
                async move { (ask(&base, &q, &[]).await.0 == "hit").then_some(()) }
            })
            .await;
        }
    }
}
