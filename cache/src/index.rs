//! The in-memory index of one cache instance: entries by exact key, and per scope the vectors of
//! their queries for the semantic layer.
//!
//! Search is exact (a dot product with every vector of the request's scope): a scope holds the
//! entries that share a route, system prompt, history, tools and parameters, which is a few
//! hundred at most in practice, and `switchyard cache bench` measures the scan (README). An HNSW
//! index would only pay off for scopes of tens of thousands of entries.
//!
//! Capacity: at most `max_entries`; past it the least recently used tenth of a percent (at least
//! one) is evicted, and the evicted keys are returned so the service deletes them from the KV
//! bucket too.

use crate::embed::cosine;
use crate::verify::{self, Features};
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use switchyard_schemas::cache::CachedAnswer;

/// One stored answer as persisted in the KV bucket (JSON).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Exact key (hex SHA-256 of the canonical request); also the KV key.
    pub key: String,
    /// Scope hash (see [`crate::canon`]).
    pub scope: String,
    /// Route (configured model id).
    pub route: String,
    /// Target that produced the answer.
    pub target: Option<String>,
    /// Upstream model that produced the answer.
    pub upstream_model: Option<String>,
    /// The final user text, when the entry takes part in the semantic layer.
    pub query: Option<String>,
    /// Embedding of `query`: little-endian f32, base64.
    pub vector: Option<String>,
    /// Embedding model id of `vector`.
    pub embed_model: Option<String>,
    /// The answer.
    pub answer: CachedAnswer,
    /// When it was stored, ms since the Unix epoch.
    pub stored_ms: u64,
    /// When it expires, ms since the Unix epoch.
    pub expires_ms: u64,
}

/// Encodes a vector for [`Entry::vector`].
pub fn encode_vector(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes [`Entry::vector`].
pub fn decode_vector(s: &str) -> Option<Vec<f32>> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    if bytes.len() % 4 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// An indexed entry.
#[derive(Debug)]
pub struct Slot {
    /// The entry.
    pub entry: Entry,
    /// Decoded vector.
    pub vector: Option<Vec<f32>>,
    /// Verification features of the query.
    pub features: Option<Features>,
    /// Logical time of the last use (store or hit), for LRU eviction.
    last_used: AtomicU64,
}

/// A semantic candidate.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The slot.
    pub slot: Arc<Slot>,
    /// Cosine similarity to the query.
    pub similarity: f32,
}

/// Entries by key and by scope.
#[derive(Debug, Default)]
pub struct Index {
    by_key: HashMap<String, Arc<Slot>>,
    /// Entries by scope, by key: removing one is O(1) (a replaced entry — the cache service's
    /// copy of one an ingress replica stored itself — must not scan the scope).
    by_scope: HashMap<String, HashMap<String, Arc<Slot>>>,
    clock: AtomicU64,
    max_entries: usize,
}

impl Index {
    /// An empty index holding at most `max_entries`.
    pub fn new(max_entries: usize) -> Self {
        Self {
            max_entries: max_entries.max(1),
            ..Self::default()
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// The live entry with this exact key (marks it used).
    pub fn exact(&self, key: &str, now_ms: u64) -> Option<Arc<Slot>> {
        let slot = self.by_key.get(key)?;
        if slot.entry.expires_ms <= now_ms {
            return None;
        }
        slot.last_used.store(self.tick(), Ordering::Relaxed);
        Some(slot.clone())
    }

    /// The entry with this key, live or expired (does not mark it used).
    pub fn get(&self, key: &str) -> Option<&Arc<Slot>> {
        self.by_key.get(key)
    }

    /// Whether an entry with this key and store time is already held.
    pub fn has(&self, key: &str, stored_ms: u64) -> bool {
        self.by_key
            .get(key)
            .is_some_and(|s| s.entry.stored_ms == stored_ms)
    }

    /// Live entries of `scope` embedded by `embed_model` with similarity ≥ `threshold`, best
    /// first.
    pub fn candidates(
        &self,
        scope: &str,
        embed_model: &str,
        query: &[f32],
        threshold: f32,
        now_ms: u64,
    ) -> Vec<Candidate> {
        let Some(slots) = self.by_scope.get(scope) else {
            return Vec::new();
        };
        let mut out: Vec<Candidate> = slots
            .values()
            .filter(|s| s.entry.expires_ms > now_ms)
            .filter(|s| s.entry.embed_model.as_deref() == Some(embed_model))
            .filter_map(|s| {
                let v = s.vector.as_deref()?;
                let similarity = cosine(query, v);
                (similarity >= threshold).then(|| Candidate {
                    slot: s.clone(),
                    similarity,
                })
            })
            .collect();
        out.sort_by(|a, b| b.similarity.total_cmp(&a.similarity));
        out
    }

    /// Whether `scope` holds any entry with a vector (if not, a query need not be embedded).
    pub fn has_vectors(&self, scope: &str) -> bool {
        self.by_scope
            .get(scope)
            .is_some_and(|v| v.values().any(|s| s.vector.is_some()))
    }

    /// Marks a slot used (a semantic hit).
    pub fn touch(&self, slot: &Slot) {
        slot.last_used.store(self.tick(), Ordering::Relaxed);
    }

    /// Adds or replaces `entry`; returns the keys evicted to stay within capacity.
    pub fn insert(&mut self, entry: Entry) -> Vec<String> {
        let vector = entry.vector.as_deref().and_then(decode_vector);
        // Only a slot with a vector can be a semantic candidate, the one use of its features.
        let features = vector
            .as_ref()
            .and(entry.query.as_deref())
            .map(verify::features);
        let slot = Arc::new(Slot {
            entry,
            vector,
            features,
            last_used: AtomicU64::new(self.tick()),
        });
        self.remove(&slot.entry.key);
        self.by_scope
            .entry(slot.entry.scope.clone())
            .or_default()
            .insert(slot.entry.key.clone(), slot.clone());
        self.by_key.insert(slot.entry.key.clone(), slot);
        if self.by_key.len() <= self.max_entries {
            return Vec::new();
        }
        let excess = self.by_key.len() - self.max_entries;
        let batch = (self.max_entries / 1000).max(1).max(excess);
        let mut ages: Vec<(u64, String)> = self
            .by_key
            .values()
            .map(|s| (s.last_used.load(Ordering::Relaxed), s.entry.key.clone()))
            .collect();
        let batch = batch.min(ages.len());
        ages.select_nth_unstable_by_key(batch - 1, |(t, _)| *t);
        let evicted: Vec<String> = ages.into_iter().take(batch).map(|(_, k)| k).collect();
        for k in &evicted {
            self.remove(k);
        }
        evicted
    }

    /// Removes the entry with this key; returns whether it was there.
    pub fn remove(&mut self, key: &str) -> bool {
        let Some(slot) = self.by_key.remove(key) else {
            return false;
        };
        if let Some(v) = self.by_scope.get_mut(&slot.entry.scope) {
            v.remove(key);
            if v.is_empty() {
                self.by_scope.remove(&slot.entry.scope);
            }
        }
        true
    }

    /// Keys of the entries `pred` selects.
    pub fn select(&self, pred: impl Fn(&Entry) -> bool) -> Vec<String> {
        self.by_key
            .values()
            .filter(|s| pred(&s.entry))
            .map(|s| s.entry.key.clone())
            .collect()
    }

    /// Keys of entries expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> Vec<String> {
        self.select(|e| e.expires_ms <= now_ms)
    }

    /// Entries per scope: (scopes, largest scope).
    pub fn scope_stats(&self) -> (usize, usize) {
        (
            self.by_scope.len(),
            self.by_scope.values().map(HashMap::len).max().unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use switchyard_schemas::FinishReason;

    pub(crate) fn entry(key: &str, scope: &str, v: &[f32]) -> Entry {
        Entry {
            key: key.into(),
            scope: scope.into(),
            route: "r".into(),
            target: None,
            upstream_model: Some("m".into()),
            query: Some(key.into()),
            vector: Some(encode_vector(v)),
            embed_model: Some("e".into()),
            answer: CachedAnswer {
                chunks: vec!["x".into()],
                tool_calls: vec![],
                finish_reason: FinishReason::Stop,
                usage: Default::default(),
            },
            stored_ms: 1,
            expires_ms: u64::MAX,
        }
    }

    #[test]
    fn vectors_round_trip() {
        let v = vec![0.5f32, -0.25, 1.0];
        assert_eq!(decode_vector(&encode_vector(&v)).unwrap(), v);
    }

    #[test]
    fn scoped_search_best_first_and_threshold() {
        let mut ix = Index::new(10);
        ix.insert(entry("a", "s1", &[1.0, 0.0]));
        ix.insert(entry("b", "s1", &[0.6, 0.8]));
        ix.insert(entry("c", "s2", &[1.0, 0.0]));
        let c = ix.candidates("s1", "e", &[1.0, 0.0], 0.5, 0);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].slot.entry.key, "a");
        assert!(ix.candidates("s1", "e", &[1.0, 0.0], 0.7, 0).len() == 1);
        assert!(
            ix.candidates("s1", "other-model", &[1.0, 0.0], 0.5, 0)
                .is_empty()
        );
        assert!(ix.candidates("s3", "e", &[1.0, 0.0], 0.5, 0).is_empty());
    }

    #[test]
    fn expiry_and_lru_eviction() {
        let mut ix = Index::new(2);
        let mut e = entry("old", "s", &[1.0]);
        e.expires_ms = 10;
        ix.insert(e);
        assert!(ix.exact("old", 5).is_some());
        assert!(ix.exact("old", 10).is_none());
        assert_eq!(ix.expired(10), vec!["old".to_owned()]);
        ix.insert(entry("b", "s", &[1.0]));
        // `old` is used again, so `b` is the least recently used when `c` arrives.
        ix.exact("old", 5);
        let evicted = ix.insert(entry("c", "s", &[1.0]));
        assert_eq!(evicted, vec!["b".to_owned()]);
        assert_eq!(ix.len(), 2);
        assert!(ix.remove("c"));
        assert!(!ix.remove("c"));
        assert_eq!(ix.scope_stats(), (1, 1));
    }
}
