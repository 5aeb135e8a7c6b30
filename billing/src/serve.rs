//! The one request/reply loop behind billing's NATS queries (`<prefix>.billing.usage`,
//! `<prefix>.billing.audit`): a queue subscription in [`QUERY_QUEUE_GROUP`] (one billing instance
//! answers each query), at most [`MAX_CONCURRENT_QUERIES`] answers computed at once, and a
//! shutdown that stops taking queries and then waits for the answers under way.

use crate::{BillingError, Ledger};
use bytes::Bytes;
use futures::StreamExt;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The queue group billing queries are served in: one billing instance answers each.
pub const QUERY_QUEUE_GROUP: &str = "billing";
/// Queries computed at once per billing instance and subject (each holds one pooled connection
/// while it reads), queries.
pub const MAX_CONCURRENT_QUERIES: usize = 4;

/// Serves `subject` until `shutdown` completes: each message with a reply subject gets
/// `answer(ledger, payload, max_payload)` (a clone of `ledger`; the server's `max_payload`,
/// bytes, so an answer can fit itself to one message) published back. A message without a
/// reply subject is ignored. Returns after the answers under way are sent; fails only when
/// subscribing fails.
pub(crate) async fn serve<F, Fut>(
    nats: async_nats::Client,
    subject: String,
    what: &'static str,
    ledger: Ledger,
    shutdown: impl Future,
    answer: F,
) -> Result<(), BillingError>
where
    F: Fn(Ledger, Bytes, usize) -> Fut,
    Fut: Future<Output = Vec<u8>> + Send + 'static,
{
    let mut sub = nats
        .queue_subscribe(subject.clone(), QUERY_QUEUE_GROUP.to_owned())
        .await?;
    tracing::info!(%subject, what, "billing queries served");
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT_QUERIES));
    let mut running = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let message = tokio::select! {
            biased;
            _ = shutdown.as_mut() => break,
            m = sub.next() => m,
        };
        let Some(message) = message else { break };
        let Some(reply) = message.reply.clone() else {
            continue;
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        // Reap finished answers so the set stays as small as the slots.
        while running.try_join_next().is_some() {}
        let body = answer(
            ledger.clone(),
            message.payload,
            nats.server_info().max_payload,
        );
        let nats = nats.clone();
        running.spawn(async move {
            let body = body.await;
            if let Err(e) = nats.publish(reply, body.into()).await {
                tracing::warn!(error = %e, what, "publishing a billing answer failed");
            }
            drop(slot);
        });
    }
    if let Err(e) = sub.unsubscribe().await {
        tracing::debug!(error = %e, what, "unsubscribing billing queries failed");
    }
    while running.join_next().await.is_some() {}
    Ok(())
}
