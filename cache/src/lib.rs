//! The cache service: answers lookups over NATS request/reply in queue group `cache`.
//!
//! This first slice only wires the service into the pipeline (it answers every lookup with a
//! miss); the exact and semantic layers arrive with the semantic-cache issue.

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use switchyard_schemas::subjects::Subjects;

/// The queue group every cache instance joins, so NATS spreads lookups across instances.
pub const QUEUE_GROUP: &str = "cache";

/// A lookup answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupReply {
    /// `hit`, `semantic-hit`, `miss` or `bypass` (the `x-switchyard-cache` header values).
    pub outcome: String,
}

/// Cache service failures.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Subscribing failed.
    #[error("NATS subscribe failed: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
}

/// Serves lookups until `shutdown` resolves.
pub async fn run(
    nats: async_nats::Client,
    subjects: Subjects,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), CacheError> {
    let mut sub = nats
        .queue_subscribe(subjects.cache_lookup(), QUEUE_GROUP.into())
        .await?;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            msg = sub.next() => {
                let Some(msg) = msg else { return Ok(()) };
                if let Some(reply) = msg.reply {
                    let body = serde_json::to_vec(&LookupReply { outcome: "miss".into() }).unwrap_or_default();
                    if let Err(e) = nats.publish(reply, body.into()).await {
                        tracing::warn!(error = %e, "cache reply failed");
                    }
                }
            }
        }
    }
}
