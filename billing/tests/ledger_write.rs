//! The batched write path (`Ledger::insert_batch`) on SQLite and PostgreSQL: batches spanning
//! several multi-row statements, duplicates inside a batch and across batches, and lines left
//! behind without their event.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use switchyard_billing::Ledger;
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind};

/// A priced upstream event (gpt-4o: one `new_input`, one `cached_input` and one `output` line).
fn event(prompt: u64) -> UsageEvent {
    UsageEvent {
        key_id: Some("k1".into()),
        usage: Usage {
            prompt_tokens: prompt,
            cached_tokens: 10,
            cache_write_tokens: 0,
            completion_tokens: 20,
            reasoning_tokens: 0,
            ..Default::default()
        },
        ..common::event(UsageKind::Upstream, 1_762_300_800_000 + prompt)
    }
}

async fn lines(ledger: &Ledger) -> i64 {
    common::count_rows(ledger, "ledger_lines").await
}

async fn scenario(url: &str) {
    let ledger = Ledger::connect(url).await.unwrap();
    // 1,300 events: statements of 512, 512, 256 and 16 + 4 events, lines in 2,048-row statements.
    let mut batch: Vec<UsageEvent> = (0..1300).map(|i| event(100 + i)).collect();
    // The same key twice in one batch with different counts: the first occurrence is stored.
    let mut twin = batch[3].clone();
    twin.usage.prompt_tokens = 5;
    batch.push(twin);
    assert_eq!(ledger.insert_batch(&batch).await.unwrap(), 1300);
    assert_eq!(ledger.count().await.unwrap(), 1300);
    assert_eq!(lines(&ledger).await, 3 * 1300);
    let stored = ledger.usage_for(batch[3].request_id).await.unwrap();
    assert_eq!(stored, vec![batch[3].clone()]);
    // A replay of the whole batch stores nothing and adds no line.
    assert_eq!(ledger.insert_batch(&batch).await.unwrap(), 0);
    assert_eq!(lines(&ledger).await, 3 * 1300);

    // Lines whose event was deleted by hand: the event's replay stores the event again and keeps
    // the lines (retried with ON CONFLICT DO NOTHING), together with a new event in the batch.
    let orphan = &batch[10];
    sqlx::query("DELETE FROM usage_events WHERE request_id = $1")
        .bind(orphan.request_id.to_string())
        .execute(ledger.pool())
        .await
        .unwrap();
    let fresh = event(70);
    assert_eq!(
        ledger
            .insert_batch(&[orphan.clone(), fresh.clone()])
            .await
            .unwrap(),
        2
    );
    assert_eq!(ledger.count().await.unwrap(), 1301);
    assert_eq!(lines(&ledger).await, 3 * 1301);
    assert_eq!(
        ledger
            .lines_of(fresh.request_id, UsageKind::Upstream, 0)
            .await
            .unwrap()
            .len(),
        3
    );
    ledger.close().await;
}

common::on_both_ledgers!(scenario, sqlite_batched_writes, postgres_batched_writes);
