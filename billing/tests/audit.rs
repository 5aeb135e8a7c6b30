//! The audit log on a real ledger, SQLite and PostgreSQL: one `audit_log` row per stored
//! `charge` event (written in the usage transaction, none for `upstream`, none on replay),
//! page queries with every filter and exact cursor pagination, and retention deleting exactly
//! the expired rows in batches.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use switchyard_billing::Ledger;
use switchyard_billing::audit::{PURGE_BATCH, page, purge_expired};
use switchyard_schemas::ErrorClass;
use switchyard_schemas::audit::{AuditAttempt, AuditInfo, AuditQuery};
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind, UsageStatus};
use uuid::Uuid;

/// 2025-11-05T00:00:00Z, ms.
const T0: u64 = 1_762_300_800_000;
const DAY_MS: u64 = 86_400_000;

fn charge(ts: u64, key: &str, model: &str, status: UsageStatus, http: u16) -> UsageEvent {
    UsageEvent {
        tenant: Some(format!("tenant-of-{key}")),
        key_id: Some(key.into()),
        model: model.into(),
        usage: Usage {
            prompt_tokens: 1000,
            completion_tokens: 100,
            ..Usage::default()
        },
        status,
        error_class: (status != UsageStatus::Ok).then_some(ErrorClass::InvalidRequest),
        ttft_ms: Some(120),
        latency_ms: 450,
        fallbacks: 1,
        audit: Some(Box::new(AuditInfo {
            front_door: Some("openai".into()),
            http_status: Some(http),
            finish_reason: Some("stop".into()),
            error_code: None,
            overhead_ms: Some(3),
            client_ip: Some("127.0.0.1".into()),
            user_agent: Some("ua/1".into()),
            client_request_id: Some("req-1".into()),
            attempts: vec![AuditAttempt {
                target: "dead".into(),
                upstream_model: "gpt-4o".into(),
                error_class: ErrorClass::Network,
                error: "connection refused".into(),
            }],
            cache_outcome: Some("miss".into()),
            request_body: Some("[{\"role\":\"user\"}]".into()),
            response_body: Some("hi".into()),
        })),
        ..common::event(UsageKind::Charge, ts)
    }
}

async fn audit_count(ledger: &Ledger) -> i64 {
    common::count_rows(ledger, "audit_log").await
}

async fn scenario(url: &str) {
    let ledger = Ledger::connect(url).await.unwrap();
    let a = charge(T0, "k1", "openai/gpt-4o", UsageStatus::Ok, 200);
    let b = charge(T0 + 10, "k2", "openai/gpt-4o", UsageStatus::Error, 400);
    let c = charge(T0 + 20, "k1", "openai/gpt-4o-mini", UsageStatus::Ok, 200);
    let d = charge(T0 + 20, "k1", "openai/gpt-4o", UsageStatus::Ok, 200);
    let mut up = a.clone();
    up.kind = UsageKind::Upstream;
    up.audit = None;
    // One audit row per charge, none for the upstream row; a replay adds none.
    let stored = ledger
        .insert_batch(&[a.clone(), b.clone(), up.clone(), c.clone(), a.clone()])
        .await
        .unwrap();
    assert_eq!(stored, 4);
    ledger.insert_batch(&[d.clone(), b.clone()]).await.unwrap();
    assert_eq!(audit_count(&ledger).await, 4);
    // Bodies are in audit_log only, not in the usage row's raw JSON.
    let raw = ledger
        .raw_for(a.request_id, UsageKind::Charge, 0)
        .await
        .unwrap()
        .unwrap();
    assert!(!raw.contains("request_body") && raw.contains("\"front_door\":\"openai\""));

    // Every field of one record.
    let all = page(&ledger, &AuditQuery::default()).await.unwrap();
    let ids: Vec<String> = all.data.iter().map(|r| r.request_id.clone()).collect();
    // Newest first; equal times (c, d) by request id descending.
    let mut same_ms = vec![c.request_id.to_string(), d.request_id.to_string()];
    same_ms.sort();
    same_ms.reverse();
    let mut want_ids = same_ms.clone();
    want_ids.extend([b.request_id.to_string(), a.request_id.to_string()]);
    assert_eq!(ids, want_ids);
    assert_eq!(all.next_cursor, None);
    let ra = all.data.last().unwrap();
    let want = serde_json::json!({
        "request_id": a.request_id.to_string(), "ts_ms": T0, "front_door": "openai",
        "key_id": "k1", "tenant": "tenant-of-k1", "model": "openai/gpt-4o",
        "target": "openai-east", "upstream_model": "gpt-4o", "status": "ok", "http_status": 200,
        "error_class": null, "error_code": null, "finish_reason": "stop", "fallbacks": 1,
        "attempts": [{"target": "dead", "upstream_model": "gpt-4o",
                      "error_class": "network", "error": "connection refused"}],
        "prompt_tokens": 1000, "completion_tokens": 100, "cached_tokens": 0,
        // gpt-4o: 1000 × $2.50/M + 100 × $10/M, cost and sale price alike.
        "cost_usd": "0.0035", "charge_usd": "0.0035", "ttft_ms": 120, "latency_ms": 450,
        "overhead_ms": 3, "cache_hit": false, "cache_outcome": "miss", "client_ip": "127.0.0.1", "user_agent": "ua/1",
        "client_request_id": "req-1", "request_body": "[{\"role\":\"user\"}]",
        "response_body": "hi"
    });
    assert_eq!(serde_json::to_value(ra).unwrap(), want);
    assert_eq!(all.data[1].cost_usd, None, "b has no upstream row");

    // Filters.
    let ids_of = |q: AuditQuery| {
        let ledger = ledger.clone();
        async move {
            page(&ledger, &q)
                .await
                .unwrap()
                .data
                .into_iter()
                .map(|r| r.request_id)
                .collect::<Vec<_>>()
        }
    };
    let s = |u: &Uuid| u.to_string();
    let q = |f: fn(&mut AuditQuery)| {
        let mut q = AuditQuery::default();
        f(&mut q);
        q
    };
    assert_eq!(
        ids_of(q(|q| q.key_id = Some("k2".into()))).await,
        vec![s(&b.request_id)]
    );
    assert_eq!(
        ids_of(q(|q| q.tenant = Some("tenant-of-k1".into()))).await,
        vec![same_ms[0].clone(), same_ms[1].clone(), s(&a.request_id)]
    );
    assert_eq!(
        ids_of(q(|q| q.model = Some("openai/gpt-4o-mini".into()))).await,
        vec![s(&c.request_id)]
    );
    assert_eq!(
        ids_of(q(|q| q.status = Some("error".into()))).await,
        vec![s(&b.request_id)]
    );
    assert_eq!(
        ids_of(q(|q| q.status = Some("400".into()))).await,
        vec![s(&b.request_id)]
    );
    assert_eq!(
        ids_of(q(|q| {
            q.from_ms = Some(T0 + 10);
            q.to_ms = Some(T0 + 20);
        }))
        .await,
        vec![s(&b.request_id)]
    );

    // Cursor pagination: pages of 1 walk the same order, the last page has no cursor.
    let mut cursor = None;
    let mut walked = Vec::new();
    loop {
        let p = page(
            &ledger,
            &AuditQuery {
                limit: Some(1),
                cursor: cursor.clone(),
                ..AuditQuery::default()
            },
        )
        .await
        .unwrap();
        walked.extend(p.data.into_iter().map(|r| r.request_id));
        match p.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(walked, ids);
    let bad = page(
        &ledger,
        &AuditQuery {
            cursor: Some("nope".into()),
            ..AuditQuery::default()
        },
    )
    .await;
    assert!(bad.is_err());

    // Retention: rows older than 30 days before `now` go, exactly; in batches of 1,000.
    let old: Vec<UsageEvent> = (0..(PURGE_BATCH as u64 + 5))
        .map(|i| {
            charge(
                T0 - 40 * DAY_MS + i,
                "old",
                "openai/gpt-4o",
                UsageStatus::Ok,
                200,
            )
        })
        .collect();
    ledger.insert_batch(&old).await.unwrap();
    assert_eq!(audit_count(&ledger).await, 4 + PURGE_BATCH + 5);
    let now = T0 + DAY_MS;
    assert_eq!(
        purge_expired(&ledger, now, 30).await.unwrap(),
        PURGE_BATCH as u64 + 5
    );
    assert_eq!(purge_expired(&ledger, now, 30).await.unwrap(), 0);
    assert_eq!(
        purge_expired(&ledger, now + 400 * DAY_MS, 0).await.unwrap(),
        0
    );
    assert_eq!(audit_count(&ledger).await, 4);
    // The usage rows stay.
    assert_eq!(ledger.count().await.unwrap(), 5 + old.len() as u64);

    // A request refused before admission (an `audit` event): one audit row, no usage row, and
    // a replay adds none; it counts as inserted once.
    let mut refused = charge(T0 + 30, "k2", "nope", UsageStatus::Error, 404);
    refused.kind = UsageKind::Audit;
    refused.usage = Usage::default();
    refused.error_class = Some(ErrorClass::NotFound);
    refused.target = None;
    refused.upstream_model = None;
    if let Some(a) = refused.audit.as_mut() {
        a.error_code = Some("model_not_found".into());
        a.attempts.clear();
        a.request_body = None;
        a.response_body = None;
    }
    let twice = [refused.clone(), refused.clone()];
    assert_eq!(ledger.insert_batch(&twice).await.unwrap(), 1);
    assert_eq!(ledger.insert_batch(&twice).await.unwrap(), 0);
    assert_eq!(ledger.count().await.unwrap(), 5 + old.len() as u64);
    assert!(
        ledger
            .usage_for(refused.request_id)
            .await
            .unwrap()
            .is_empty()
    );
    let top = page(&ledger, &AuditQuery::default()).await.unwrap();
    let r = &top.data[0];
    assert_eq!(r.request_id, refused.request_id.to_string());
    assert_eq!(
        (r.status.as_str(), r.http_status, r.error_class.as_deref()),
        ("error", Some(404), Some("not_found"))
    );
    assert_eq!(r.error_code.as_deref(), Some("model_not_found"));
    assert_eq!(
        (r.charge_usd.as_deref(), r.cost_usd.as_deref()),
        (None, None)
    );
    ledger.close().await;
}

/// A stored cost that does not parse fails the page: a record's `cost_usd` is never a sum that
/// silently left one out.
#[tokio::test]
async fn a_corrupt_cost_fails_the_page() {
    let ledger = Ledger::connect("sqlite::memory:").await.unwrap();
    let a = charge(T0, "k1", "openai/gpt-4o", UsageStatus::Ok, 200);
    let mut up = a.clone();
    up.kind = UsageKind::Upstream;
    up.audit = None;
    ledger.insert_batch(&[a.clone(), up]).await.unwrap();
    let id = a.request_id.to_string();
    sqlx::query(
        "UPDATE usage_events SET cost_usd = 'x' WHERE request_id = $1 AND kind = 'upstream'",
    )
    .bind(&id)
    .execute(ledger.pool())
    .await
    .unwrap();
    let err = page(&ledger, &AuditQuery::default()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("corrupt ledger row: cost_usd `x` of {id}: Invalid decimal: unknown character")
    );
}

common::on_both_ledgers!(
    scenario,
    sqlite_audit_rows_pages_and_retention,
    postgres_audit_rows_pages_and_retention
);
