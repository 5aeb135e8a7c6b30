//! Billing lag for `/metrics`: how far the ledger is behind the usage stream.
//!
//! [`BILLING_LAG`] is the age of the oldest usage event billing has not acknowledged, read at
//! each scrape from the JetStream consumer info of the durable `billing` consumer (its pending
//! and ack-pending counts) and the usage stream's first message: the stream is a work queue, so
//! every stored message is one billing has not acknowledged, and the first is the oldest. 0 when
//! nothing is pending. [`BILLING_PENDING`] is that count, messages.

use async_nats::jetstream;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use switchyard_schemas::metrics::{BILLING_LAG, BILLING_PENDING, Registry};
use switchyard_schemas::subjects::{BILLING_CONSUMER, USAGE_STREAM};

/// The lag and pending count now: (seconds, messages); `None` when the stream or the consumer
/// cannot be read (not created yet, NATS unreachable).
pub async fn billing_lag(js: &jetstream::Context) -> Option<(f64, u64)> {
    let mut stream = js.get_stream(USAGE_STREAM).await.ok()?;
    let consumer = stream.consumer_info(BILLING_CONSUMER).await.ok()?;
    let pending = consumer.num_pending + consumer.num_ack_pending as u64;
    let state = stream.info().await.ok()?.state.clone();
    if pending == 0 || state.messages == 0 {
        return Some((0.0, pending));
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let oldest = state.first_timestamp.unix_timestamp_nanos();
    Some(((now - oldest).max(0) as f64 / 1e9, pending))
}

/// Registers the collector that sets [`BILLING_LAG`] and [`BILLING_PENDING`] before each
/// scrape of `registry`.
pub fn add_lag_collector(registry: &Registry, js: jetstream::Context) {
    let lag = registry.gauge(BILLING_LAG, &[]);
    let pending = registry.gauge(BILLING_PENDING, &[]);
    registry.add_collector(Arc::new(move || {
        let (js, lag, pending) = (js.clone(), lag.clone(), pending.clone());
        Box::pin(async move {
            if let Some((seconds, messages)) = billing_lag(&js).await {
                lag.set(seconds);
                pending.set(messages as f64);
            }
        })
    }));
}
