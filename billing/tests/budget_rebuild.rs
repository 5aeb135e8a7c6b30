//! Budget state rebuilt from the ledger (issue 16, item 7): with the `SY_BUDGETS` bucket empty,
//! the billing consumer's start-up writes each key's and tenant's spend of the current windows
//! from the charge rows (cache hits $0 and no tokens; last month's rows not counted); an entry
//! that exists is kept unless the rebuild overwrites.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::NatsServer;
use rust_decimal::Decimal;
use std::str::FromStr;
use switchyard_billing::Ledger;
use switchyard_billing::budget_rebuild::rebuild;
use switchyard_budgets::BudgetStore;
use switchyard_schemas::now_ms;
use switchyard_schemas::pricing::Catalog;
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind};

fn charge(ts_ms: u64, key: &str, prompt: u64, completion: u64, cache_hit: bool) -> UsageEvent {
    UsageEvent {
        key_id: Some(key.into()),
        model: "gpt-t".into(),
        target: Some("t".into()),
        upstream_model: Some("gpt-t-upstream".into()),
        usage: Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            ..Usage::default()
        },
        ttft_ms: None,
        latency_ms: 10,
        cache_hit,
        ..common::event(UsageKind::Charge, ts_ms)
    }
}

#[tokio::test]
async fn spend_is_rebuilt_from_charge_rows() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::parse(
        "test",
        "currency: USD\nupstream: {}\nstandard:\n  gpt-t: {input: 2, output: 10}\n",
    )
    .unwrap();
    let ledger = Ledger::connect(&format!("sqlite://{}/l.db?mode=rwc", dir.path().display()))
        .await
        .unwrap()
        .with_catalog(catalog);
    let now = now_ms();
    let events = vec![
        // Today: 1,000 in + 100 out = $0.003 each.
        charge(now - 1_000, "k1", 1000, 100, false),
        charge(now - 2_000, "k1", 1000, 100, false),
        charge(now - 3_000, "k2", 1000, 100, false),
        // A cache hit: charged $0, no tokens.
        charge(now - 4_000, "k1", 1000, 100, true),
        // Forty days ago: another month.
        charge(now - 40 * 86_400_000, "k1", 1000, 100, false),
    ];
    ledger.insert_batch(&events).await.unwrap();

    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let store = BudgetStore::connect(&js, "test").await;
    assert!(store.is_empty().await.unwrap());
    let done = rebuild(&ledger, &store, now, false).await.unwrap();
    assert_eq!(done.written, ["key.k1", "key.k2", "tenant.acme"]);
    let k1 = store.peek("key.k1").await.unwrap();
    assert_eq!(k1.day_usd, Decimal::from_str("0.006").unwrap());
    assert_eq!(k1.month_usd, Decimal::from_str("0.006").unwrap());
    assert_eq!(k1.day_tokens, 2200);
    let acme = store.peek("tenant.acme").await.unwrap();
    assert_eq!(acme.day_usd, Decimal::from_str("0.009").unwrap());
    assert_eq!(acme.day_tokens, 3300);
    assert!(acme.held.is_empty());
    // A second rebuild keeps what exists; an overwrite replaces it.
    let again = rebuild(&ledger, &store, now, false).await.unwrap();
    assert!(again.written.is_empty());
    assert_eq!(again.kept.len(), 3);
    let forced = rebuild(&ledger, &store, now, true).await.unwrap();
    assert_eq!(forced.written.len(), 3);
}
