//! One JSON value per KV key, changed only by compare-and-set on the key's revision.

use async_nats::jetstream::kv;
use rand::Rng;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Limit on one KV round trip (a read or a write).
pub const KV_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a KV operation did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The entry exists but does not parse as the expected JSON value.
    #[error("entry `{key}` unreadable: {reason}")]
    Unreadable {
        /// The KV key.
        key: String,
        /// The parse error.
        reason: String,
    },
    /// The store did not answer, or answered with an error (timeouts included).
    #[error("{0}")]
    Failed(String),
    /// Compare-and-set conflicts kept coming for longer than the caller allows.
    #[error("compare-and-set contention on `{0}`")]
    Contention(String),
}

/// The value of an entry as read.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored<V> {
    /// No such key, or it was deleted or purged.
    Absent,
    /// The parsed value.
    Value(V),
    /// The bytes did not parse (the parse error); the caller decides: fail closed or overwrite.
    Unreadable(String),
}

/// Why a compare-and-set write did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// Another writer changed the entry since the revision the value was computed from.
    Conflict,
    /// Any other failure.
    Failed(KvError),
}

/// Reads `key`: `(revision, value)`, revision 0 when the key never existed (a write with
/// revision 0 then creates it). A deleted entry keeps its revision and reads as
/// [`Stored::Absent`].
pub async fn load<V: DeserializeOwned>(
    kv: &kv::Store,
    key: &str,
) -> Result<(u64, Stored<V>), KvError> {
    match tokio::time::timeout(KV_TIMEOUT, kv.entry(key)).await {
        Ok(Ok(Some(e))) if e.operation == kv::Operation::Put => {
            match serde_json::from_slice(&e.value) {
                Ok(v) => Ok((e.revision, Stored::Value(v))),
                Err(err) => Ok((e.revision, Stored::Unreadable(err.to_string()))),
            }
        }
        Ok(Ok(Some(e))) => Ok((e.revision, Stored::Absent)),
        Ok(Ok(None)) => Ok((0, Stored::Absent)),
        Ok(Err(e)) => {
            tracing::warn!(key, error = %e, "KV read failed");
            Err(KvError::Failed(e.to_string()))
        }
        Err(_) => Err(KvError::Failed(format!("read of `{key}` timed out"))),
    }
}

/// Writes `value` (JSON) to `key` if its revision is still `revision`; the new revision.
pub async fn write<V: Serialize>(
    kv: &kv::Store,
    key: &str,
    value: &V,
    revision: u64,
) -> Result<u64, WriteError> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| WriteError::Failed(KvError::Failed(e.to_string())))?;
    match tokio::time::timeout(KV_TIMEOUT, kv.update(key, bytes.into(), revision)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) if is_conflict(&e) => Err(WriteError::Conflict),
        Ok(Err(e)) => {
            tracing::warn!(key, error = %e, "KV write failed");
            Err(WriteError::Failed(KvError::Failed(e.to_string())))
        }
        Err(_) => Err(WriteError::Failed(KvError::Failed(format!(
            "write of `{key}` timed out"
        )))),
    }
}

/// Whether a failed update lost a compare-and-set race. async-nats 0.51 maps only JetStream
/// error 10071 (`wrong last sequence: N`) to `WrongLastRevision`; a clustered nats-server (2.15
/// at R3, measured by scripts/cluster_scale.py) also answers a lost race with 10164
/// (`wrong last sequence`, `JSStreamWrongLastSequenceConstantErr`), which async-nats reports as
/// `Other`. Treated as a failure, it refused budgeted requests with 503
/// `budget_store_unavailable` instead of retrying.
fn is_conflict(e: &kv::UpdateError) -> bool {
    use async_nats::jetstream::{self, context::PublishError};
    use std::error::Error as _;
    e.kind() == kv::UpdateErrorKind::WrongLastRevision
        || e.source()
            .and_then(|s| s.downcast_ref::<PublishError>())
            .and_then(|p| p.source())
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .is_some_and(|j| {
                j.error_code() == jetstream::ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            })
}

/// Sleeps up to 2^min(attempt, 5) × 100 µs, uniformly random: writers that collided do not
/// collide again in lockstep.
pub async fn backoff(attempt: u32) {
    let cap = 100u64 << attempt.min(5);
    let us = rand::rng().random_range(0..=cap);
    tokio::time::sleep(Duration::from_micros(us)).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use async_nats::jetstream::{self, context::PublishError, context::PublishErrorKind};

    /// An update error as async-nats builds it from a JetStream publish answer `{code, err_code}`.
    fn update_error(err_code: u64) -> kv::UpdateError {
        let api: jetstream::Error = serde_json::from_value(serde_json::json!(
            {"code": 400, "err_code": err_code, "description": "wrong last sequence"}))
        .unwrap();
        let kind = if err_code == 10071 {
            PublishErrorKind::WrongLastSequence
        } else {
            PublishErrorKind::Other
        };
        PublishError::with_source(kind, api).into()
    }

    #[test]
    fn both_wrong_last_sequence_codes_are_conflicts() {
        assert!(is_conflict(&update_error(10071)));
        assert!(is_conflict(&update_error(10164)));
        // Anything else is a failure (e.g. 10077: maximum messages exceeded).
        assert!(!is_conflict(&update_error(10077)));
        assert!(!is_conflict(&kv::UpdateError::new(
            kv::UpdateErrorKind::TimedOut
        )));
    }
}
