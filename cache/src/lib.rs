//! The cache service: exact and semantic answer cache over NATS request/reply.
//!
//! Every instance joins queue group [`QUEUE_GROUP`] on `<prefix>.cache.*`, so NATS spreads
//! lookups, stores and purges across instances. Entries live in the JetStream KV bucket
//! [`BUCKET`] (one key per entry, the exact key); every instance watches the bucket and keeps the
//! whole index in memory, so a store taken by one instance is served by all, and a restarted or
//! added instance rebuilds its index from KV before it answers. Ingress may keep an exact-layer
//! copy of the index the same way ([`replica`], `cache_replica` in the config) and answer
//! lookups locally, or keep only the set of stored keys ([`key_set`], on by default) and answer an
//! exact-only route's miss without asking.
//!
//! * [`canon`] — canonical request, exact key, scope and query text;
//! * [`embed`] — fastembed model loading (ONNX Runtime checked first) and the [`embed::Embed`] trait;
//! * [`onnx_rows`] — keeps the model's int8 embedding table int8 in memory (a graph rewrite);
//! * [`verify`] — the measurable rule set that rejects close but different questions;
//! * [`index`] — the in-memory index (exact search per scope, LRU capacity);
//! * [`key_set`] — the stored exact keys, fed by a headers-only consumer (ingress);
//! * [`service`] — lookup, store, purge and the KV persistence;
//! * [`store`] — the store path: index, embed off the message loop, write to KV;
//! * [`eval`] — precision / recall / hit rate over labelled pairs (`switchyard cache eval`);
//! * [`bench`] — lookup latency (`switchyard cache bench`).

pub mod bench;
pub mod canon;
pub mod embed;
pub mod eval;
pub mod index;
pub mod key_set;
pub mod onnx_rows;
pub mod service;
pub mod store;
pub mod verify;

pub use service::{CacheError, Service, ServiceOptions, replica, run, run_with_ready};

/// The queue group every cache instance joins, so NATS spreads requests across instances.
pub const QUEUE_GROUP: &str = "cache";
/// The JetStream KV bucket holding the entries.
pub const BUCKET: &str = "SY_CACHE";

/// Whether some route of `config` uses the semantic layer (its `cache` block, default on, has
/// `enabled` and `semantic`): only then is the embedding model worth loading.
pub fn semantic_wanted(config: &switchyard_schemas::config::GatewayConfig) -> bool {
    config.models.iter().any(|m| {
        let c = m.cache.clone().unwrap_or_default();
        c.enabled && c.semantic
    })
}
