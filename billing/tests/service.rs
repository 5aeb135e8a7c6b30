//! End-to-end tests of the billing consumer against a real nats-server, on SQLite and PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, reason = "tasks end with their test")]

mod common;

use async_nats::jetstream::{self, stream::Stream};
use common::wait_until;
use std::time::Duration;
use switchyard_billing::stream::{USAGE_DUPLICATE_WINDOW, USAGE_MAX_AGE, USAGE_MAX_BYTES};
use switchyard_billing::{BillingError, BillingService, BillingStats, Ledger};
use switchyard_schemas::subjects::{BILLING_CONSUMER, Subjects, USAGE_STREAM};
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind, UsageStatus};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(20);

fn event(kind: UsageKind, attempt: u32, prompt: u64, completion: u64) -> UsageEvent {
    UsageEvent {
        attempt,
        key_id: Some("key-1".into()),
        model: "gpt-4o-mini".into(),
        target: Some("openai-primary".into()),
        upstream_model: Some("gpt-4o-mini-2024-07-18".into()),
        usage: Usage {
            prompt_tokens: prompt,
            cached_tokens: prompt / 2,
            cache_write_tokens: 7,
            completion_tokens: completion,
            reasoning_tokens: completion / 3,
            ..Default::default()
        },
        ttft_ms: Some(120),
        latency_ms: 900,
        ..common::event(kind, 1_750_000_000_000 + prompt)
    }
}

/// Publishes `payload` on `subject`; returns the stream sequence.
async fn publish_raw(js: &jetstream::Context, subject: String, payload: Vec<u8>) -> u64 {
    js.publish(subject, payload.into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence
}

async fn publish(js: &jetstream::Context, subjects: &Subjects, event: &UsageEvent) -> u64 {
    let subject = subjects.usage_kind(event.kind.as_str());
    publish_raw(js, subject, serde_json::to_vec(event).unwrap()).await
}

/// A running service and the means to stop it.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<BillingStats, BillingError>>,
}

impl Running {
    fn spawn(client: async_nats::Client, ledger: Ledger) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let service = BillingService::new(client, Subjects::default(), ledger);
        let task = tokio::spawn(service.run(async move {
            let _ = stopped.await;
        }));
        Self { stop, task }
    }

    async fn shutdown(self) -> BillingStats {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    }
}

/// Waits until the billing consumer has acked (or terminated) everything up to `seq`.
async fn wait_consumed(stream: &Stream, seq: u64) {
    wait_until(
        &format!("billing consumer to ack through sequence {seq}"),
        WAIT,
        || async {
            match stream.consumer_info(BILLING_CONSUMER).await {
                Ok(info) => {
                    info.ack_floor.stream_sequence >= seq
                        && info.num_ack_pending == 0
                        && info.num_pending == 0
                }
                Err(_) => false,
            }
        },
    )
    .await;
}

async fn wait_rows(ledger: &Ledger, rows: u64) {
    wait_until(&format!("{rows} ledger rows"), WAIT, || async {
        ledger.count().await.unwrap() == rows
    })
    .await;
}

/// 3 distinct events plus a redelivered duplicate → exactly 3 rows; a restart that replays the
/// whole stream (fresh durable consumer) on the same ledger still leaves exactly 3 rows.
async fn replay_scenario(ledger_url: &str) {
    let (_nats, client, js, subjects, mut stream) = common::usage_stream().await;
    let config = &stream.info().await.unwrap().config;
    assert_eq!(config.name, USAGE_STREAM);
    assert_eq!(config.subjects, vec!["sy.usage.>".to_owned()]);
    assert_eq!(config.max_age, USAGE_MAX_AGE);
    assert_eq!(config.duplicate_window, USAGE_DUPLICATE_WINDOW);
    assert_eq!(config.storage, jetstream::stream::StorageType::File);
    assert_eq!(
        config.retention,
        jetstream::stream::RetentionPolicy::WorkQueue
    );
    assert_eq!(config.max_bytes, USAGE_MAX_BYTES);
    assert_eq!(config.discard, jetstream::stream::DiscardPolicy::New);

    let charge = event(UsageKind::Charge, 0, 1500, 320);
    let mut upstream1 = event(UsageKind::Upstream, 1, 1400, 0);
    upstream1.request_id = charge.request_id;
    upstream1.status = UsageStatus::Error;
    upstream1.error_class = Some(switchyard_schemas::ErrorClass::Timeout);
    upstream1.ttft_ms = None;
    let other = event(UsageKind::Upstream, 0, 42, 17);
    for e in [&charge, &upstream1, &other] {
        publish(&js, &subjects, e).await;
    }
    // The same event again, as a publisher retry after the dedup window would store it.
    let last = publish(&js, &subjects, &upstream1).await;
    assert_eq!(last, 4);

    let ledger = Ledger::connect(ledger_url).await.unwrap();
    let service = Running::spawn(client.clone(), ledger.clone());
    wait_rows(&ledger, 3).await;
    wait_consumed(&stream, last).await;
    assert_eq!(ledger.count().await.unwrap(), 3);
    // Work queue: what billing stored and acked has left the stream.
    assert_eq!(stream.info().await.unwrap().state.messages, 0);

    let stored = ledger.usage_for(other.request_id).await.unwrap();
    assert_eq!(stored.len(), 1);
    let usage = stored[0].usage;
    assert_eq!(usage.prompt_tokens, 42);
    assert_eq!(usage.cached_tokens, 21);
    assert_eq!(usage.cache_write_tokens, 7);
    assert_eq!(usage.completion_tokens, 17);
    assert_eq!(usage.reasoning_tokens, 5);
    assert_eq!(stored[0], other);
    // Ordered by kind then attempt: charge before upstream.
    assert_eq!(
        ledger.usage_for(charge.request_id).await.unwrap(),
        vec![charge.clone(), upstream1.clone()]
    );

    let stats = service.shutdown().await;
    assert_eq!(
        (stats.inserted, stats.duplicates, stats.terminated),
        (3, 1, 0)
    );
    ledger.close().await;

    // Restart on the same ledger with a fresh durable consumer, and every event delivered again
    // (the stream no longer holds stored events, so the replay is a re-publish of all four, as
    // spool drains after the duplicate window would do).
    stream.delete_consumer(BILLING_CONSUMER).await.unwrap();
    let mut last = 0;
    for e in [&charge, &upstream1, &other, &upstream1] {
        last = publish(&js, &subjects, e).await;
    }
    let ledger = Ledger::connect(ledger_url).await.unwrap();
    let service = Running::spawn(client.clone(), ledger.clone());
    wait_consumed(&stream, last).await;
    let stats = service.shutdown().await;
    assert_eq!(
        (stats.inserted, stats.duplicates),
        (0, 4),
        "replay must not insert"
    );
    assert_eq!(ledger.count().await.unwrap(), 3);
    ledger.close().await;
}

#[tokio::test]
async fn sqlite_ledger_counts_each_event_once_across_redelivery_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/data/billing.db", dir.path().display());
    replay_scenario(&url).await;
}

#[tokio::test]
async fn postgres_ledger_counts_each_event_once_across_redelivery_and_replay() {
    common::on_postgres(|url| async move { replay_scenario(&url).await }).await;
}

#[tokio::test]
async fn stream_drops_republish_with_same_msg_id() {
    let (_nats, _, js, subjects, _) = common::usage_stream().await;
    let e = event(UsageKind::Charge, 0, 1, 1);
    let subject = subjects.usage_kind("charge");
    let mut acks = Vec::new();
    for _ in 0..2 {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("charge.{}.0", e.request_id).as_str());
        let payload = serde_json::to_vec(&e).unwrap().into();
        let ack = js
            .publish_with_headers(subject.clone(), headers, payload)
            .await
            .unwrap();
        acks.push(ack.await.unwrap());
    }
    assert!(!acks[0].duplicate);
    assert!(acks[1].duplicate);
    assert_eq!(acks[0].sequence, acks[1].sequence);
}

#[tokio::test]
async fn malformed_messages_are_terminated_and_consumer_keeps_going() {
    let (_nats, client, js, subjects, stream) = common::usage_stream().await;

    // Not JSON at all, then JSON that is a UsageEvent but cannot be stored (count > i64::MAX).
    publish_raw(
        &js,
        subjects.usage("upstream", "garbage"),
        b"{not json".to_vec(),
    )
    .await;
    let mut huge = event(UsageKind::Upstream, 0, 1, 1);
    huge.usage.prompt_tokens = u64::MAX;
    let bad = publish(&js, &subjects, &huge).await;

    let (_dir, ledger) = common::sqlite_ledger().await;
    let service = Running::spawn(client.clone(), ledger.clone());
    wait_consumed(&stream, bad).await;
    assert_eq!(ledger.count().await.unwrap(), 0);

    // The consumer is still running: a good event after the bad ones is stored.
    let good = event(UsageKind::Charge, 0, 10, 20);
    let last = publish(&js, &subjects, &good).await;
    wait_rows(&ledger, 1).await;
    wait_consumed(&stream, last).await;
    assert_eq!(ledger.usage_for(good.request_id).await.unwrap(), vec![good]);

    // Terminated, not redelivered.
    let info = stream.consumer_info(BILLING_CONSUMER).await.unwrap();
    assert_eq!(info.num_redelivered, 0);
    assert_eq!(info.num_ack_pending, 0);
    let stats = service.shutdown().await;
    assert_eq!(
        (stats.inserted, stats.terminated, stats.failed_batches),
        (1, 2, 0)
    );
}

/// A charge event carrying a budget settlement ingress could not write (`budget_owed`): billing
/// stores the row and adds the charge to each scope exactly once, also when the event arrives
/// twice (a producer's retry with another message id, or a redelivery).
#[tokio::test]
async fn owed_budget_settlements_are_applied_once() {
    let (_nats, client, js, subjects, stream) = common::usage_stream().await;
    let (_dir, ledger) = common::sqlite_ledger().await;
    let running = Running::spawn(client.clone(), ledger.clone());
    let mut charge = event(UsageKind::Charge, 0, 100, 50);
    charge.budget_owed = Some(switchyard_schemas::usage::BudgetOwed {
        scopes: vec!["key.k1".into(), "tenant.acme".into()],
        usd: "0.0125".parse().unwrap(),
        tokens: 150,
    });
    publish(&js, &subjects, &charge).await;
    let seq = publish(&js, &subjects, &charge).await;
    wait_consumed(&stream, seq).await;
    wait_rows(&ledger, 1).await;
    let budgets = switchyard_budgets::BudgetStore::connect(&js, "test").await;
    for scope in ["key.k1", "tenant.acme"] {
        let s = budgets.peek(scope).await.unwrap();
        assert_eq!(
            (s.day_usd, s.day_tokens),
            ("0.0125".parse().unwrap(), 150),
            "{scope}"
        );
    }
    let stats = running.shutdown().await;
    assert_eq!((stats.inserted, stats.duplicates), (1, 1));
}
