//! Usage queries (the billing side of `GET /v1/usage`) against a real ledger, SQLite and
//! PostgreSQL, priced with the bundled catalog; and one query over NATS through `run`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, reason = "tasks end with their test")]

mod common;

use common::d;

use common::NatsServer;
use std::collections::BTreeMap;
use std::time::Duration;
use switchyard_billing::Ledger;
use switchyard_billing::query::{QueryError, usage as ask_usage};
use switchyard_schemas::ErrorClass;
use switchyard_schemas::subjects::Subjects;
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind, UsageStatus};
use switchyard_schemas::usage_query::{GroupBy, UsageAnswer, UsageQuery, UsageReply, UsageRow};

/// 2025-11-05T00:00:00Z, ms.
const DAY: u64 = 1_762_300_800_000;
const HOUR: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR;
const MINI: &str = "openai/gpt-4o-mini";
const GPT: &str = "openai/gpt-4o";

fn usage(prompt: u64, cached: u64, completion: u64, reasoning: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        cached_tokens: cached,
        cache_write_tokens: 0,
        completion_tokens: completion,
        reasoning_tokens: reasoning,
        ..Default::default()
    }
}

fn charge(ts: u64, tenant: &str, key: &str, model: &str, u: Usage) -> UsageEvent {
    UsageEvent {
        tenant: Some(tenant.into()),
        key_id: Some(key.into()),
        model: model.into(),
        upstream_model: Some(model.trim_start_matches("openai/").into()),
        usage: u,
        ..common::event(UsageKind::Charge, ts)
    }
}

/// Upstream attempt `attempt` of `c` on `target`, `5 * attempt` ms before the charge.
fn upstream(c: &UsageEvent, attempt: u32, target: &str, u: Usage) -> UsageEvent {
    UsageEvent {
        kind: UsageKind::Upstream,
        attempt,
        ts_ms: c.ts_ms - 5 * u64::from(attempt + 1),
        target: Some(target.into()),
        usage: u,
        ..c.clone()
    }
}

/// The ledger's events; each comment gives the cost (upstream) and charge at bundled prices
/// (gpt-4o-mini: input 0.15, cached 0.075, output 0.60; gpt-4o: 2.50, 1.25, 10.00 USD per 1M).
fn events() -> Vec<UsageEvent> {
    let mut ev = Vec::new();
    // A: acme/k1, mini, 01:00. 600 new + 400 cached input, 150 output + 50 reasoning:
    // 0.00009 + 0.00003 + 0.00012 = cost 0.00024, charge 0.00024.
    let a = charge(DAY + HOUR, "acme", "k1", MINI, usage(1000, 400, 200, 50));
    ev.push(upstream(&a, 0, "openai-east", a.usage));
    ev.push(a);
    // B: acme/k2, gpt-4o, 02:00, one fallback. Attempt 0 failed on openai-backup after reading
    // the prompt (cost 0.005), attempt 1 served: cost 0.005 + 0.001; charge 0.006.
    let mut b = charge(DAY + 2 * HOUR, "acme", "k2", GPT, usage(2000, 0, 100, 0));
    b.fallbacks = 1;
    let mut failed = upstream(&b, 0, "openai-backup", usage(2000, 0, 0, 0));
    failed.status = UsageStatus::Error;
    failed.error_class = Some(ErrorClass::Upstream5xx);
    ev.push(failed);
    ev.push(upstream(&b, 1, "openai-east", b.usage));
    ev.push(b);
    // C: beta/k3, mini, next day 03:00, rejected with an error before any upstream call:
    // charge 500 * 0.15 / 1M = 0.000075.
    let mut c = charge(
        DAY + DAY_MS + 3 * HOUR,
        "beta",
        "k3",
        MINI,
        usage(500, 0, 0, 0),
    );
    c.status = UsageStatus::Error;
    c.error_class = Some(ErrorClass::InvalidRequest);
    ev.push(c);
    // D: beta/k3, mini, 04:00, answered from the cache: free (charge 0), usage kept.
    let mut hit = charge(DAY + 4 * HOUR, "beta", "k3", MINI, usage(1000, 0, 200, 0));
    hit.cache_hit = true;
    ev.push(hit);
    // E: acme/k1, gpt-4o, the previous day 23:59:59.999: outside every window below.
    let e = charge(DAY - 1, "acme", "k1", GPT, usage(1000, 0, 1000, 0));
    ev.push(upstream(&e, 0, "openai-east", e.usage));
    ev.push(e);
    ev
}

fn query(from_ms: u64, to_ms: u64, group_by: &[GroupBy]) -> UsageQuery {
    UsageQuery {
        from_ms,
        to_ms,
        group_by: group_by.to_vec(),
        tenant: None,
        key_id: None,
        providers: BTreeMap::new(),
    }
}

/// A row from its group pairs and figures: `[requests, input, cached, output, reasoning]`,
/// `(cost, charge)` and `[cache hits, errors]`.
fn row(
    group: &[(&str, &str)],
    [requests, input, cached, output, reasoning]: [u64; 5],
    (cost, charge): (&str, &str),
    [cache_hits, errors]: [u64; 2],
) -> UsageRow {
    UsageRow {
        group: group
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        requests,
        input_tokens: input,
        cached_input_tokens: cached,
        cache_write_tokens: 0,
        output_tokens: output,
        reasoning_tokens: reasoning,
        cost_usd: d(cost),
        charge_usd: d(charge),
        cache_hits,
        errors,
    }
}

async fn scenario(url: &str) {
    let ledger = Ledger::connect(url).await.unwrap();
    let events = events();
    assert_eq!(
        ledger.insert_batch(&events).await.unwrap(),
        events.len() as u64
    );
    let two_days = (DAY, DAY + 2 * DAY_MS);

    // By model over two days: E (the day before) is not counted.
    let r = ask_usage(&ledger, &query(two_days.0, two_days.1, &[GroupBy::Model]))
        .await
        .unwrap();
    let gpt = row(
        &[("model", GPT)],
        [1, 2000, 0, 100, 0],
        ("0.011", "0.006"),
        [0, 0],
    );
    let mini = row(
        &[("model", MINI)],
        [3, 2100, 400, 350, 50],
        ("0.00024", "0.000315"),
        [1, 1],
    );
    let totals = row(
        &[],
        [4, 4100, 400, 450, 50],
        ("0.01124", "0.006315"),
        [1, 1],
    );
    assert_eq!(
        r,
        UsageReply {
            rows: vec![gpt, mini],
            totals: totals.clone(),
        }
    );

    // By tenant and day: C is on the second day.
    let r = ask_usage(
        &ledger,
        &query(two_days.0, two_days.1, &[GroupBy::Tenant, GroupBy::Day]),
    )
    .await
    .unwrap();
    assert_eq!(
        r.rows,
        vec![
            row(
                &[("tenant", "acme"), ("day", "2025-11-05")],
                [2, 2600, 400, 250, 50],
                ("0.01124", "0.00624"),
                [0, 0]
            ),
            row(
                &[("tenant", "beta"), ("day", "2025-11-05")],
                [1, 1000, 0, 200, 0],
                ("0", "0"),
                [1, 0]
            ),
            row(
                &[("tenant", "beta"), ("day", "2025-11-06")],
                [1, 500, 0, 0, 0],
                ("0", "0.000075"),
                [0, 1]
            ),
        ]
    );
    assert_eq!(r.totals, totals);

    // The window is half-open: [01:00, 02:00) holds A, not B (exactly 02:00) nor E.
    let r = ask_usage(&ledger, &query(DAY + HOUR, DAY + 2 * HOUR, &[]))
        .await
        .unwrap();
    let a = row(&[], [1, 600, 400, 150, 50], ("0.00024", "0.00024"), [0, 0]);
    assert_eq!(
        r,
        UsageReply {
            rows: vec![a.clone()],
            totals: a
        }
    );
    // An empty window: no rows, zero totals.
    let r = ask_usage(
        &ledger,
        &query(DAY + 5 * HOUR, DAY + 5 * HOUR, &[GroupBy::Model]),
    )
    .await
    .unwrap();
    assert!(r.rows.is_empty());
    assert_eq!(r.totals, UsageRow::default());

    // One UTC day equals the daily report of that day.
    let r = ask_usage(&ledger, &query(DAY, DAY + DAY_MS, &[]))
        .await
        .unwrap();
    let report = switchyard_billing::daily_report(&ledger, "2025-11-05")
        .await
        .unwrap();
    assert_eq!(r.totals.requests, report.totals.requests);
    assert_eq!(r.totals.cost_usd, report.totals.cost_usd);
    assert_eq!(r.totals.charge_usd, report.totals.charge_usd);
    assert_eq!(r.totals.input_tokens, report.totals.tokens.new_input);
    assert_eq!(r.totals.cache_hits, report.totals.cache_hits);
    assert_eq!(r.totals.errors, report.totals.errors);

    // Filters: a tenant, a key, and providers by target; hours.
    let mut q = query(two_days.0, two_days.1, &[GroupBy::Provider, GroupBy::Hour]);
    q.tenant = Some("acme".into());
    q.providers = BTreeMap::from([("openai-east".to_owned(), "openai".to_owned())]);
    let r = ask_usage(&ledger, &q).await.unwrap();
    // B's failed attempt was on openai-backup, which the providers map does not name.
    let unknown_b = row(
        &[("provider", "(unknown)"), ("hour", "2025-11-05T02")],
        [0, 0, 0, 0, 0],
        ("0.005", "0"),
        [0, 0],
    );
    let openai_a = row(
        &[("provider", "openai"), ("hour", "2025-11-05T01")],
        [1, 600, 400, 150, 50],
        ("0.00024", "0.00024"),
        [0, 0],
    );
    let openai_b = row(
        &[("provider", "openai"), ("hour", "2025-11-05T02")],
        [1, 2000, 0, 100, 0],
        ("0.006", "0.006"),
        [0, 0],
    );
    assert_eq!(r.rows, vec![unknown_b, openai_a, openai_b]);
    let mut q = query(two_days.0, two_days.1, &[GroupBy::Key]);
    q.key_id = Some("k3".into());
    let r = ask_usage(&ledger, &q).await.unwrap();
    assert_eq!(r.rows.len(), 1);
    assert_eq!(r.rows[0].group["key"], "k3");
    assert_eq!((r.totals.requests, r.totals.charge_usd), (2, d("0.000075")));

    // Invalid queries are answered with an error, not a panic.
    let err = ask_usage(&ledger, &query(2, 1, &[])).await.unwrap_err();
    assert!(matches!(err, QueryError::Invalid(_)), "{err}");
    ledger.close().await;
}

common::on_both_ledgers!(scenario, sqlite_usage_queries, postgres_usage_queries);

/// `run` answers `<prefix>.billing.usage` over NATS, errors included.
#[tokio::test]
async fn queries_over_nats() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let (_dir, ledger) = common::sqlite_ledger().await;
    ledger.insert_batch(&events()).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(switchyard_billing::run(
        client.clone(),
        Subjects::default(),
        ledger.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let ask = |payload: Vec<u8>| {
        let client = client.clone();
        async move {
            let subject = Subjects::default().usage_query();
            // Until the responder has subscribed, NATS answers "no responders".
            for _ in 0..200 {
                match client
                    .request(subject.clone(), payload.clone().into())
                    .await
                {
                    Ok(m) => return serde_json::from_slice::<UsageAnswer>(&m.payload).unwrap(),
                    Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
                }
            }
            panic!("no usage query responder");
        }
    };
    let q = query(DAY, DAY + 2 * DAY_MS, &[GroupBy::Tenant]);
    let UsageAnswer::Ok(reply) = ask(serde_json::to_vec(&q).unwrap()).await else {
        panic!("expected rows");
    };
    let tenants: Vec<(&str, u64)> = reply
        .rows
        .iter()
        .map(|r| (r.group["tenant"].as_str(), r.requests))
        .collect();
    assert_eq!(tenants, vec![("acme", 2), ("beta", 2)]);
    assert_eq!(reply.totals.charge_usd, d("0.006315"));
    let UsageAnswer::Err { error } = ask(b"{\"from_ms\":1}".to_vec()).await else {
        panic!("expected an error");
    };
    assert!(error.contains("to_ms"), "{error}");
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), service)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
