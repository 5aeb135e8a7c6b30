//! What ingress keeps of the cache, in its two modes: the exact-layer replica
//! (`cache_replica: {enabled: true}`) answers exact-only routes without a `<prefix>.cache.lookup`
//! round trip, hits included; the key set (the default) answers only an exact-only route's miss
//! so, and asks the service for a held key. In both, a store made through one ingress reaches
//! another through the bucket, and a purge reaches every ingress.
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

/// What ingress keeps of the cache.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Replica,
    KeySet,
}

/// An exact-only and a semantic route with the cache on; with `auth`, `up`'s NATS identities
/// and permissions (ingress watches `KV_SY_CACHE`).
pub(crate) async fn cache_gateway(mode: Mode, auth: bool) -> Gateway {
    let mut config = json!({
        "models": [
            {"id": EXACT, "targets": ["mock"], "cache": {"semantic": false}},
            {"id": SEMANTIC, "targets": ["mock"]}
        ]
    });
    if mode == Mode::Replica {
        config["cache_replica"] = json!({"enabled": true});
    }
    start(Options {
        config: test_config(config),
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

/// The replica answers an exact-only route itself, miss and hit (same content, headers and
/// metrics as the service's answers); a semantic route asks it on an exact miss only.
#[tokio::test]
async fn exact_only_routes_are_answered_by_the_replica() {
    exact_only_routes(Mode::Replica, false).await;
}

/// The same under NATS auth: ingress's identity may watch (and create) the cache bucket.
#[tokio::test]
async fn the_replica_works_under_nats_auth() {
    exact_only_routes(Mode::Replica, true).await;
}

/// The key set answers an exact-only route's miss without a lookup; the hit that follows is asked
/// for once and served by the service; a semantic route asks on every lookup.
#[tokio::test]
async fn an_absent_key_is_a_miss_without_a_lookup() {
    exact_only_routes(Mode::KeySet, false).await;
}

/// The same under NATS auth: ingress may create its headers-only consumer.
#[tokio::test]
async fn the_key_set_works_under_nats_auth() {
    exact_only_routes(Mode::KeySet, true).await;
}

async fn exact_only_routes(mode: Mode, auth: bool) {
    // Lookups the service gets for an exact hit: none from the replica, one with the key set.
    let per_hit = usize::from(mode == Mode::KeySet);
    let gw = cache_gateway(mode, auth).await;
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
    assert_eq!(
        gw.mock.request_count(),
        upstream,
        "a hit makes no upstream call"
    );
    assert_eq!(lookups.count().await, per_hit);
    let text = metrics_text(&gw.base).await;
    assert_eq!(
        metric(&text, "switchyard_cache_outcomes_total{outcome=\"hit\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "switchyard_cache_outcomes_total{outcome=\"miss\"}"),
        1.0
    );
    // A semantic route: the exact miss goes to the service (its semantic layer); the replica
    // answers the exact hit of the identical second request itself, the key set asks.
    let s = user(SEMANTIC, "What is the boiling point of mercury?");
    assert_eq!(ask(&gw.base, &s, &[]).await.0, "miss");
    assert_eq!(lookups.count().await, per_hit + 1);
    assert_eq!(ask(&gw.base, &s, &[]).await.0, "hit");
    assert_eq!(lookups.count().await, 2 * per_hit + 1);
}

/// Replica: a store made through one ingress becomes a hit on another (the KV watch), and a purge
/// removes it from both replicas.
#[tokio::test]
async fn stores_and_purges_reach_every_replica() {
    stores_and_purges(Mode::Replica).await;
}

/// Key set: another ingress learns a store from the bucket (and asks for it), and a purge takes
/// the key out of both sets, after which their misses ask nobody.
#[tokio::test]
async fn stores_and_purges_reach_every_key_set() {
    stores_and_purges(Mode::KeySet).await;
}

async fn stores_and_purges(mode: Mode) {
    let gw = cache_gateway(mode, false).await;
    let (other, _state) = spawn_ingress(&gw).await;
    let lookups = LookupCounter::start(&gw).await;
    let q = user(EXACT, "How many legs does a spider have?");
    // `no-store` on the second ingress: a miss there stores nothing, so a hit can only come from
    // the first ingress's store.
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
    assert_eq!(ask(&gw.base, &q, &no_store).await.0, "hit");
    if mode == Mode::Replica {
        assert_eq!(lookups.count().await, 0);
    }
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
    // Both have dropped the key: misses make no lookup.
    let before = lookups.count().await;
    for base in [&gw.base, &other] {
        assert_eq!(ask(base, &q, &no_store).await.0, "miss");
    }
    assert_eq!(lookups.count().await, before);
}
