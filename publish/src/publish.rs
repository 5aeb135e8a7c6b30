//! Acknowledged, deduplicated JetStream publish of usage events, shared by the producers (ingress
//! and workers) so they retry, deduplicate and spool the same way; what JetStream does not
//! acknowledge goes to the process's [`Spool`] (see [`crate::spool`]).
//!
//! Also the process-wide counters of failed publishes ([`PublishKind`], [`count_publish_error`],
//! [`publish_errors`]) and [`sync_with_server`].

use crate::message::{Entry, connected, msg_id_of, send, subject_of};
use crate::spool::Spool;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use switchyard_schemas::subjects::Subjects;
use switchyard_schemas::usage::UsageEvent;

/// What a failed NATS publish was carrying (the `subject` label of
/// [`switchyard_schemas::metrics::NATS_PUBLISH_ERRORS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishKind {
    /// An acknowledged publish attempt of usage events.
    Usage,
    /// A request ingress publishes to the workers.
    Request,
}

impl PublishKind {
    /// Every kind, in label order.
    pub const ALL: &'static [PublishKind] = &[PublishKind::Usage, PublishKind::Request];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PublishKind::Usage => "usage",
            PublishKind::Request => "request",
        }
    }
}

/// Failed publishes of this process by [`PublishKind`] (process-wide, like the spool).
static PUBLISH_ERRORS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Counts one failed publish of `kind`.
pub fn count_publish_error(kind: PublishKind) {
    PUBLISH_ERRORS[kind as usize].fetch_add(1, Ordering::Relaxed);
}

/// Failed publishes of `kind` in this process so far.
pub fn publish_errors(kind: PublishKind) -> u64 {
    PUBLISH_ERRORS[kind as usize].load(Ordering::Relaxed)
}

/// Acknowledged publish attempts before an event goes to the spool.
pub const PUBLISH_ATTEMPTS: u32 = 5;

/// Publishes `event` on `<prefix>.usage.<kind>` with `Nats-Msg-Id`
/// `<request-id>:<kind>:<attempt>` (JetStream drops duplicates inside the stream's duplicate window),
/// waiting for the stream's acknowledgement and retrying [`PUBLISH_ATTEMPTS`] times with exponential
/// backoff from 50 ms (an attempt while the client is disconnected fails at once, so an outage sends
/// events to the spool within about 0.75 s instead of after five acknowledgement timeouts). When
/// every attempt fails, the event is appended to the local spool (see [`crate::spool`]), from which
/// [`crate::spool::drain_spool`] publishes it later. Returns whether the event is stored:
/// acknowledged by JetStream or durably spooled; false only when neither worked (no spool
/// configured, or writing it failed), which is logged as an error.
pub async fn publish_usage_event(
    js: &async_nats::jetstream::Context,
    spool: Option<&Arc<Spool>>,
    subjects: &Subjects,
    event: &UsageEvent,
) -> bool {
    let Ok(payload) = serde_json::to_vec(event) else {
        return false;
    };
    let subject = subject_of(subjects, event);
    let entry = Entry {
        subject: subject.clone(),
        msg_id: msg_id_of(event),
        event: event.clone(),
    };
    let msg_id = entry.msg_id.clone();
    store(js, spool, &subject, &msg_id, payload, vec![entry]).await
}

/// Publishes `payload` (one event, or a JSON array of events, all on `subject`) with `msg_id`,
/// retrying as [`publish_usage_event`] documents; when every attempt fails, appends `entries`
/// (the events it carries, each with its own subject and `Nats-Msg-Id`) to the spool. Returns
/// whether the events are stored (acknowledged or spooled).
pub(crate) async fn store(
    js: &async_nats::jetstream::Context,
    spool: Option<&Arc<Spool>>,
    subject: &str,
    msg_id: &str,
    payload: Vec<u8>,
    entries: Vec<Entry>,
) -> bool {
    let mut delay = Duration::from_millis(50);
    for attempt in 0..PUBLISH_ATTEMPTS {
        // While disconnected a publish would only wait for the acknowledgement timeout (5 s by
        // default); failing the attempt at once gets the event onto disk within ~0.75 s.
        let result = if connected(js) {
            publish_once(js, subject, msg_id, &payload).await
        } else {
            Err("NATS is not connected".to_owned())
        };
        match result {
            Ok(()) => return true,
            Err(e) => {
                count_publish_error(PublishKind::Usage);
                tracing::debug!(attempt, error = %e, "usage publish failed");
            }
        }
        if attempt + 1 < PUBLISH_ATTEMPTS {
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
    }
    let Some(spool) = spool else {
        tracing::error!(%subject, events = entries.len(), "usage events could not be stored in JetStream and no spool is configured; dropped");
        return false;
    };
    let events = entries.len();
    let appended = {
        let spool = spool.clone();
        tokio::task::spawn_blocking(move || entries.iter().try_for_each(|e| spool.append(e))).await
    };
    match appended {
        Ok(Ok(())) => {
            tracing::warn!(%subject, events, spool = %spool.dir().display(),
                "usage events not acknowledged by JetStream; spooled locally for later delivery");
            true
        }
        Ok(Err(e)) => {
            tracing::error!(%subject, events, error = %e, "usage events could not be spooled; dropped");
            false
        }
        Err(e) => {
            tracing::error!(%subject, events, error = %e, "usage event spool task failed; dropped");
            false
        }
    }
}

/// One acknowledged publish; the error says what failed.
async fn publish_once(
    js: &async_nats::jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: &[u8],
) -> Result<(), String> {
    let ack = send(js, subject, msg_id, payload).await?;
    ack.await
        .map(|_| ())
        .map_err(|e| format!("not acknowledged: {e}"))
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
