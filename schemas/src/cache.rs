//! The cache service's vocabulary: per-route settings ([`RouteCache`], the `cache:` block of a
//! model in the config) and the request/reply payloads ingress and `switchyard cache` exchange on
//! `<prefix>.cache.lookup`, `<prefix>.cache.store` and `<prefix>.cache.purge` (queue group `cache`).
//!
//! Ingress sends the request as the client sent it (model, conversation, tools, parameters); the
//! cache service owns canonicalisation, hashing, embedding and verification, so the rules live in
//! one place (the `switchyard-cache` crate).

use crate::request::{Message, SamplingParams, Tool};
use crate::subjects::Subjects;
use crate::{FinishReason, Usage};
use serde::{Deserialize, Serialize};

/// Response header: `hit`, `semantic-hit`, `miss` or `bypass`.
pub const HEADER_CACHE: &str = "x-switchyard-cache";
/// Response header on semantic hits: the cosine similarity of the matched entry, e.g. `0.9412`.
pub const HEADER_SIMILARITY: &str = "x-switchyard-cache-similarity";
/// Request header: time to live of the answer this request stores, seconds (overrides the
/// route's `cache.ttl_s`; capped by the service's maximum).
pub const HEADER_TTL: &str = "x-switchyard-cache-ttl";

/// Default similarity threshold of `open` routes (open questions): chosen on the shipped labelled
/// pairs for precision ≥ 0.99 with the verification rules on (see the README's Cache section).
pub const DEFAULT_THRESHOLD_OPEN: f32 = 0.86;
/// Default similarity threshold of `faq` routes (a closed set of recurring questions).
pub const DEFAULT_THRESHOLD_FAQ: f32 = 0.80;
/// Default time to live of a stored answer, seconds (one day).
pub const DEFAULT_TTL_S: u64 = 86_400;

/// `<prefix>.cache.purge`: admin purge, request/reply ([`PurgeRequest`] → [`PurgeReply`]).
pub fn purge_subject(subjects: &Subjects) -> String {
    format!("{}.cache.purge", subjects.prefix())
}

/// What kind of traffic a route carries; it picks the default similarity threshold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheProfile {
    /// Open questions: a stricter default threshold ([`DEFAULT_THRESHOLD_OPEN`]).
    #[default]
    Open,
    /// A help desk / FAQ route: recurring questions, looser default ([`DEFAULT_THRESHOLD_FAQ`]).
    Faq,
}

/// The `cache:` block of a model (route) in the config. Everything is optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouteCache {
    /// Off: requests on this route neither look up nor store (`x-switchyard-cache: bypass`).
    pub enabled: bool,
    /// Off: only the exact layer is used on this route.
    pub semantic: bool,
    /// Picks the default threshold.
    pub profile: CacheProfile,
    /// Cosine similarity a semantic candidate needs (overrides the profile's default), 0–1.
    pub threshold: Option<f32>,
    /// Time to live of stored answers, seconds (default [`DEFAULT_TTL_S`]).
    pub ttl_s: Option<u64>,
}

impl Default for RouteCache {
    fn default() -> Self {
        Self {
            enabled: true,
            semantic: true,
            profile: CacheProfile::Open,
            threshold: None,
            ttl_s: None,
        }
    }
}

impl RouteCache {
    /// The effective similarity threshold.
    pub fn threshold(&self) -> f32 {
        self.threshold.unwrap_or(match self.profile {
            CacheProfile::Open => DEFAULT_THRESHOLD_OPEN,
            CacheProfile::Faq => DEFAULT_THRESHOLD_FAQ,
        })
    }
}

/// The `cache_replica:` block of the config (read at ingress start): each ingress keeps its own
/// copy of the cache's exact layer, fed by the KV bucket's watch like a cache instance, and answers
/// lookups of exact-only routes (`semantic: false`) and exact hits of any route without asking
/// the cache service. Off by default; the key set ([`CacheReplica::key_set`]) is on instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheReplica {
    /// On: ingress keeps the replica and answers from it.
    pub enabled: bool,
    /// Entries the replica holds (least recently used evicted beyond), like the cache service's
    /// `--max-entries`; memory grows with it as in a cache instance (answers, no vectors).
    /// Default 100,000.
    pub max_entries: usize,
    /// When the replica is off: ingress keeps only the set of stored exact keys (8 bytes each,
    /// fed by a headers-only consumer on the bucket) and answers an exact-only route's miss
    /// without asking the cache service (`switchyard_cache::key_set`). Default on.
    pub key_set: bool,
}

impl Default for CacheReplica {
    fn default() -> Self {
        Self {
            enabled: false,
            max_entries: 100_000,
            key_set: true,
        }
    }
}

/// The part of a chat request that decides its answer: the cache key material.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheKey {
    /// The configured model (route) id requests are routed by.
    pub route: String,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// OpenAI-shaped `tool_choice`.
    pub tool_choice: Option<serde_json::Value>,
    /// Sampling and output-shaping parameters.
    #[serde(default)]
    pub params: SamplingParams,
    /// The caller's tenant when API keys are on: answers are never shared across tenants.
    pub tenant: Option<String>,
}

/// `<prefix>.cache.lookup` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LookupRequest {
    /// What decides the answer.
    pub key: CacheKey,
    /// Whether the semantic layer may answer (the route's `cache.semantic`).
    #[serde(default = "yes")]
    pub semantic: bool,
    /// The route's similarity threshold.
    pub threshold: f32,
}

fn yes() -> bool {
    true
}

/// How a lookup was answered (the values of [`HEADER_CACHE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheOutcome {
    /// Same canonical request.
    Hit,
    /// A close enough request that passed verification.
    SemanticHit,
    /// Nothing usable.
    Miss,
    /// The cache was not asked (opt-out, `no-cache`, n > 1) or did not answer in time.
    Bypass,
}

impl CacheOutcome {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::SemanticHit => "semantic-hit",
            Self::Miss => "miss",
            Self::Bypass => "bypass",
        }
    }
}

/// `<prefix>.cache.lookup` reply.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LookupReply {
    /// Hit, semantic hit, miss or bypass.
    pub outcome: CacheOutcome,
    /// Cosine similarity of a semantic hit.
    pub similarity: Option<f32>,
    /// The stored answer on a hit.
    pub answer: Option<CachedAnswer>,
    /// Entry key of the hit (hex SHA-256 of the canonical request it was stored for).
    pub entry: Option<String>,
    /// Why a miss or bypass, for logs (e.g. `semantic: negation differs`).
    pub reason: Option<String>,
}

impl LookupReply {
    /// A reply without an answer.
    pub fn empty(outcome: CacheOutcome, reason: impl Into<String>) -> Self {
        Self {
            outcome,
            similarity: None,
            answer: None,
            entry: None,
            reason: Some(reason.into()),
        }
    }
}

/// One tool call of a stored answer (and of an answer being put together from
/// [`FrameBody::ToolCall`](crate::FrameBody::ToolCall) pieces: [`CachedToolCall::accumulate`]).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedToolCall {
    /// Call id.
    pub id: String,
    /// Function name.
    pub name: String,
    /// JSON-encoded arguments.
    pub arguments: String,
}

impl CachedToolCall {
    /// Adds one tool-call piece (the fields of a [`FrameBody::ToolCall`](crate::FrameBody::ToolCall))
    /// to `calls`, an answer's calls by index: grows `calls` with empty calls up to `index`,
    /// sets the call's id and name where the piece carries them (a later piece replaces an
    /// earlier one) and appends `arguments`. Returns the call.
    pub fn accumulate<'a>(
        calls: &'a mut Vec<Self>,
        index: u32,
        id: Option<String>,
        name: Option<String>,
        arguments: &str,
    ) -> &'a mut Self {
        let i = index as usize;
        if calls.len() <= i {
            calls.resize(i + 1, Self::default());
        }
        let call = &mut calls[i];
        if let Some(id) = id {
            call.id = id;
        }
        if let Some(name) = name {
            call.name = name;
        }
        call.arguments.push_str(arguments);
        call
    }
}

/// A complete answer as the upstream produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedAnswer {
    /// Text deltas in the order they arrived, so a replay is chunked like the original stream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
    /// Tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<CachedToolCall>,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// The original upstream usage (charged per the route's cache pricing; kept for savings).
    pub usage: Usage,
}

impl CachedAnswer {
    /// All text.
    pub fn text(&self) -> String {
        self.chunks.concat()
    }
}

/// `<prefix>.cache.store` message (fire-and-forget): one `StoreRequest` object, or a JSON array
/// of them (an ingress sends the stores of a few ms as one message; see
/// [`StoreRequest::decode_batch`]).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreRequest {
    /// What decides the answer.
    pub key: CacheKey,
    /// The answer.
    pub answer: CachedAnswer,
    /// Target that produced it.
    pub target: Option<String>,
    /// Upstream model that produced it (what `purge --model` matches).
    pub upstream_model: Option<String>,
    /// Time to live, seconds.
    pub ttl_s: u64,
    /// Whether the route looks answers up by meaning (`cache.semantic`): only then does the
    /// cache service embed the query for its semantic index. An exact-only route's entries are
    /// found by key alone (their scope names the route, so no other route's semantic lookup can
    /// match them), and an embedding per store would be wasted work ahead of the lookups queued
    /// behind it. Absent (older ingresses): true.
    #[serde(default = "yes")]
    pub semantic: bool,
}

impl StoreRequest {
    /// A store message's requests, in order: an array, or one object (older ingresses).
    /// Errors: the payload is neither.
    pub fn decode_batch(payload: &[u8]) -> serde_json::Result<Vec<Self>> {
        match payload.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'[') => serde_json::from_slice(payload),
            _ => serde_json::from_slice(payload).map(|one| vec![one]),
        }
    }
}

/// `<prefix>.cache.purge` request: entries matching every given filter are deleted (from the KV
/// bucket, hence from every instance's index). `all` must be set to purge without filters.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeRequest {
    /// Purge everything.
    #[serde(default)]
    pub all: bool,
    /// Only entries of this route (configured model id).
    pub route: Option<String>,
    /// Only entries produced by this upstream model.
    pub model: Option<String>,
    /// Only entries whose key starts with this (hex) prefix.
    pub key_prefix: Option<String>,
}

impl PurgeRequest {
    /// Whether the request names at least one filter or `all`.
    pub fn is_valid(&self) -> bool {
        self.all || self.route.is_some() || self.model.is_some() || self.key_prefix.is_some()
    }
}

/// `<prefix>.cache.purge` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeReply {
    /// Entries deleted.
    pub deleted: u64,
    /// Error text when the purge failed (or was refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_store_message_is_one_request_or_an_array_of_them() {
        let one = serde_json::json!({
            "key": {"route": "r", "messages": [{"role": "user", "content": "hi"}]},
            "answer": {"chunks": ["a"], "finish_reason": "stop", "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
            "ttl_s": 60,
        });
        let single = serde_json::to_vec(&one).unwrap();
        let parsed = StoreRequest::decode_batch(&single).unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].answer.chunks, ["a"]);
        let mut two = one.clone();
        two["answer"]["chunks"] = serde_json::json!(["b"]);
        let array = serde_json::to_vec(&serde_json::json!([one, two])).unwrap();
        let parsed = StoreRequest::decode_batch(&array).unwrap();
        let chunks: Vec<_> = parsed.iter().map(|r| r.answer.chunks.concat()).collect();
        assert_eq!(chunks, ["a", "b"]);
        assert!(StoreRequest::decode_batch(b" [").is_err());
        assert!(StoreRequest::decode_batch(b"{}").is_err());
    }

    #[test]
    fn route_cache_defaults_and_thresholds() {
        let r: RouteCache = serde_json::from_value(serde_json::json!({})).unwrap();
        assert!(r.enabled && r.semantic);
        assert_eq!(r.threshold(), DEFAULT_THRESHOLD_OPEN);
        let r: RouteCache = serde_json::from_value(serde_json::json!({"profile": "faq"})).unwrap();
        assert_eq!(r.threshold(), DEFAULT_THRESHOLD_FAQ);
        let r: RouteCache =
            serde_json::from_value(serde_json::json!({"threshold": 0.9, "ttl_s": 60})).unwrap();
        assert_eq!((r.threshold(), r.ttl_s), (0.9, Some(60)));
        assert!(serde_json::from_value::<RouteCache>(serde_json::json!({"treshold": 1})).is_err());
        const { assert!(DEFAULT_THRESHOLD_FAQ < DEFAULT_THRESHOLD_OPEN) };
    }

    #[test]
    fn outcome_wire_names() {
        for o in [
            CacheOutcome::Hit,
            CacheOutcome::SemanticHit,
            CacheOutcome::Miss,
            CacheOutcome::Bypass,
        ] {
            assert_eq!(serde_json::to_value(o).unwrap(), o.as_str());
        }
    }
}
