//! Per-target limits: requests per minute and tokens per minute shared by every worker replica
//! through a JetStream KV bucket, and a per-process concurrency cap.
//!
//! # Token buckets (RPM, TPM)
//!
//! Bucket [`LIMITS_BUCKET`] holds one key per target and limit, `<target>.rpm` and `<target>.tpm`
//! (target ids are escaped to the KV key alphabet, see [`bucket_key`]), each the JSON
//! [`BucketState`] `{"tokens": f64, "updated_ms": u64}`. A bucket's capacity is the per-minute
//! value and it refills continuously at capacity / 60 000 ms, computed by whoever touches it next;
//! an absent key is a full bucket. Every change is a compare-and-set on the key's revision, so
//! replicas never lose an update.
//!
//! Capacity and rate come from the live config on every operation: a changed `rpm` applies to the
//! next request (a lowered capacity clamps the stored tokens).
//!
//! The operations of one worker process on one key are group-committed
//! ([`switchyard_kv::combine`]): the first caller leads, applies every queued take, refund and
//! charge in arrival order to the key's last known revision and writes once; the others get
//! their answers. So a hot target costs one KV write per batch, not per request, and the
//! contenders for a key are worker processes. A conflict with another replica re-reads the key
//! and re-applies the batch after a jittered backoff, for up to 5 s (then fail-open, below). A
//! shortage computed from the cached revision is confirmed with a fresh read (another replica
//! may have refunded); a request costing more than the capacity is refused without one. A take
//! whose caller went away before its answer is given back.
//!
//! TPM is charged before the call with an estimate ([`estimate_tokens`]: o200k tokens of the
//! prompt + `max_tokens`, 256 when absent) and corrected after it with the actual usage
//! ([`Limiter::settle`]): the difference is refunded or charged extra (a bucket may go into debt,
//! down to minus its capacity, which later requests wait out).
//!
//! # Concurrency
//!
//! `max_concurrency` counts in-flight requests per target in this worker process; beyond it a
//! request is rejected at once (no queueing), as `rate_limited` with a 1 s `retry_after_ms`.
//!
//! # Rejections
//!
//! A request rejected by one limit consumes nothing of the others: admission takes a concurrency
//! slot, then RPM and TPM in parallel (each in its key's batch, at the same time), and gives back
//! what it took when another one says no. Rejections are
//! retryable `rate_limited` errors with `retry_after_ms` and no upstream status, so ingress moves
//! on to the next target without counting it against the target's health, and a model whose
//! every target is saturated by its own limits is answered 429 with `Retry-After` (not 503).
//!
//! # Failure of the shared store
//!
//! Without JetStream (or when the bucket cannot be opened) the buckets are process-local (logged).
//! A KV operation that fails at run time (timeout, server gone, 5 s of unbroken conflicts) admits
//! the request (fail-open, logged): a limit outage must not become a gateway outage. So does an
//! entry that does not parse: it is overwritten with a full bucket. (Budgets, with the same
//! helper, fail closed instead: overspending money is worse than an extra upstream call.)

mod bucket;

use bucket::{Applied, Buckets, Op};
pub use bucket::{
    BucketState, LEASE_REQUESTS, LEASE_SHARE, LEASE_VISIBLE, Leased, RECLAIM_WAIT, RENEW_EVERY,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use switchyard_schemas::config::TargetConfig;
use switchyard_schemas::subjects::LIMITS_BUCKET;
use switchyard_schemas::tokens;
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// `max_tokens` assumed for the TPM estimate when the request sets none, tokens (shared with
/// ingress's key limits).
pub use switchyard_schemas::tokens::DEFAULT_MAX_TOKENS;
/// `retry_after_ms` of a concurrency refusal (a slot frees when any call ends), ms.
pub const CONCURRENCY_RETRY_MS: u64 = 1_000;
/// Which shared limit a bucket holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKind {
    /// Requests per minute.
    Rpm,
    /// Tokens per minute.
    Tpm,
}

impl LimitKind {
    /// The key suffix, `rpm` or `tpm`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rpm => "rpm",
            Self::Tpm => "tpm",
        }
    }
}

/// The KV key of one target's bucket: `<escaped target id>.<rpm|tpm>`. Characters outside
/// `[A-Za-z0-9_-]` are written `=XX` (hex of each UTF-8 byte), so any target id maps to a valid,
/// distinct key.
pub fn bucket_key(target: &str, kind: LimitKind) -> String {
    let mut key = String::with_capacity(target.len() + 4);
    for b in target.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            key.push(b as char);
        } else {
            key.push_str(&format!("={b:02X}"));
        }
    }
    key.push('.');
    key.push_str(kind.as_str());
    key
}

/// In-flight requests of one target in this process.
#[derive(Debug)]
struct ConcurrencyPermit(Arc<AtomicU32>);

impl Drop for ConcurrencyPermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What an admitted request holds until it ends: its concurrency slot and its TPM charge.
#[derive(Debug)]
pub struct Admission {
    target: String,
    _permit: Option<ConcurrencyPermit>,
    /// Tokens charged to the TPM bucket (0 when the target has no TPM limit).
    tpm_estimate: u64,
    tpm_capacity: Option<u64>,
}

impl Admission {
    /// Tokens charged to the target's TPM bucket before the call (0 without a TPM limit).
    pub fn tpm_estimate(&self) -> u64 {
        self.tpm_estimate
    }
}

/// The limits of every target served by one worker process.
pub struct Limiter {
    buckets: Arc<Buckets>,
    in_flight: Mutex<HashMap<String, Arc<AtomicU32>>>,
    /// Returns idle leases every [`RENEW_EVERY`]; stopped by [`Limiter::close`].
    ticker: TaskTracker,
    stop: CancellationToken,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("shared", &self.is_shared())
            .finish()
    }
}

impl Limiter {
    /// Limits shared through the KV bucket [`LIMITS_BUCKET`] (created in memory storage, one
    /// value per key, if missing). Falls back to process-local buckets, with a warning, when
    /// JetStream is not available.
    pub async fn connect(js: &async_nats::jetstream::Context) -> Self {
        let config = switchyard_schemas::replicas::kv(async_nats::jetstream::kv::Config {
            bucket: LIMITS_BUCKET.to_owned(),
            description: "Switchyard RPM/TPM token buckets, one key per target and limit"
                .to_owned(),
            history: 1,
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        });
        let kv = match switchyard_kv::get_or_create(js, config).await {
            Ok(kv) => Some(kv),
            Err(e) => {
                tracing::warn!(error = %e, "no JetStream KV for limits: RPM/TPM limits are per worker process");
                None
            }
        };
        Self::with_store(kv)
    }

    /// Process-local buckets (no sharing between replicas).
    pub fn local() -> Self {
        Self::with_store(None)
    }

    fn with_store(kv: Option<async_nats::jetstream::kv::Store>) -> Self {
        let holder = format!("worker-{}", uuid::Uuid::now_v7());
        let limiter = Self {
            buckets: Arc::new(Buckets::new(kv, holder)),
            in_flight: Mutex::new(HashMap::new()),
            ticker: TaskTracker::new(),
            stop: CancellationToken::new(),
        };
        if limiter.is_shared() {
            let buckets = limiter.buckets.clone();
            switchyard_kv::combine::every(
                &limiter.ticker,
                RENEW_EVERY,
                limiter.stop.clone(),
                move || {
                    let buckets = buckets.clone();
                    async move { buckets.return_leases(RENEW_EVERY).await }
                },
            );
        }
        limiter
    }

    /// Whether the buckets are shared through NATS KV.
    pub fn is_shared(&self) -> bool {
        matches!(*self.buckets, Buckets::Shared { .. })
    }

    /// Returns every lease and waits until every batch in progress (refunds and corrections
    /// included) has been written (shutdown).
    pub async fn close(&self) {
        self.stop.cancel();
        self.ticker.close();
        self.ticker.wait().await;
        self.buckets.return_leases(std::time::Duration::ZERO).await;
        self.buckets.close().await;
    }

    /// Admits `req` to `target` under its current limits: a concurrency slot, one RPM token and
    /// the TPM estimate, all or nothing. The error is what the worker answers with.
    pub async fn admit(
        &self,
        target: &TargetConfig,
        req: &ChatRequest,
    ) -> Result<Admission, ErrorInfo> {
        let limits = &target.limits;
        let batch = req.batch_id.is_some();
        let permit = match limits.max_concurrency {
            Some(max) => Some(
                self.try_concurrency(&target.id, batch_cap(max, batch))
                    .ok_or_else(|| {
                        ErrorInfo::new(
                    ErrorClass::RateLimited,
                    format!(
                        "target `{}`: {max} requests in flight on this worker (max_concurrency)",
                        target.id
                    ),
                )
                .with_retry_after_ms(Some(CONCURRENCY_RETRY_MS))
                    })?,
            ),
            None => None,
        };
        let mut admission = Admission {
            target: target.id.clone(),
            _permit: permit,
            tpm_estimate: 0,
            tpm_capacity: limits.tpm,
        };
        // RPM and TPM in parallel (one round trip each); whichever succeeded is given back when
        // the other says no.
        let estimate = match limits.tpm {
            Some(_) => estimate_tokens(req).await,
            None => 0,
        };
        let tpm_take = async {
            let tpm = limits.tpm?;
            let key = bucket_key(&target.id, LimitKind::Tpm);
            let r = self
                .buckets
                .run(
                    &key,
                    tpm as f64,
                    Op::Take {
                        cost: estimate as f64,
                        keep: reserve(tpm as f64, batch),
                    },
                    false,
                )
                .await;
            Some((tpm, r))
        };
        let (rpm, tpm) = tokio::join!(self.take_request(target, batch), tpm_take);
        let tpm_taken = match &tpm {
            Some((_, Ok(Applied::Done))) => true,
            Some((_, Err(e))) => {
                tracing::warn!(target = %target.id, error = %e, "TPM limit not checked (admitting)");
                false
            }
            _ => false,
        };
        if let Err(e) = rpm {
            if tpm_taken && let Some((cap, _)) = tpm {
                let key = bucket_key(&target.id, LimitKind::Tpm);
                self.give_back(&key, cap as f64, estimate as f64).await;
            }
            return Err(e);
        }
        if let Some((cap, Ok(Applied::Short(wait)))) = tpm {
            if let Some(rpm) = limits.rpm {
                let key = bucket_key(&target.id, LimitKind::Rpm);
                self.give_back(&key, rpm as f64, 1.0).await;
            }
            let message = match wait {
                Some(_) => format!(
                    "target `{}`: tokens-per-minute limit {cap} reached (request estimated at {estimate} tokens)",
                    target.id
                ),
                None => format!(
                    "target `{}`: request estimated at {estimate} tokens exceeds the tokens-per-minute limit {cap}",
                    target.id
                ),
            };
            return Err(ErrorInfo::new(ErrorClass::RateLimited, message).with_retry_after_ms(wait));
        }
        if tpm_taken {
            admission.tpm_estimate = estimate;
        }
        Ok(admission)
    }

    /// Takes one RPM token for an upstream call of `target` (admission, and each retry); a
    /// `batch` item only within [`BATCH_SHARE`] of the limit.
    pub async fn take_request(&self, target: &TargetConfig, batch: bool) -> Result<(), ErrorInfo> {
        let Some(rpm) = target.limits.rpm else {
            return Ok(());
        };
        let key = bucket_key(&target.id, LimitKind::Rpm);
        let take = Op::Take {
            cost: 1.0,
            keep: reserve(rpm as f64, batch),
        };
        match self.buckets.run(&key, rpm as f64, take, false).await {
            Ok(Applied::Done) => Ok(()),
            Ok(Applied::Short(wait)) => Err(ErrorInfo::new(
                ErrorClass::RateLimited,
                format!(
                    "target `{}`: requests-per-minute limit {rpm} reached",
                    target.id
                ),
            )
            .with_retry_after_ms(wait)),
            Err(e) => {
                tracing::warn!(target = %target.id, error = %e, "RPM limit not checked (admitting)");
                Ok(())
            }
        }
    }

    /// Corrects the TPM charge of a finished request with the tokens it actually used
    /// (prompt + completion of every upstream call): refunds or charges the difference.
    pub async fn settle(&self, admission: &Admission, actual_tokens: u64) {
        let Some(tpm) = admission.tpm_capacity else {
            return;
        };
        if admission.tpm_estimate == 0 {
            return;
        }
        let key = bucket_key(&admission.target, LimitKind::Tpm);
        let diff = actual_tokens as f64 - admission.tpm_estimate as f64;
        let op = if diff < 0.0 {
            Op::Give(-diff)
        } else if diff > 0.0 {
            Op::Charge(diff)
        } else {
            return;
        };
        if let Err(e) = self.buckets.run(&key, tpm as f64, op, true).await {
            tracing::warn!(target = %admission.target, error = %e, "TPM correction lost");
        }
    }

    /// The stored state of a target's bucket (not refilled to now), if it exists.
    pub async fn bucket(&self, target: &str, kind: LimitKind) -> Option<BucketState> {
        self.buckets.peek(&bucket_key(target, kind)).await
    }

    async fn give_back(&self, key: &str, capacity: f64, n: f64) {
        if let Err(e) = self.buckets.run(key, capacity, Op::Give(n), false).await {
            tracing::warn!(key, error = %e, "limit refund lost");
        }
    }

    fn try_concurrency(&self, target: &str, max: u32) -> Option<ConcurrencyPermit> {
        let counter = self
            .in_flight
            .lock()
            .entry(target.to_owned())
            .or_default()
            .clone();
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| ConcurrencyPermit(counter))
    }
}

/// The share of each limit (RPM, TPM, `max_concurrency`) batch items may use: a batch item is
/// admitted only while the rest stays free, so live traffic always finds that headroom and a
/// batch never pushes a live request into a 429 that the live load alone would not have hit.
pub const BATCH_SHARE: f64 = 0.5;

/// Tokens a batch item must leave in a bucket of `capacity` (none for live requests).
fn reserve(capacity: f64, batch: bool) -> f64 {
    if batch {
        capacity * (1.0 - BATCH_SHARE)
    } else {
        0.0
    }
}

/// The concurrency cap for a request: the whole `max` for live ones, [`BATCH_SHARE`] of it (at
/// least 1) for batch items.
fn batch_cap(max: u32, batch: bool) -> u32 {
    if batch {
        ((f64::from(max) * BATCH_SHARE).floor() as u32).max(1)
    } else {
        max
    }
}

/// Tokens of `text` under o200k_base (GPT-4o's encoding; 4 bytes per token if it cannot load).
/// Blocking.
pub fn count_tokens(text: &str) -> u64 {
    tokens::count(text)
}

/// The TPM charge of a request before its call: the prompt estimate of
/// [`switchyard_schemas::tokens`] (o200k tokens of the messages and tool definitions,
/// [`tokens::PER_MESSAGE`] per message, [`tokens::REPLY_PRIMING`] for the reply), plus
/// `max_tokens` ([`DEFAULT_MAX_TOKENS`] when absent) per choice (`n`, default 1). Ingress's
/// estimate of the prompt ([`ChatRequest::prompt_tokens`], the same formula) is used when the
/// request carries one. Large prompts, and the first one (which loads the tokenizer), are
/// tokenized off the async threads.
pub async fn estimate_tokens(req: &ChatRequest) -> u64 {
    let prompt = match req.prompt_tokens {
        Some(p) => p,
        None => tokens::estimate(&req.messages, &req.tools).await.total(),
    };
    let max = req.params.max_tokens.map_or(DEFAULT_MAX_TOKENS, u64::from);
    prompt + max * u64::from(req.params.n.unwrap_or(1).max(1))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_are_valid_and_distinct() {
        assert_eq!(bucket_key("openai-main", LimitKind::Rpm), "openai-main.rpm");
        assert_eq!(bucket_key("a.b c", LimitKind::Tpm), "a=2Eb=20c.tpm");
        assert_ne!(
            bucket_key("a.b", LimitKind::Rpm),
            bucket_key("a=2Eb", LimitKind::Rpm)
        );
    }

    fn target(limits: serde_json::Value) -> TargetConfig {
        serde_json::from_value(serde_json::json!({"id": "t", "provider": "openai",
            "base_url": "builtin:mock", "upstream_model": "m", "limits": limits}))
        .unwrap()
    }

    fn request(text: &str, max_tokens: Option<u32>) -> ChatRequest {
        let mut r: ChatRequest = serde_json::from_value(serde_json::json!({
            "id": uuid::Uuid::now_v7(), "model": "m",
            "target": {"id": "t", "provider": "openai", "upstream_model": "m"},
            "messages": [{"role": "user", "content": text}],
            "stream": false, "deadline_ms": 0}))
        .unwrap();
        r.params.max_tokens = max_tokens;
        r
    }

    #[tokio::test]
    async fn estimate_counts_prompt_overhead_and_max_tokens() {
        let r = request("Hello world", None);
        assert_eq!(count_tokens("Hello world"), 2);
        assert_eq!(estimate_tokens(&r).await, 2 + 6 + DEFAULT_MAX_TOKENS);
        let r = request("Hello world", Some(10));
        assert_eq!(estimate_tokens(&r).await, 2 + 6 + 10);
    }

    #[tokio::test]
    async fn rejection_gives_back_what_it_took() {
        count_tokens("load the tokenizer first");
        let l = Limiter::local();
        let t = target(serde_json::json!({"rpm": 5, "tpm": 100, "max_concurrency": 1}));
        // Estimate 2 + 6 + 50 = 58 tokens: the second request does not fit the TPM bucket.
        let r = request("Hello world", Some(50));
        let a = l.admit(&t, &r).await.unwrap();
        assert_eq!(a.tpm_estimate(), 58);
        // Concurrency is full while `a` lives.
        let e = l.admit(&t, &r).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::RateLimited);
        assert_eq!(e.retry_after_ms, Some(CONCURRENCY_RETRY_MS));
        assert!(e.retryable);
        assert!(e.message.contains("max_concurrency"), "{}", e.message);
        drop(a);
        let e = l.admit(&t, &r).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::RateLimited);
        assert!(e.retry_after_ms.unwrap() > 0);
        // The TPM rejection gave its RPM token back: 5 - 1 (first admit) = 4 left, not 3.
        let rpm = l.bucket("t", LimitKind::Rpm).await.unwrap();
        assert!(rpm.tokens > 3.99 && rpm.tokens < 4.5, "{rpm:?}");
        // And the concurrency slot.
        assert!(l.try_concurrency("t", 1).is_some());
    }

    /// Batch items use at most half of each limit: with RPM 4, two batch items are admitted and
    /// the third refused (retryable), while live requests still get the other two RPM tokens;
    /// with max_concurrency 2, one batch item runs and a live request still finds a slot.
    #[tokio::test]
    async fn batch_items_leave_the_live_share_free() {
        let l = Limiter::local();
        let t = target(serde_json::json!({"rpm": 4, "max_concurrency": 8}));
        let live = request("Hello world", Some(10));
        let mut batch = live.clone();
        batch.batch_id = Some("batch_1".into());
        let b1 = l.admit(&t, &batch).await.unwrap();
        let b2 = l.admit(&t, &batch).await.unwrap();
        let e = l.admit(&t, &batch).await.unwrap_err();
        assert!(e.retryable, "{e:?}");
        let l1 = l.admit(&t, &live).await.unwrap();
        let l2 = l.admit(&t, &live).await.unwrap();
        let e = l.admit(&t, &live).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::RateLimited);
        drop((b1, b2, l1, l2));
        let t = target(serde_json::json!({"max_concurrency": 2}));
        let b = l.admit(&t, &batch).await.unwrap();
        let e = l.admit(&t, &batch).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::RateLimited);
        let l1 = l.admit(&t, &live).await.unwrap();
        drop((b, l1));
    }

    #[tokio::test]
    async fn rpm_rejection_gives_the_tpm_charge_back() {
        let l = Limiter::local();
        let t = target(serde_json::json!({"rpm": 1, "tpm": 1000}));
        let r = request("Hello world", Some(50));
        let a = l.admit(&t, &r).await.unwrap();
        let after_first = l.bucket("t", LimitKind::Tpm).await.unwrap().tokens;
        assert!((after_first - (1000.0 - 58.0)).abs() < 1.0);
        let e = l.admit(&t, &r).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::RateLimited);
        assert!(e.message.contains("requests-per-minute"), "{}", e.message);
        let tpm = l.bucket("t", LimitKind::Tpm).await.unwrap().tokens;
        assert!(tpm > after_first - 1.0 && tpm < after_first + 5.0, "{tpm}");
        drop(a);
    }

    #[tokio::test]
    async fn settle_refunds_or_charges_the_difference() {
        let l = Limiter::local();
        let t = target(serde_json::json!({"tpm": 6000}));
        let a = l
            .admit(&t, &request("Hello world", Some(100)))
            .await
            .unwrap();
        let est = a.tpm_estimate() as f64;
        let before = l.bucket("t", LimitKind::Tpm).await.unwrap().tokens;
        assert!((before - (6000.0 - est)).abs() < 1.0);
        l.settle(&a, 30).await;
        let after = l.bucket("t", LimitKind::Tpm).await.unwrap().tokens;
        assert!((after - (6000.0 - 30.0)).abs() < 1.0, "{after}");
        let a = l
            .admit(&t, &request("Hello world", Some(100)))
            .await
            .unwrap();
        l.settle(&a, 1_000).await;
        let after = l.bucket("t", LimitKind::Tpm).await.unwrap().tokens;
        assert!((after - (6000.0 - 1_030.0)).abs() < 1.0, "{after}");
    }
}
