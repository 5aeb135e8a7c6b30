//! The durable JetStream usage stream and the billing consumer on it.
//!
//! The stream is a **work queue** (docs/architecture.md, "Usage stream"): an event stays until
//! the billing consumer acks it, which it does only after the ledger row committed, and is then
//! removed. The ledger is the record; the stream only holds what is not yet stored. Subjects are
//! one per kind (`<prefix>.usage.upstream`, `<prefix>.usage.charge`), so JetStream's
//! per-subject state does not grow with the number of requests.
//!
//! Earlier versions used the limits-retention stream [`LEGACY_USAGE_STREAM`] with one subject
//! per request. Retention cannot be changed on an existing stream, so [`ensure_usage_stream`]
//! migrates: it moves the legacy stream off the usage subjects, creates [`USAGE_STREAM`], copies
//! every legacy event the legacy `billing` consumer has not acknowledged into it (same
//! `Nats-Msg-Id`; the ledger's primary key absorbs any event copied twice), and deletes the
//! legacy stream once every copy is acknowledged.

use crate::BillingError;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::context::{GetStreamErrorKind, PublishAckFuture};
use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType, Stream};
use async_nats::jetstream::{self, ErrorCode};
use futures::StreamExt as _;
use std::time::Duration;
use switchyard_schemas::UsageEvent;
use switchyard_schemas::subjects::{BILLING_CONSUMER, LEGACY_USAGE_STREAM, Subjects, USAGE_STREAM};

/// Age limit of the usage stream: none (`Duration::ZERO`). An event leaves the stream when
/// billing has stored it; dropping an unbilled event for age would lose revenue silently.
pub const USAGE_MAX_AGE: Duration = Duration::ZERO;
/// Window in which the stream drops a re-publish carrying an already seen `Nats-Msg-Id`: 30 s.
/// It covers a producer's own retries (5 attempts, at most 5 s acknowledgement timeout each);
/// later re-publishes (spool drains) are absorbed by the ledger's primary key. nats-server keeps
/// every id of the window in memory (about 0.3 KB each, two per request), so a longer window
/// costs memory at high rates: 2 min at 1,000 requests/s held ~80 MB.
pub const USAGE_DUPLICATE_WINDOW: Duration = Duration::from_secs(30);
/// Most bytes the usage stream holds: 1 GiB (about 1.5 million events, over 10 minutes of a
/// billing outage at 1,000 requests/s). Beyond it new publishes are refused (discard `new`), so
/// the publishers retry and then spool to their local disk: nothing is dropped.
pub const USAGE_MAX_BYTES: i64 = 1 << 30;
/// JetStream said the stream's reserved size does not fit its store (error 10047).
fn storage_exceeded(e: &async_nats::jetstream::context::CreateStreamError) -> bool {
    matches!(
        e.kind(),
        async_nats::jetstream::context::CreateStreamErrorKind::JetStream(j)
            if j.error_code() == async_nats::jetstream::ErrorCode::STORAGE_RESOURCES_EXCEEDED
    )
}

/// Legacy events copied before their acknowledgements are awaited, per step.
const COPY_CHUNK: usize = 256;

/// The configuration of the usage stream [`USAGE_STREAM`]: file storage, work-queue retention,
/// subjects `<prefix>.usage.>`, at most [`USAGE_MAX_BYTES`] with discard `new`, no age limit,
/// de-duplication by `Nats-Msg-Id` over [`USAGE_DUPLICATE_WINDOW`].
pub fn usage_stream_config(subjects: &Subjects) -> Config {
    Config {
        name: USAGE_STREAM.to_owned(),
        description: Some(
            "Switchyard usage events not yet stored by billing (work queue)".to_owned(),
        ),
        subjects: vec![subjects.usage_all()],
        retention: RetentionPolicy::WorkQueue,
        storage: StorageType::File,
        max_age: USAGE_MAX_AGE,
        max_bytes: USAGE_MAX_BYTES,
        discard: DiscardPolicy::New,
        duplicate_window: USAGE_DUPLICATE_WINDOW,
        ..Default::default()
    }
}

/// Gets the usage stream, creating it with [`usage_stream_config`] if it does not exist, after
/// moving a legacy stream ([`LEGACY_USAGE_STREAM`]) off the usage subjects; then migrates what
/// the legacy stream still holds unbilled (module docs). An existing [`USAGE_STREAM`] is
/// returned as it is; a warning is logged when it does not capture `<prefix>.usage.>`. A failed
/// copy is logged and retried at the next call (the legacy stream is kept until it succeeds).
pub async fn ensure_usage_stream(
    js: &jetstream::Context,
    subjects: &Subjects,
) -> Result<Stream, BillingError> {
    let legacy = legacy_stream(js).await?;
    if let Some(legacy) = &legacy {
        retire(js, legacy, subjects).await?;
    }
    let stream = match js
        .get_or_create_stream(switchyard_schemas::replicas::stream(usage_stream_config(
            subjects,
        )))
        .await
    {
        Ok(s) => s,
        // nats-server reserves `max_bytes` against its JetStream store when the stream is
        // created; on a nearly full disk 1 GiB does not fit. Without the cap the stream is still
        // bounded by the server's store limit, where publishes are refused and producers spool.
        Err(e) if storage_exceeded(&e) => {
            tracing::warn!(error = %e, max_bytes = USAGE_MAX_BYTES,
                "no room to reserve the usage stream's size; creating it bounded only by the JetStream store");
            let mut config = usage_stream_config(subjects);
            config.max_bytes = -1;
            js.get_or_create_stream(switchyard_schemas::replicas::stream(config))
                .await?
        }
        Err(e) => return Err(e.into()),
    };
    let wanted = subjects.usage_all();
    let captured = &stream.cached_info().config.subjects;
    if !captured.contains(&wanted) {
        tracing::warn!(
            stream = USAGE_STREAM,
            ?captured,
            %wanted,
            "existing usage stream does not capture the usage subjects"
        );
    }
    if let Some(legacy) = legacy {
        match migrate(js, &legacy, subjects).await {
            Ok(copied) => tracing::info!(
                from = LEGACY_USAGE_STREAM,
                to = USAGE_STREAM,
                copied,
                "legacy usage stream migrated and deleted"
            ),
            Err(e) => tracing::error!(error = %e, from = LEGACY_USAGE_STREAM,
                "migrating the legacy usage stream failed; retried at the next start"),
        }
    }
    Ok(stream)
}

/// The legacy stream, if it exists.
async fn legacy_stream(js: &jetstream::Context) -> Result<Option<Stream>, BillingError> {
    match js.get_stream(LEGACY_USAGE_STREAM).await {
        Ok(s) => Ok(Some(s)),
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                Ok(None)
            }
            _ => Err(BillingError::Migration(format!(
                "looking up {LEGACY_USAGE_STREAM}: {e}"
            ))),
        },
    }
}

/// The subject a retired legacy stream is moved to: outside `<prefix>.usage.>` (its second
/// token is `usage-retired`), and never published to.
fn retired_subject(subjects: &Subjects) -> String {
    format!("{}.usage-retired", subjects.prefix())
}

/// Moves the legacy stream off the usage subjects (two streams cannot capture the same
/// subjects), so the new stream can be created and captures everything published from now on.
/// A publish in the moment between the two gets "no responders" and is retried or spooled.
async fn retire(
    js: &jetstream::Context,
    legacy: &Stream,
    subjects: &Subjects,
) -> Result<(), BillingError> {
    let retired = retired_subject(subjects);
    let mut config = legacy.cached_info().config.clone();
    if config.subjects == [retired.clone()] {
        return Ok(()); // a previous start retired it already
    }
    config.subjects = vec![retired];
    js.update_stream(&config).await?;
    tracing::warn!(
        stream = LEGACY_USAGE_STREAM,
        "legacy usage stream (limits retention, a subject per request) retired; migrating"
    );
    Ok(())
}

/// Copies every legacy event after the legacy `billing` consumer's ack floor (all of them when
/// it has none) into the new stream, then deletes the legacy stream. Returns the events copied.
async fn migrate(
    js: &jetstream::Context,
    legacy: &Stream,
    subjects: &Subjects,
) -> Result<u64, BillingError> {
    let err =
        |what: &str, e: &dyn std::fmt::Display| BillingError::Migration(format!("{what}: {e}"));
    let state = js
        .get_stream(LEGACY_USAGE_STREAM)
        .await
        .map_err(|e| err("stream info", &e))?
        .cached_info()
        .state
        .clone();
    let start = match legacy.consumer_info(BILLING_CONSUMER).await {
        Ok(info) => info.ack_floor.stream_sequence + 1,
        Err(_) => state.first_sequence,
    }
    .max(state.first_sequence);
    let last = state.last_sequence;
    let mut copied = 0;
    if state.messages > 0 && start <= last {
        let consumer = legacy
            .create_consumer(pull::OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: start,
                },
                ..Default::default()
            })
            .await
            .map_err(|e| err("legacy reader", &e))?;
        if consumer.cached_info().num_pending == 0 {
            return delete_legacy(js).await.map(|()| 0);
        }
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| err("legacy reader", &e))?;
        let mut acks: Vec<PublishAckFuture> = Vec::with_capacity(COPY_CHUNK);
        loop {
            let Some(next) = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .map_err(|e| err("reading the legacy stream", &e))?
            else {
                break;
            };
            let message = next.map_err(|e| err("reading the legacy stream", &e))?;
            let info = message.info().map_err(|e| err("legacy message info", &e))?;
            // Nothing is published to the retired stream: caught up when nothing is pending.
            let done = info.pending == 0 || info.stream_sequence >= last;
            acks.push(copy(js, subjects, &message).await?);
            if acks.len() >= COPY_CHUNK || done {
                copied += confirm(std::mem::take(&mut acks)).await?;
            }
            if done {
                break;
            }
        }
        copied += confirm(acks).await?;
    }
    delete_legacy(js).await.map(|()| copied)
}

/// Deletes the legacy stream (already gone: another billing instance migrated it meanwhile).
async fn delete_legacy(js: &jetstream::Context) -> Result<(), BillingError> {
    match js.delete_stream(LEGACY_USAGE_STREAM).await {
        Ok(_) => Ok(()),
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                Ok(())
            }
            _ => Err(BillingError::Migration(format!(
                "deleting the legacy stream: {e}"
            ))),
        },
    }
}

/// Publishes one legacy message into the new stream: an event on its per-kind subject with its
/// `Nats-Msg-Id` (kept from the header, else derived); anything else unchanged (billing
/// terminates it, as it would have).
async fn copy(
    js: &jetstream::Context,
    subjects: &Subjects,
    message: &jetstream::Message,
) -> Result<PublishAckFuture, BillingError> {
    let event = serde_json::from_slice::<UsageEvent>(&message.payload).ok();
    let subject = event.as_ref().map_or_else(
        || message.subject.to_string(),
        |e| subjects.usage_kind(e.kind.as_str()),
    );
    let mut headers = async_nats::HeaderMap::new();
    let kept = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .map(|v| v.as_str().to_owned());
    let derived = event
        .as_ref()
        .map(|e| format!("{}:{}:{}", e.request_id, e.kind.as_str(), e.attempt));
    if let Some(id) = kept.or(derived) {
        headers.insert("Nats-Msg-Id", id.as_str());
    }
    js.publish_with_headers(subject, headers, message.payload.clone())
        .await
        .map_err(|e| BillingError::Migration(format!("copying a legacy event: {e}")))
}

/// Awaits the acknowledgements of copied events; returns how many there were.
async fn confirm(acks: Vec<PublishAckFuture>) -> Result<u64, BillingError> {
    let n = acks.len() as u64;
    for ack in acks {
        ack.await
            .map_err(|e| BillingError::Migration(format!("copied event not acknowledged: {e}")))?;
    }
    Ok(n)
}

/// The durable pull consumer `billing` on the usage stream: explicit acks (an ack removes the
/// event from the work queue), delivery from the first stored event, up to `max_ack_pending`
/// delivered-but-unacked events, redelivery of an unacked event after `ack_wait`.
pub fn billing_consumer_config(max_ack_pending: i64, ack_wait: Duration) -> pull::Config {
    pull::Config {
        durable_name: Some(BILLING_CONSUMER.to_owned()),
        description: Some("Switchyard billing ledger writer".to_owned()),
        ack_policy: AckPolicy::Explicit,
        deliver_policy: DeliverPolicy::All,
        ack_wait,
        max_ack_pending,
        ..Default::default()
    }
}

/// Gets the durable consumer `billing` on `stream`, creating it with
/// [`billing_consumer_config`] if it does not exist.
pub async fn ensure_billing_consumer(
    stream: &Stream,
    max_ack_pending: i64,
    ack_wait: Duration,
) -> Result<PullConsumer, BillingError> {
    let config = billing_consumer_config(max_ack_pending, ack_wait);
    Ok(stream
        .get_or_create_consumer(BILLING_CONSUMER, config)
        .await?)
}
