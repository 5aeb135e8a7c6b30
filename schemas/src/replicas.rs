//! How many copies JetStream keeps of every stream, KV bucket and object store Switchyard
//! creates: the one home of that number. Each process sets it once at start-up from the config's
//! `nats.replicas` (default 1; `3` on a three-node JetStream cluster, see docs/deploy.md), and
//! every creation site wraps its config in [`stream`], [`kv`] or [`object_store`].
//!
//! The count applies when a stream or bucket is created; an existing one keeps its replicas
//! (change them with `nats stream edit --replicas N`). A non-clustered nats-server refuses more
//! than one replica (`replicas > 1 not supported in non-clustered mode`); nats-server allows at
//! most 5 (docs.nats.io, "JetStream Clustering": "Replicas = 1..5").

use std::sync::atomic::{AtomicUsize, Ordering};

/// The largest replica count nats-server accepts.
pub const MAX_REPLICAS: usize = 5;

static REPLICAS: AtomicUsize = AtomicUsize::new(1);

/// Sets this process's replica count, clamped to `1..=`[`MAX_REPLICAS`] (config validation
/// rejects values outside it before this is called).
pub fn set(n: usize) {
    REPLICAS.store(n.clamp(1, MAX_REPLICAS), Ordering::Relaxed);
}

/// This process's replica count (1 until [`set`]).
pub fn get() -> usize {
    REPLICAS.load(Ordering::Relaxed)
}

/// `c` with this process's replica count.
#[cfg(feature = "nats")]
pub fn stream(
    mut c: async_nats::jetstream::stream::Config,
) -> async_nats::jetstream::stream::Config {
    c.num_replicas = get();
    c
}

/// `c` with this process's replica count.
#[cfg(feature = "nats")]
pub fn kv(mut c: async_nats::jetstream::kv::Config) -> async_nats::jetstream::kv::Config {
    c.num_replicas = get();
    c
}

/// `c` with this process's replica count.
#[cfg(feature = "nats")]
pub fn object_store(
    mut c: async_nats::jetstream::object_store::Config,
) -> async_nats::jetstream::object_store::Config {
    c.num_replicas = get();
    c
}
