//! Acknowledged, deduplicated JetStream publish of usage events (feature `nats`), shared by the two
//! producers (ingress and workers) so both retry and deduplicate the same way.

use crate::subjects::Subjects;
use crate::usage::UsageEvent;
use std::time::Duration;

/// Publishes `event` on `<prefix>.usage.<kind>.<request-id>` with `Nats-Msg-Id`
/// `<request-id>:<kind>:<attempt>` (JetStream drops duplicates inside the stream's duplicate window),
/// waiting for the stream's acknowledgement and retrying 5 times with exponential backoff from 50 ms.
/// Returns whether the event was stored. (A durable local spool for long NATS outages comes later.)
pub async fn publish_usage_event(
    js: &async_nats::jetstream::Context,
    subjects: &Subjects,
    event: &UsageEvent,
) -> bool {
    let Ok(payload) = serde_json::to_vec(event) else {
        return false;
    };
    let id = event.request_id.to_string();
    let subject = subjects.usage(event.kind.as_str(), &id);
    let msg_id = format!("{id}:{}:{}", event.kind.as_str(), event.attempt);
    let mut delay = Duration::from_millis(50);
    for attempt in 0..5 {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", msg_id.as_str());
        match js
            .publish_with_headers(subject.clone(), headers, payload.clone().into())
            .await
        {
            Ok(ack) => match ack.await {
                Ok(_) => return true,
                Err(e) => tracing::debug!(attempt, error = %e, "usage publish not acknowledged"),
            },
            Err(e) => tracing::debug!(attempt, error = %e, "usage publish failed"),
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    tracing::warn!(%subject, "usage event could not be stored in JetStream after 5 attempts");
    false
}

/// Waits until the server has processed everything `client` sent before (e.g. subscriptions):
/// publishes to a fresh subject the client itself subscribes to and waits, up to 5 s, for the
/// echo. (`Client::flush` only empties the socket buffer; it does not prove the server has
/// registered a SUB.) Returns false on timeout or failure.
pub async fn sync_with_server(client: &async_nats::Client) -> bool {
    use futures::StreamExt as _;
    let subject = client.new_inbox();
    let Ok(mut sub) = client.subscribe(subject.clone()).await else {
        return false;
    };
    if client.publish(subject, bytes::Bytes::new()).await.is_err() {
        return false;
    }
    matches!(
        tokio::time::timeout(Duration::from_secs(5), sub.next()).await,
        Ok(Some(_))
    )
}
