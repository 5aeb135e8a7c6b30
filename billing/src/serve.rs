//! The one request/reply loop behind billing's NATS queries (the subjects of [`Query`]:
//! `<prefix>.billing.usage`, `.audit` and `.balance`): a queue subscription in
//! [`QUERY_QUEUE_GROUP`] (one billing instance answers each query), at most
//! [`MAX_CONCURRENT_QUERIES`] answers computed at once, and a shutdown that stops taking queries
//! and then waits for the answers under way.

use crate::{BillingError, Ledger};
use bytes::Bytes;
use futures::StreamExt;
use std::future::Future;
use std::sync::Arc;
use switchyard_schemas::subjects::Subjects;
use tokio::sync::Semaphore;

/// The queue group billing queries are served in: one billing instance answers each.
pub const QUERY_QUEUE_GROUP: &str = "billing";
/// Queries computed at once per billing instance and subject (each holds one pooled connection
/// while it reads), queries.
pub const MAX_CONCURRENT_QUERIES: usize = 4;

/// One of billing's NATS query subjects, each answered by its own module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    /// `<prefix>.billing.usage`: a JSON
    /// [`UsageQuery`](switchyard_schemas::usage_query::UsageQuery) answered with a JSON
    /// [`UsageAnswer`](switchyard_schemas::usage_query::UsageAnswer) ([`crate::query`]; an answer
    /// larger than the server's `max_payload` is replaced by an error saying so).
    Usage,
    /// `<prefix>.billing.audit`: a JSON [`AuditQuery`](switchyard_schemas::audit::AuditQuery)
    /// answered with a JSON [`AuditAnswer`](switchyard_schemas::audit::AuditAnswer)
    /// ([`crate::audit`]; a page too large for one message is cut).
    Audit,
    /// `<prefix>.billing.balance`: a JSON
    /// [`BalanceRequest`](switchyard_schemas::balance::BalanceRequest) answered with a JSON
    /// [`BalanceAnswer`](switchyard_schemas::balance::BalanceAnswer) ([`crate::balance`]; a top-up
    /// is idempotent by its id in the ledger, so concurrent repeats store one row).
    Balance,
}

impl Query {
    /// Every query subject billing serves.
    pub const ALL: [Self; 3] = [Self::Usage, Self::Audit, Self::Balance];

    /// The subject served, under `subjects`' prefix.
    pub fn subject(self, subjects: &Subjects) -> String {
        match self {
            Self::Usage => subjects.usage_query(),
            Self::Audit => subjects.audit_query(),
            Self::Balance => subjects.balance(),
        }
    }

    /// The name logs give it: `usage`, `audit` or `balance`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Usage => "usage",
            Self::Audit => "audit",
            Self::Balance => "balance",
        }
    }

    /// The JSON answer to one request `payload`, fitted to `max_payload` bytes (0: no limit).
    async fn answer(self, ledger: Ledger, payload: Bytes, max_payload: usize) -> Vec<u8> {
        match self {
            Self::Usage => crate::query::reply(&ledger, &payload, max_payload).await,
            Self::Audit => crate::audit::reply(&ledger, &payload, max_payload).await,
            Self::Balance => crate::balance::reply(&ledger, &payload).await,
        }
    }
}

/// Serves `query`'s subject until `shutdown` completes: each message with a reply subject gets
/// its answer ([`Query`]; computed on a clone of `ledger`, fitted to the server's
/// `max_payload`) published back. A message without a reply subject is ignored. Returns after
/// the answers under way are sent; fails only when subscribing fails.
pub async fn serve_queries(
    nats: async_nats::Client,
    subjects: Subjects,
    query: Query,
    ledger: Ledger,
    shutdown: impl Future,
) -> Result<(), BillingError> {
    let subject = query.subject(&subjects);
    let what = query.name();
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
        let body = query.answer(
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
