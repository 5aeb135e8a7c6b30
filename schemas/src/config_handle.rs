//! The live config of one process ([`ConfigHandle`]): a versioned [`GatewayConfig`] snapshot
//! swapped atomically on reload, and the watcher's [`LiveStatus`] that ingress fails closed on.
//! Re-exported from [`crate::config`], where the types it carries live.

use crate::config::GatewayConfig;
use std::collections::HashSet;

/// The live config of one process: a versioned snapshot swapped atomically on reload. Each
/// request takes one snapshot ([`ConfigHandle::get`]) and keeps it to the end, so a reload never
/// changes a request half-way.
#[derive(Debug, Clone)]
pub struct ConfigHandle {
    inner: std::sync::Arc<arc_swap::ArcSwap<Versioned>>,
    live: std::sync::Arc<LiveStatus>,
}

/// When the live-config watcher last confirmed that this process holds the latest revision of
/// the config bucket, and which keys changed in a revision it could not apply. Ingress fails
/// closed on both (docs/security.md, "Key changes across replicas").
#[derive(Debug)]
pub struct LiveStatus {
    watched: std::sync::atomic::AtomicBool,
    confirmed: tokio::sync::watch::Sender<Confirmation>,
    check: tokio::sync::Notify,
    unconfirmed: parking_lot::Mutex<HashSet<String>>,
}

/// One confirmation: the latest revision the bucket had, and when that was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confirmation {
    /// Latest revision of the config key (0 = none stored).
    pub revision: u64,
    /// When it was confirmed.
    pub at: std::time::Instant,
}

impl LiveStatus {
    fn new() -> Self {
        Self {
            watched: std::sync::atomic::AtomicBool::new(false),
            confirmed: tokio::sync::watch::Sender::new(Confirmation {
                revision: 0,
                at: std::time::Instant::now(),
            }),
            check: tokio::sync::Notify::new(),
            unconfirmed: parking_lot::Mutex::new(HashSet::new()),
        }
    }

    /// Called by the watcher when it starts: from now on staleness counts.
    pub fn mark_watched(&self) {
        self.confirm(0);
        self.watched
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a live-config watcher runs for this handle (no watcher: never stale).
    pub fn is_watched(&self) -> bool {
        self.watched.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records that `revision` is the bucket's latest, now.
    pub fn confirm(&self, revision: u64) {
        self.confirmed.send_replace(Confirmation {
            revision,
            at: std::time::Instant::now(),
        });
    }

    /// The last confirmation.
    pub fn confirmation(&self) -> Confirmation {
        *self.confirmed.borrow()
    }

    /// Whether the watcher runs and has not confirmed within `limit`.
    pub fn is_stale(&self, limit: std::time::Duration) -> bool {
        self.is_watched() && self.confirmation().at.elapsed() > limit
    }

    /// Asks the watcher to confirm now (coalesced: many asks, one check).
    pub fn request_check(&self) {
        self.check.notify_one();
    }

    /// Resolves when [`Self::request_check`] was called (the watcher's side).
    pub async fn check_requested(&self) {
        self.check.notified().await;
    }

    /// Waits up to `limit` for a confirmation made after `after`; whether one came.
    pub async fn wait_confirmed_after(
        &self,
        after: std::time::Instant,
        limit: std::time::Duration,
    ) -> bool {
        let mut rx = self.confirmed.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|c| c.at > after))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Replaces the set of key hashes (lower-case hex SHA-256) changed in a stored revision this
    /// process could not apply; ingress refuses them until one is applied.
    pub fn set_unconfirmed(&self, hashes: HashSet<String>) {
        *self.unconfirmed.lock() = hashes;
    }

    /// Whether `hash` is in [`Self::set_unconfirmed`]'s set.
    pub fn is_unconfirmed(&self, hash: &str) -> bool {
        let set = self.unconfirmed.lock();
        !set.is_empty() && set.contains(hash)
    }
}

/// A config with the version it was published under (0 = the start-up file) and the pricing
/// catalog its `pricing_file` named when it was installed.
#[derive(Debug)]
pub struct Versioned {
    /// Monotonic version (the NATS KV revision when distributed).
    pub version: u64,
    /// The config.
    pub config: std::sync::Arc<GatewayConfig>,
    /// `Catalog::load(config.pricing_file)` (the bundled catalog without one); `None` when the
    /// file did not load (costs are then unknown: budgets reserve $0, the ledger stores NULL).
    pub catalog: Option<std::sync::Arc<crate::pricing::Catalog>>,
}

impl Versioned {
    fn new(version: u64, config: GatewayConfig) -> Self {
        let catalog = crate::pricing::Catalog::load(config.pricing_file.as_deref())
            .ok()
            .map(std::sync::Arc::new);
        Self {
            version,
            config: std::sync::Arc::new(config),
            catalog,
        }
    }
}

impl ConfigHandle {
    /// A handle starting at `config`, version 0.
    pub fn new(config: GatewayConfig) -> Self {
        Self::new_at(0, config)
    }

    /// A handle starting at `config` as `version` (a live config read from KV at start-up).
    pub fn new_at(version: u64, config: GatewayConfig) -> Self {
        Self {
            inner: std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(Versioned::new(
                version, config,
            ))),
            live: std::sync::Arc::new(LiveStatus::new()),
        }
    }

    /// The watcher's confirmations (shared by every clone of this handle).
    pub fn live(&self) -> &LiveStatus {
        &self.live
    }

    /// The current snapshot.
    pub fn get(&self) -> std::sync::Arc<GatewayConfig> {
        self.inner.load().config.clone()
    }

    /// The pricing catalog of the current snapshot (a pushed `pricing_file` change applies to
    /// the next request's reservation and the next usage row); `None` if it did not load.
    pub fn catalog(&self) -> Option<std::sync::Arc<crate::pricing::Catalog>> {
        self.inner.load().catalog.clone()
    }

    /// The current version.
    pub fn version(&self) -> u64 {
        self.inner.load().version
    }

    /// Installs `config` as `version` if it is newer than the current one; returns whether it did.
    /// The caller validates first; the catalog of its `pricing_file` is (re)read here.
    pub fn set(&self, version: u64, config: GatewayConfig) -> bool {
        if version <= self.version() {
            return false;
        }
        let new = std::sync::Arc::new(Versioned::new(version, config));
        let prev = self.inner.rcu(|cur| {
            if version > cur.version {
                new.clone()
            } else {
                cur.clone()
            }
        });
        prev.version < version
    }
}
