//! The exact-layer cache replica in ingress (`cache_replica: {enabled: true}`): exact-only routes
//! are answered without a `<prefix>.cache.lookup` round trip, a store made through one ingress is
//! a hit on another through the KV watch, and a purge reaches every replica.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use futures::StreamExt;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use switchyard_schemas::cache::PurgeRequest;
use switchyard_schemas::subjects::Subjects;

pub(crate) const EXACT: &str = "demo/exact";
pub(crate) const SEMANTIC: &str = "demo/mock";
pub(crate) const WAIT: Duration = Duration::from_secs(10);

async fn replica_gateway() -> Gateway {
    replica_gateway_with(false).await
}

/// With `auth`: `up`'s NATS identities and permissions (ingress watches `KV_SY_CACHE`).
async fn replica_gateway_with(auth: bool) -> Gateway {
    start(Options {
        config: test_config(json!({
            "models": [
                {"id": EXACT, "targets": ["mock"], "cache": {"semantic": false}},
                {"id": SEMANTIC, "targets": ["mock"]}
            ],
            "cache_replica": {"enabled": true}
        })),
        cache: true,
        auth,
        ..Options::default()
    })
    .await
}

pub(crate) fn user(model: &str, text: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": text}]})
}

/// Sends `body` and returns (x-switchyard-cache, content).
pub(crate) async fn ask(base: &str, body: &Value, headers: &[(&str, &str)]) -> (String, String) {
    let resp = send_with(base, headers, body).await;
    assert_eq!(resp.status(), 200);
    let outcome = resp
        .headers()
        .get("x-switchyard-cache")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let v: Value = resp.json().await.unwrap();
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    (outcome, content)
}

/// Counts the messages on `<prefix>.cache.lookup` with a plain subscription (outside the cache
/// service's queue group, so it sees every lookup without taking any).
pub(crate) struct LookupCounter {
    nats: async_nats::Client,
    seen: Arc<AtomicUsize>,
    sentinels: Arc<AtomicUsize>,
}

const SENTINEL: &[u8] = b"sentinel";

impl LookupCounter {
    pub(crate) async fn start(gw: &Gateway) -> Self {
        let nats = gw.nats_as(switchyard::nats_auth::Identity::Admin).await;
        let mut sub = nats
            .subscribe(Subjects::default().cache_lookup())
            .await
            .unwrap();
        nats.flush().await.unwrap();
        let (seen, sentinels) = (Arc::default(), Arc::default());
        let (s, t): (Arc<AtomicUsize>, Arc<AtomicUsize>) =
            (Arc::clone(&seen), Arc::clone(&sentinels));
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                if msg.payload.as_ref() == SENTINEL {
                    t.fetch_add(1, Ordering::SeqCst);
                } else {
                    s.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        Self {
            nats,
            seen,
            sentinels,
        }
    }

    /// The lookups seen so far: publishes a sentinel (no reply subject, which the cache service
    /// ignores) and waits for it, so every lookup the server took before it has been counted.
    pub(crate) async fn count(&self) -> usize {
        let want = self.sentinels.load(Ordering::SeqCst) + 1;
        self.nats
            .publish(Subjects::default().cache_lookup(), SENTINEL.into())
            .await
            .unwrap();
        self.nats.flush().await.unwrap();
        let sentinels = self.sentinels.clone();
        eventually(WAIT, || {
            let sentinels = sentinels.clone();
            async move { (sentinels.load(Ordering::SeqCst) >= want).then_some(()) }
        })
        .await;
        self.seen.load(Ordering::SeqCst)
    }
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// An exact-only route never asks the cache service (miss, then a hit with the same content, same
/// headers and metrics as the service's answers); a semantic route asks it on an exact miss only.
#[tokio::test]
async fn exact_only_routes_are_answered_by_the_replica() {
    exact_only_routes(false).await;
}

/// The same under NATS auth: ingress's identity may watch (and create) the cache bucket.
#[tokio::test]
async fn the_replica_works_under_nats_auth() {
    exact_only_routes(true).await;
}

async fn exact_only_routes(auth: bool) {
    let gw = replica_gateway_with(auth).await;
    let lookups = LookupCounter::start(&gw).await;
    let q = user(EXACT, "What is the boiling point of water?");
    let (first, content) = ask(&gw.base, &q, &[]).await;
    assert_eq!(first, "miss");
    assert!(!content.is_empty());
    let upstream = gw.mock.request_count();
    let (second, replayed) = ask(&gw.base, &q, &[]).await;
    assert_eq!(second, "hit");
    assert_eq!(replayed, content);
    assert_eq!(
        gw.mock.request_count(),
        upstream,
        "a hit makes no upstream call"
    );
    assert_eq!(
        lookups.count().await,
        0,
        "no lookup reached the cache service"
    );
    let text = metrics_text(&gw.base).await;
    assert_eq!(
        metric(&text, "switchyard_cache_outcomes_total{outcome=\"hit\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "switchyard_cache_outcomes_total{outcome=\"miss\"}"),
        1.0
    );
    // A semantic route: the exact miss goes to the service (its semantic layer), the exact hit
    // of the identical second request does not.
    let s = user(SEMANTIC, "What is the boiling point of mercury?");
    assert_eq!(ask(&gw.base, &s, &[]).await.0, "miss");
    assert_eq!(lookups.count().await, 1);
    assert_eq!(ask(&gw.base, &s, &[]).await.0, "hit");
    assert_eq!(lookups.count().await, 1);
}

/// A store made through one ingress becomes a hit on another (the KV watch), and a purge removes
/// it from both replicas.
#[tokio::test]
async fn stores_and_purges_reach_every_replica() {
    let gw = replica_gateway().await;
    let (other, _state) = spawn_ingress(&gw).await;
    let lookups = LookupCounter::start(&gw).await;
    let q = user(EXACT, "How many legs does a spider have?");
    // `no-store` on the second ingress: a miss there stores nothing, so a hit can only come from
    // the first ingress's store.
    let no_store = [("cache-control", "no-store")];
    assert_eq!(ask(&other, &q, &no_store).await.0, "miss");
    let (first, content) = ask(&gw.base, &q, &[]).await;
    assert_eq!(first, "miss");
    let replayed = eventually(WAIT, || {
        let (other, q) = (other.clone(), q.clone());
        async move {
            let (outcome, content) = ask(&other, &q, &no_store).await;
            (outcome == "hit").then_some(content)
        }
    })
    .await;
    assert_eq!(replayed, content);
    assert_eq!(ask(&gw.base, &q, &no_store).await.0, "hit");
    assert_eq!(lookups.count().await, 0);
    // Purge the route, as `switchyard cache purge --route` does.
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
}
