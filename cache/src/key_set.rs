//! The exact keys the cache holds, for ingress: an exact-only route's lookup whose key no cache
//! instance holds is a miss at once, without the `<prefix>.cache.lookup` round trip (two NATS
//! messages each way, and the whole conversation serialised, sent and canonicalised again).
//!
//! Fed by a *headers-only* ordered consumer on the KV bucket's stream: JetStream delivers the
//! subject (`$KV.<bucket>.<exact key>`) and headers of every put, delete and purge, not the
//! answer (NATS server docs, consumer `headers_only`). Each key is kept as its first 64 bits
//! (8 bytes; 100,000 entries ≈ 2 MB), so a collision can only cost a lookup the service answers.
//!
//! Exactness: the set only decides "ask the service or not". A key it holds that the service no
//! longer does (expired, not yet swept) costs one lookup that misses. A key the service holds and
//! the set does not would lose a hit; that happens only for an entry too large for KV (held in
//! the memory of the instance that took the store) stored through another ingress, and for the
//! few milliseconds before the stream delivers another ingress's store. This ingress's own stores
//! enter the set at once ([`KeySet::insert`]). While the feed is down the set answers nothing
//! ([`KeySet::contains`] is `None`) and every lookup asks the service.

use crate::service::CacheError;
use futures::StreamExt;
use parking_lot::RwLock;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Longest the startup rebuild waits for the stream's current keys.
const REBUILD_DEADLINE: Duration = Duration::from_secs(60);

/// The set of exact cache keys held in the KV bucket (see the module docs).
#[derive(Debug, Default)]
pub struct KeySet {
    keys: RwLock<HashSet<u64>>,
    /// The feed is running (else nothing may be concluded from an absent key).
    live: AtomicBool,
}

/// The first 64 bits of a hex SHA-256 exact key; another string (never written by the cache
/// service) hashes with std's SipHash.
fn short(key: &str) -> u64 {
    key.get(..16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| {
            use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
            BuildHasherDefault::<DefaultHasher>::default().hash_one(key)
        })
}

impl KeySet {
    /// Whether some cache instance may hold `exact` (a hex exact key, [`crate::canon::exact_key`]):
    /// `Some(false)` only when it certainly does not; `None` while the feed is down.
    pub fn contains(&self, exact: &str) -> Option<bool> {
        self.live
            .load(Ordering::Acquire)
            .then(|| self.keys.read().contains(&short(exact)))
    }

    /// Adds a key this process just stored (read-your-writes before the stream delivers it).
    pub fn insert(&self, exact: &str) {
        self.keys.write().insert(short(exact));
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.keys.read().len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn apply(&self, key: &str, deleted: bool) {
        let k = short(key);
        if deleted {
            self.keys.write().remove(&k);
        } else {
            self.keys.write().insert(k);
        }
    }
}

/// Whether a delivered KV message removes its key: a `KV-Operation: DEL | PURGE` header, or a
/// server marker (`Nats-Marker-Reason`, NATS ADR-43), as async-nats reads KV entries.
fn is_removal(headers: Option<&async_nats::HeaderMap>) -> bool {
    let Some(h) = headers else { return false };
    h.get("KV-Operation")
        .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
        || h.get("Nats-Marker-Reason").is_some()
}

/// Opens (or creates) the cache bucket `bucket`, loads its current keys, then keeps the set in
/// step (a task on `tasks`) until `shutdown` is cancelled. Errors when the bucket cannot be
/// opened or the consumer created; the caller then asks the service for every lookup.
pub async fn start(
    nats: async_nats::Client,
    bucket: &str,
    max_ttl_s: u64,
    shutdown: CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<Arc<KeySet>, CacheError> {
    use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, push::OrderedConfig};
    let kv_err = |e: &dyn std::fmt::Display| CacheError::Kv(e.to_string());
    let js = async_nats::jetstream::new(nats.clone());
    let kv = crate::service::bucket(&js, bucket, max_ttl_s).await?;
    let pending = kv.status().await.map_err(|e| kv_err(&e))?.values();
    let consumer = kv
        .stream
        .create_consumer(OrderedConfig {
            deliver_subject: nats.new_inbox(),
            description: Some("switchyard ingress cache key set".into()),
            filter_subject: format!("{}>", kv.prefix),
            headers_only: true,
            replay_policy: ReplayPolicy::Instant,
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| kv_err(&e))?;
    let mut messages = consumer.messages().await.map_err(|e| kv_err(&e))?;
    let set = Arc::new(KeySet::default());
    let prefix = kv.prefix.clone();
    let take = move |set: &KeySet, msg: &async_nats::jetstream::Message| -> u64 {
        if let Some(key) = msg.subject.strip_prefix(prefix.as_str()) {
            set.apply(key, is_removal(msg.headers.as_ref()));
        }
        msg.info().map(|i| i.pending).unwrap_or(0)
    };
    if pending > 0 {
        let deadline = tokio::time::Instant::now() + REBUILD_DEADLINE;
        loop {
            match tokio::time::timeout_at(deadline, messages.next()).await {
                Ok(Some(Ok(msg))) => {
                    if take(&set, &msg) == 0 {
                        break;
                    }
                }
                Ok(Some(Err(e))) => return Err(kv_err(&e)),
                Ok(None) => return Err(CacheError::Kv("key feed ended during rebuild".into())),
                Err(_) => return Err(CacheError::Kv("key set rebuild took over 60 s".into())),
            }
        }
    }
    set.live.store(true, Ordering::Release);
    let feed = set.clone();
    tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                next = messages.next() => match next {
                    Some(Ok(msg)) => { take(&feed, &msg); }
                    // The ordered consumer recreates itself from the next sequence after a gap.
                    Some(Err(e)) => tracing::warn!(error = %e, "cache key feed error"),
                    None => {
                        tracing::error!("cache key feed ended; every lookup asks the cache service");
                        feed.live.store(false, Ordering::Release);
                        return;
                    }
                }
            }
        }
    });
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_known_by_its_first_64_bits_and_nothing_is_concluded_while_down() {
        let set = KeySet::default();
        let k = "d3626ac30a87e6f7a6428233b3c68299976865fa5508e4267c5415c76af7a772";
        assert_eq!(set.contains(k), None);
        set.live.store(true, Ordering::Release);
        assert_eq!(set.contains(k), Some(false));
        set.insert(k);
        assert_eq!(set.contains(k), Some(true));
        assert_eq!(short(k), 0xd3626ac30a87e6f7);
        set.apply(k, true);
        assert_eq!(set.contains(k), Some(false));
        set.apply("not-hex", false);
        assert_eq!(set.contains("not-hex"), Some(true));
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn removals_are_deletes_purges_and_markers() {
        let mut h = async_nats::HeaderMap::new();
        assert!(!is_removal(None));
        assert!(!is_removal(Some(&h)));
        h.insert("KV-Operation", "PURGE");
        assert!(is_removal(Some(&h)));
        let mut m = async_nats::HeaderMap::new();
        m.insert("Nats-Marker-Reason", "MaxAge");
        assert!(is_removal(Some(&m)));
    }
}
