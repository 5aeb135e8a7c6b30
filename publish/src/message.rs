//! One usage event as a JetStream message: its subject, its `Nats-Msg-Id`, its spooled form
//! ([`Entry`]) and [`send`], one publish whose acknowledgement the caller awaits; shared by the
//! publishers and the spool's drainer.

use serde::{Deserialize, Serialize};
use switchyard_schemas::subjects::Subjects;
use switchyard_schemas::usage::UsageEvent;

/// Whether the context's client is connected to a server right now.
pub(crate) fn connected(js: &async_nats::jetstream::Context) -> bool {
    js.client().connection_state() == async_nats::connection::State::Connected
}

/// The subject an event is published on: one per kind, never per request.
pub(crate) fn subject_of(subjects: &Subjects, event: &UsageEvent) -> String {
    subjects.usage_kind(event.kind.as_str())
}

/// The `Nats-Msg-Id` of an event: `<request-id>:<kind>:<attempt>`.
pub(crate) fn msg_id_of(event: &UsageEvent) -> String {
    format!(
        "{}:{}:{}",
        event.request_id,
        event.kind.as_str(),
        event.attempt
    )
}

/// Sends one publish and returns the future of its acknowledgement.
pub(crate) async fn send(
    js: &async_nats::jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: &[u8],
) -> Result<async_nats::jetstream::context::PublishAckFuture, String> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", msg_id);
    js.publish_with_headers(subject.to_owned(), headers, payload.to_vec().into())
        .await
        .map_err(|e| format!("publish failed: {e}"))
}

/// One spooled event: where and with which `Nats-Msg-Id` it is to be published.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub(crate) subject: String,
    pub(crate) msg_id: String,
    pub(crate) event: UsageEvent,
}
