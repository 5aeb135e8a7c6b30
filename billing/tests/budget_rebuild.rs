//! Budget state rebuilt from the ledger (issue 16, item 7): with the `SY_BUDGETS` bucket new (lost
//! and re-created), the billing consumer's start-up writes each key's and tenant's spend of the
//! current windows from the charge rows (cache hits $0 and no tokens; last month's rows not
//! counted); an entry an ingress created first gets the spend from before the bucket added once;
//! a seeded entry is kept unless the rebuild overwrites.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, reason = "tasks end with their test")]

mod common;

use common::NatsServer;
use rust_decimal::Decimal;
use std::str::FromStr;
use std::time::Duration;
use switchyard_billing::budget_rebuild::{rebuild, rebuild_if_new_bucket};
use switchyard_billing::{BillingService, Ledger};
use switchyard_budgets::BudgetStore;
use switchyard_budgets::Demand;
use switchyard_schemas::now_ms;
use switchyard_schemas::pricing::Catalog;
use switchyard_schemas::subjects::Subjects;
use switchyard_schemas::tenancy::Budget;
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
    assert_eq!(store.rebuilt_for().await.unwrap(), None);
    let done = rebuild(&ledger, &store, now, false).await.unwrap();
    let created = store.created_ms().await.unwrap();
    assert_eq!(store.rebuilt_for().await.unwrap(), Some(created));
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
    assert!(again.written.is_empty() && again.merged.is_empty());
    assert_eq!(again.kept.len(), 3);
    let forced = rebuild(&ledger, &store, now, true).await.unwrap();
    assert_eq!(forced.written.len(), 3);
}

fn usd(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

async fn ledger_with(dir: &std::path::Path, events: &[UsageEvent]) -> Ledger {
    let catalog = Catalog::parse(
        "test",
        "currency: USD\nupstream: {}\nstandard:\n  gpt-t: {input: 2, output: 10}\n",
    )
    .unwrap();
    let ledger = Ledger::connect(&format!("sqlite://{}/l.db?mode=rwc", dir.display()))
        .await
        .unwrap()
        .with_catalog(catalog);
    ledger.insert_batch(events).await.unwrap();
    ledger
}

/// What an ingress does with a budgeted request: reserve, then settle `actual` ($0.003 and
/// 1,100 tokens: one `charge(…, 1000, 100, …)`).
async fn live_request(store: &BudgetStore, scope: &str) {
    let budget = Budget {
        monthly_usd: Some(usd("10")),
        ..Budget::default()
    };
    let reserved = Demand {
        usd: usd("0.01"),
        tokens: 5_000,
    };
    let actual = Demand {
        usd: usd("0.003"),
        tokens: 1_100,
    };
    store
        .reserve(scope, &budget, reserved, now_ms() + 60_000)
        .await
        .unwrap();
    store.settle(scope, reserved, actual).await.unwrap();
}

/// The race of a lost bucket: ingress settles live requests into the new, empty bucket before
/// billing rebuilds it. The rebuild adds the ledger's spend from before the bucket to the entry
/// the ingress created, once; the live request's own charge row (dated after the bucket) is
/// not added a second time.
#[tokio::test]
async fn an_entry_an_ingress_created_first_gets_the_earlier_spend_once() {
    let dir = tempfile::tempdir().unwrap();
    let now = now_ms();
    // Before the loss: two requests of k1 ($0.006, 2,200 tokens).
    let ledger = ledger_with(
        dir.path(),
        &[
            charge(now - 2_000, "k1", 1000, 100, false),
            charge(now - 1_000, "k1", 1000, 100, false),
        ],
    )
    .await;
    let nats = NatsServer::start();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let ingress = BudgetStore::connect(&js, "ingress-1").await;
    let created = ingress.created_ms().await.unwrap();
    // After it: one live request, settled into the new entry and charged in the ledger.
    live_request(&ingress, "key.k1").await;
    ingress.close().await;
    ledger
        .insert_batch(&[charge(created + 1, "k1", 1000, 100, false)])
        .await
        .unwrap();
    let billing = BudgetStore::connect(&js, "billing").await;
    let live = billing.peek("key.k1").await.unwrap();
    assert_eq!((live.month_usd, live.from_ledger), (usd("0.003"), false));

    let done = rebuild(&ledger, &billing, now_ms(), false).await.unwrap();
    assert_eq!(done.merged, ["key.k1"]);
    assert_eq!(done.written, ["tenant.acme"]);
    let k1 = billing.peek("key.k1").await.unwrap();
    assert_eq!(
        (k1.month_usd, k1.day_usd, k1.day_tokens, k1.from_ledger),
        (usd("0.009"), usd("0.009"), 3_300, true)
    );
    // The tenant had no entry: all three charges.
    assert_eq!(
        billing.peek("tenant.acme").await.unwrap().month_usd,
        usd("0.009")
    );
    // Once: a second rebuild keeps it.
    let again = rebuild(&ledger, &billing, now_ms(), false).await.unwrap();
    assert_eq!(again.kept, ["key.k1", "tenant.acme"]);
    assert_eq!(
        billing.peek("key.k1").await.unwrap().month_usd,
        usd("0.009")
    );
    // And the periodic check does nothing for a bucket already rebuilt.
    assert_eq!(
        rebuild_if_new_bucket(&ledger, &billing).await.unwrap(),
        None
    );
    // An older binary that rewrote the entry without its flag (a rolling upgrade) does not get
    // it merged twice: the bucket's rebuild is recorded as done.
    let kv = js
        .get_key_value(switchyard_budgets::BUDGETS_BUCKET)
        .await
        .unwrap();
    let unflagged = switchyard_budgets::Spend {
        from_ledger: false,
        ..billing.peek("key.k1").await.unwrap()
    };
    kv.put("key.k1", serde_json::to_vec(&unflagged).unwrap().into())
        .await
        .unwrap();
    let again = rebuild(&ledger, &billing, now_ms(), false).await.unwrap();
    assert!(again.merged.is_empty(), "{again:?}");
    assert_eq!(
        billing.peek("key.k1").await.unwrap().month_usd,
        usd("0.009")
    );
}

/// Billing's start-up rebuilds a new bucket even when an ingress wrote to it first (the bucket
/// is not empty then: judging by emptiness skipped the rebuild and lost the earlier spend).
#[tokio::test]
async fn billing_start_up_rebuilds_a_new_bucket_an_ingress_wrote_to_first() {
    let dir = tempfile::tempdir().unwrap();
    let now = now_ms();
    let ledger = ledger_with(dir.path(), &[charge(now - 1_000, "k1", 1000, 100, false)]).await;
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let ingress = BudgetStore::connect(&js, "ingress-1").await;
    live_request(&ingress, "key.k1").await;
    ingress.close().await;

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = BillingService::new(client, Subjects::default(), ledger);
    let running = tokio::task::spawn(service.run(async move {
        let _ = stopped.await;
    }));
    let probe = BudgetStore::connect(&js, "probe").await;
    let created = probe.created_ms().await.unwrap();
    common::wait_until(
        "billing's start-up rebuild",
        Duration::from_secs(20),
        || async { probe.rebuilt_for().await.unwrap() == Some(created) },
    )
    .await;
    let k1 = probe.peek("key.k1").await.unwrap();
    assert_eq!((k1.month_usd, k1.day_tokens), (usd("0.006"), 2_200));
    let _ = stop.send(());
    running.await.unwrap().unwrap();
}
