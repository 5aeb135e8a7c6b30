//! The budget store against a real nats-server: exactness under contention between holders,
//! fail-closed on an unreadable entry, idempotent late settlement.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use rust_decimal::Decimal;
use switchyard_budgets::{BudgetStore, Demand, ReserveError, Unavailable};
use switchyard_schemas::tenancy::Budget;

fn usd(s: &str) -> Decimal {
    s.parse().unwrap()
}

async fn stores(n: usize) -> (switchyard_natsd::NatsServer, Vec<BudgetStore>) {
    let nats = switchyard_natsd::NatsServer::start_temp().unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let c = async_nats::connect(nats.url()).await.unwrap();
        let js = async_nats::jetstream::new(c);
        out.push(BudgetStore::connect(&js, &format!("holder-{i}")).await);
    }
    (nats, out)
}

const FAR: u64 = u64::MAX / 2;

/// 2 holders × 1,000 concurrent reservations of $0.01 against $2.505: exactly 250 admitted,
/// none unavailable; settling them all leaves exactly the settled spend and nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_holders_admit_exactly_what_fits() {
    let (_nats, stores) = stores(2).await;
    let budget = Budget {
        daily_usd: Some(usd("2.505")),
        ..Budget::default()
    };
    let demand = Demand {
        usd: usd("0.01"),
        tokens: 10,
    };
    let calls = (0..2_000).map(|i| {
        let (store, budget) = (stores[i % 2].clone(), budget.clone());
        async move {
            let r = store.reserve("tenant.acme", &budget, demand, FAR).await;
            (i % 2, r)
        }
    });
    let results = futures::future::join_all(calls).await;
    let ok: Vec<usize> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(h, _)| *h)
        .collect();
    let unavailable = results
        .iter()
        .filter(|(_, r)| matches!(r, Err(ReserveError::Unavailable(_))))
        .count();
    assert_eq!((ok.len(), unavailable), (250, 0));
    let held = stores[0].peek("tenant.acme").await.unwrap();
    assert_eq!(held.held_total().usd, usd("2.50"));

    // Settle every admitted reservation at $0.004: spend $1.00, nothing held.
    let settles = ok.iter().map(|h| {
        let store = stores[*h].clone();
        async move {
            let actual = Demand {
                usd: usd("0.004"),
                tokens: 4,
            };
            store.settle("tenant.acme", demand, actual).await
        }
    });
    for r in futures::future::join_all(settles).await {
        r.unwrap();
    }
    let s = stores[1].peek("tenant.acme").await.unwrap();
    assert_eq!((s.day_usd, s.day_tokens), (usd("1.000"), 1000));
    assert!(s.held.is_empty(), "{:?}", s.held);
}

#[tokio::test]
async fn an_unreadable_entry_fails_closed() {
    let (nats, stores) = stores(1).await;
    let c = async_nats::connect(nats.url()).await.unwrap();
    let kv = async_nats::jetstream::new(c)
        .get_key_value(switchyard_budgets::BUDGETS_BUCKET)
        .await
        .unwrap();
    kv.put("key.broken", "{not json".into()).await.unwrap();
    let r = stores[0]
        .reserve("key.broken", &Budget::default(), Demand::default(), FAR)
        .await;
    assert!(
        matches!(r, Err(ReserveError::Unavailable(Unavailable(m))) if m.contains("unreadable"))
    );
}

#[tokio::test]
async fn a_late_settlement_counts_once() {
    let (_nats, stores) = stores(1).await;
    let actual = Demand {
        usd: usd("0.25"),
        tokens: 100,
    };
    for _ in 0..3 {
        stores[0]
            .settle_late("tenant.acme", "req-1", actual)
            .await
            .unwrap();
    }
    let s = stores[0].peek("tenant.acme").await.unwrap();
    assert_eq!((s.day_usd, s.day_tokens), (usd("0.25"), 100));
}

/// Far from the limit, holders admit from their leases: 2 holders × 500 reservations one
/// after the other (no group commit can merge them) are all admitted with far fewer KV writes
/// than requests; once settled and idle, each holder returns its spare room, leaving exactly
/// the settled spend and nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_admit_without_a_write_per_request() {
    let (nats, stores) = stores(2).await;
    let budget = Budget {
        daily_usd: Some(usd("1000")),
        ..Budget::default()
    };
    let demand = Demand {
        usd: usd("0.01"),
        tokens: 10,
    };
    let holders = stores.iter().map(|store| {
        let (store, budget) = (store.clone(), budget.clone());
        async move {
            for _ in 0..500 {
                store
                    .reserve("tenant.acme", &budget, demand, FAR)
                    .await
                    .unwrap();
            }
            let settles = (0..500).map(|_| store.settle("tenant.acme", demand, demand));
            for r in futures::future::join_all(settles).await {
                r.unwrap();
            }
        }
    });
    futures::future::join_all(holders).await;
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let kv = js.get_key_value("SY_BUDGETS").await.unwrap();
    let writes = kv.entry("tenant.acme").await.unwrap().unwrap().revision;
    assert!(writes <= 60, "{writes} KV writes for 1,000 reservations");
    // Idle holders return their spare within RENEW_EVERY (waited on, not slept).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let s = stores[0].peek("tenant.acme").await.unwrap();
        if s.held.is_empty() {
            assert_eq!((s.day_usd, s.day_tokens), (usd("10.00"), 10_000));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "spare not returned: {:?}",
            s.held
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
