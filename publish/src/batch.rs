//! Usage events batched into few acknowledged JetStream messages.
//!
//! Every request leaves one or two usage events; publishing each as its own acknowledged message
//! costs a publish, an acknowledgement, a delivery to billing and billing's ack — four NATS
//! messages and a JetStream store write per event. A [`UsagePublisher`] publishes the events a
//! process produces as **one** message whose payload is a JSON array of events, per kind
//! subject (`<prefix>.usage.<kind>`), by group commit with a linger: the first event of a batch
//! waits [`LINGER_MS`] for others; if a batch still awaits its acknowledgement then, the events
//! wait for it too and go out together (up to [`MAX_EVENTS`]). No event waits longer than the
//! linger plus one acknowledgement round trip, so a process killed with `SIGKILL` loses at most
//! the events of that window, and under load the batches grow by themselves.
//!
//! Guarantees are those of [`crate::publish::publish_usage_event`]: [`UsagePublisher::publish`]
//! returns once the event is acknowledged by the stream or durably spooled (each event of a
//! batch that could not be published is spooled on its own, with its own `Nats-Msg-Id`). A
//! batch's `Nats-Msg-Id` names exactly its events ([`batch_msg_id`]), so a retried batch is
//! deduplicated by JetStream while a different batch never is; an event that reaches the stream
//! twice (in two batches, or in a batch and later from the spool) is dropped by the ledger's
//! primary key (request id, kind, attempt).
//!
//! The latency of the client's request is unaffected: producers publish usage after the answer,
//! in tasks their shutdown waits for.

use crate::message::{Entry, msg_id_of, subject_of};
use crate::publish::{publish_usage_event, store};
use crate::spool::Spool;
use std::collections::HashMap;
use std::sync::Arc;
use switchyard_schemas::subjects::Subjects;
use switchyard_schemas::usage::UsageEvent;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::task::TaskTracker;

/// Most events in one message (≈ 400 bytes each: far below NATS's 1 MiB payload limit).
pub const MAX_EVENTS: usize = 256;
/// Events queued before [`UsagePublisher::publish`] waits for room (backpressure on producers).
const QUEUE: usize = 16_384;
/// Batches awaiting their acknowledgement at once (one: the next batch gathers meanwhile).
const IN_FLIGHT: usize = 1;
/// How long the first event of a batch waits for others before the batch goes out, ms.
///
/// Group commit alone batches only while an acknowledgement is in flight (≈ 0.3–1 ms on one
/// box), so at 1,000 requests/s most batches held one event: four NATS messages per event
/// (publish, ack, delivery to billing, billing's ack), a third of the request path's messages.
/// Lingering gathers ~5 events per message at that rate (docs/BENCHMARKS.md, "Fewer messages per request").
/// The client never waits for it (usage goes out after the answer); the price is a wider window
/// in which a `SIGKILL`ed process loses the events it holds (at most this long plus one
/// acknowledgement), and a batch item's completion, which waits for its usage, 5 ms later.
pub const LINGER_MS: u64 = 5;

/// One queued event and whom to tell that it is stored.
struct Pending {
    event: UsageEvent,
    done: oneshot::Sender<bool>,
}

/// A process's usage-event publisher: cheap to clone; see the module docs.
#[derive(Clone)]
pub struct UsagePublisher {
    tx: mpsc::Sender<Pending>,
    js: async_nats::jetstream::Context,
    subjects: Subjects,
    spool: Option<Arc<Spool>>,
    close: Arc<Notify>,
    /// The batching task.
    task: TaskTracker,
}

impl std::fmt::Debug for UsagePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsagePublisher")
            .field("queued", &(QUEUE - self.tx.capacity()))
            .finish()
    }
}

impl UsagePublisher {
    /// Starts the batching task (on the current tokio runtime) publishing to `js` under
    /// `subjects`' prefix; what JetStream does not take goes to `spool` (its owner drains it),
    /// without one it is dropped (logged). Call [`Self::close`] at shutdown.
    pub fn start(
        js: async_nats::jetstream::Context,
        subjects: Subjects,
        spool: Option<Arc<Spool>>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let close = Arc::new(Notify::new());
        let task = TaskTracker::new();
        task.spawn(run(
            rx,
            Sink {
                js: js.clone(),
                spool: spool.clone(),
            },
            subjects.clone(),
            close.clone(),
        ));
        Self {
            tx,
            js,
            subjects,
            spool,
            close,
            task,
        }
    }

    /// Queues `event` and waits until it is stored: acknowledged by the usage stream or
    /// durably spooled (true), or neither (false, logged). After [`Self::close`] the event is
    /// published on its own.
    pub async fn publish(&self, event: UsageEvent) -> bool {
        let (done, stored) = oneshot::channel();
        match self.tx.send(Pending { event, done }).await {
            Ok(()) => stored.await.unwrap_or(false),
            Err(mpsc::error::SendError(p)) => {
                publish_usage_event(&self.js, self.spool.as_ref(), &self.subjects, &p.event).await
            }
        }
    }

    /// Stops taking events, publishes what is queued, and waits until every batch is stored.
    pub async fn close(&self) {
        self.close.notify_one();
        self.task.close();
        self.task.wait().await;
    }
}

/// The batching loop: takes every event queued (up to [`MAX_EVENTS`]), publishes one message per
/// subject, and gathers the next batch while [`IN_FLIGHT`] batches await acknowledgement.
async fn run(mut rx: mpsc::Receiver<Pending>, sink: Sink, subjects: Subjects, close: Arc<Notify>) {
    let mut in_flight = JoinSet::new();
    let mut closing = false;
    loop {
        let first = tokio::select! {
            biased;
            p = rx.recv() => p,
            () = close.notified(), if !closing => {
                closing = true;
                rx.close();
                continue;
            }
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        // Linger (not while closing: shutdown publishes at once), then wait for the batch in
        // flight, then take everything that queued meanwhile.
        let linger = tokio::time::Instant::now() + std::time::Duration::from_millis(LINGER_MS);
        while !closing && batch.len() < MAX_EVENTS {
            match tokio::time::timeout_at(linger, rx.recv()).await {
                Ok(Some(p)) => batch.push(p),
                Ok(None) | Err(_) => break,
            }
        }
        while in_flight.len() >= IN_FLIGHT {
            in_flight.join_next().await;
        }
        while batch.len() < MAX_EVENTS {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        for (subject, group) in by_subject(&subjects, batch) {
            in_flight.spawn(publish_batch(sink.clone(), subject, group));
        }
        while in_flight.try_join_next().is_some() {}
    }
    while in_flight.join_next().await.is_some() {}
}

/// Groups a batch by the subject each event goes to (one per kind).
fn by_subject(subjects: &Subjects, batch: Vec<Pending>) -> HashMap<String, Vec<Pending>> {
    let mut groups: HashMap<String, Vec<Pending>> = HashMap::new();
    for p in batch {
        groups
            .entry(subject_of(subjects, &p.event))
            .or_default()
            .push(p);
    }
    groups
}

/// Where batches go: the stream, else the spool.
#[derive(Clone)]
struct Sink {
    js: async_nats::jetstream::Context,
    spool: Option<Arc<Spool>>,
}

/// The `Nats-Msg-Id` of a batch of several events: `batch:` and 32 hex digits of the SHA-256 of
/// its events' own ids (`<request-id>:<kind>:<attempt>`, in order, one per line).
///
/// It must name every event, not only the first: the same event can be published twice (a batch
/// item run again after its answer was lost publishes its charge again) with different company,
/// and JetStream drops a message whose id it has seen — with an id made of the first event and
/// the count, the second batch and the other events in it were lost.
fn batch_msg_id(events: &[&UsageEvent]) -> String {
    use sha2::{Digest as _, Sha256};
    let mut hash = Sha256::new();
    for e in events {
        hash.update(msg_id_of(e).as_bytes());
        hash.update(b"\n");
    }
    let digest = hash.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("batch:{hex}")
}

/// Publishes one group as a JSON array (a lone event as itself) and tells each producer.
async fn publish_batch(sink: Sink, subject: String, group: Vec<Pending>) {
    let events: Vec<&UsageEvent> = group.iter().map(|p| &p.event).collect();
    let encoded = match events.as_slice() {
        [one] => serde_json::to_vec(one),
        many => serde_json::to_vec(many),
    };
    let stored = match (encoded, group.first()) {
        (Ok(payload), Some(first)) => {
            let msg_id = if group.len() == 1 {
                msg_id_of(&first.event)
            } else {
                batch_msg_id(&events)
            };
            let entries = group
                .iter()
                .map(|p| Entry {
                    subject: subject.clone(),
                    msg_id: msg_id_of(&p.event),
                    event: p.event.clone(),
                })
                .collect();
            store(
                &sink.js,
                sink.spool.as_ref(),
                &subject,
                &msg_id,
                payload,
                entries,
            )
            .await
        }
        (Err(e), _) => {
            tracing::error!(error = %e, "usage events not encodable; dropped");
            false
        }
        (_, None) => true,
    };
    for p in group {
        let _ = p.done.send(stored);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::test_support::{event, messages, server};
    use switchyard_schemas::usage::UsageKind;

    /// Publishes `events` as one batch; returns whether it was stored.
    async fn batch(sink: &Sink, subjects: &Subjects, events: &[&UsageEvent]) -> bool {
        let mut group = Vec::new();
        let mut stored = Vec::new();
        for e in events {
            let (done, rx) = oneshot::channel();
            group.push(Pending {
                event: (*e).clone(),
                done,
            });
            stored.push(rx);
        }
        let subject = subject_of(subjects, events[0]);
        publish_batch(sink.clone(), subject, group).await;
        let mut all = true;
        for rx in stored {
            all &= rx.await.unwrap();
        }
        all
    }

    /// The same event in two different batches (a batch item's charge published again after a
    /// re-run) leaves both batches in the stream, so no other event is lost; the very same batch
    /// again (a retried publish) is dropped by JetStream's duplicate window.
    #[tokio::test]
    async fn a_batch_is_deduplicated_only_against_the_same_events() {
        let (_server, js, mut stream) = server().await;
        let subjects = Subjects::default();
        let sink = Sink { js, spool: None };
        let [a, b, c] = [(); 3].map(|()| event(UsageKind::Charge));
        assert!(batch(&sink, &subjects, &[&a, &b]).await);
        assert!(batch(&sink, &subjects, &[&a, &c]).await);
        assert_eq!(messages(&mut stream).await, 2);
        assert!(batch(&sink, &subjects, &[&a, &b]).await);
        assert_eq!(messages(&mut stream).await, 2);
        let mut stored = Vec::new();
        for seq in 1..=2 {
            let m = stream.get_raw_message(seq).await.unwrap();
            let events: Vec<UsageEvent> = serde_json::from_slice(&m.payload).unwrap();
            stored.extend(events.into_iter().map(|e| e.request_id));
        }
        assert_eq!(
            stored,
            vec![a.request_id, b.request_id, a.request_id, c.request_id]
        );
    }
}
