//! The durable JetStream usage stream and the billing consumer on it.

use crate::BillingError;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::{Config, RetentionPolicy, StorageType, Stream};
use std::time::Duration;
use switchyard_schemas::subjects::{BILLING_CONSUMER, Subjects, USAGE_STREAM};

/// How long the usage stream keeps events: 7 days.
pub const USAGE_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// Window in which the stream drops a re-publish carrying an already seen `Nats-Msg-Id`: 2 min.
pub const USAGE_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The configuration of the usage stream `SY_USAGE`: file storage, limits retention, subjects
/// `<prefix>.usage.>`, events kept [`USAGE_MAX_AGE`], de-duplication by `Nats-Msg-Id` over
/// [`USAGE_DUPLICATE_WINDOW`].
pub fn usage_stream_config(subjects: &Subjects) -> Config {
    Config {
        name: USAGE_STREAM.to_owned(),
        description: Some("Switchyard usage events, consumed by billing".to_owned()),
        subjects: vec![subjects.usage_all()],
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        max_age: USAGE_MAX_AGE,
        duplicate_window: USAGE_DUPLICATE_WINDOW,
        ..Default::default()
    }
}

/// Gets the usage stream, creating it with [`usage_stream_config`] if it does not exist. An
/// existing stream is returned as it is (its configuration is not changed); a warning is logged
/// when it does not capture `<prefix>.usage.>`.
pub async fn ensure_usage_stream(
    js: &async_nats::jetstream::Context,
    subjects: &Subjects,
) -> Result<Stream, BillingError> {
    let stream = js
        .get_or_create_stream(usage_stream_config(subjects))
        .await?;
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
    Ok(stream)
}

/// The durable pull consumer `billing` on the usage stream: explicit acks, delivery from the
/// first stored event, up to `max_ack_pending` delivered-but-unacked events, redelivery of an
/// unacked event after `ack_wait`.
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
