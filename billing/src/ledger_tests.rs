//! Tests of the ledger (SQLite in a temp dir or in memory).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use switchyard_schemas::usage::{Usage, UsageStatus};

fn event(kind: UsageKind, attempt: u32) -> UsageEvent {
    UsageEvent {
        audit: None,
        finish_reason: None,
        request_id: Uuid::now_v7(),
        kind,
        attempt,
        ts_ms: 1_700_000_000_123,
        tenant: Some("acme".into()),
        key_id: None,
        model: "gpt-4o".into(),
        target: Some("openai-east".into()),
        upstream_model: Some("gpt-4o-2024-08-06".into()),
        usage: Usage {
            prompt_tokens: 1200,
            cached_tokens: 1000,
            cache_write_tokens: 0,
            completion_tokens: 300,
            reasoning_tokens: 100,
            ..Default::default()
        },
        estimated: true,
        status: UsageStatus::Error,
        error_class: Some(ErrorClass::RateLimited),
        ttft_ms: Some(250),
        latency_ms: 1234,
        fallbacks: 2,
        cache_hit: false,
        budget_owed: None,
        batch_id: None,
    }
}

#[tokio::test]
async fn sqlite_roundtrip_and_idempotent_insert() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/nested/dir/ledger.db", dir.path().display());
    let ledger = Ledger::connect(&url).await.unwrap();
    assert_eq!(ledger.backend(), Backend::Sqlite);
    let a = event(UsageKind::Upstream, 1);
    let mut b = a.clone();
    b.kind = UsageKind::Charge;
    b.attempt = 0;
    b.error_class = None;
    b.status = UsageStatus::Ok;
    b.ttft_ms = None;
    b.estimated = false;
    b.cache_hit = true;
    // Duplicate inside one batch and across batches: stored once.
    assert_eq!(
        ledger
            .insert_batch(&[a.clone(), b.clone(), a.clone()])
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        ledger.insert_batch(&[b.clone(), a.clone()]).await.unwrap(),
        0
    );
    assert_eq!(ledger.count().await.unwrap(), 2);
    assert_eq!(
        ledger.usage_for(a.request_id).await.unwrap(),
        vec![b.clone(), a.clone()]
    );
    let raw = ledger
        .raw_for(a.request_id, UsageKind::Upstream, 1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(serde_json::from_str::<UsageEvent>(&raw).unwrap(), a);
    ledger.close().await;

    // Reopening runs the (already applied) migrations again and sees the same rows.
    let ledger = Ledger::connect(&url).await.unwrap();
    assert_eq!(ledger.count().await.unwrap(), 2);
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(ledger.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn unstorable_event_rejects_whole_batch() {
    let ledger = Ledger::connect("sqlite::memory:").await.unwrap();
    let ok = event(UsageKind::Upstream, 0);
    let mut huge = event(UsageKind::Upstream, 0);
    huge.usage.prompt_tokens = u64::MAX;
    let mut nul = event(UsageKind::Charge, 0);
    nul.model = "gpt\0".into();
    for bad in [huge, nul] {
        let err = ledger.insert_batch(&[ok.clone(), bad]).await.unwrap_err();
        assert!(matches!(err, BillingError::InvalidEvent { .. }), "{err}");
    }
    assert_eq!(ledger.count().await.unwrap(), 0);
}

/// A batch spanning several statements, with a key repeated (different counts) inside it and
/// one already stored: each key is stored once, the first occurrence wins, and only newly
/// stored events get lines.
#[tokio::test]
async fn large_batch_with_duplicates_stores_each_key_once() {
    let ledger = Ledger::connect("sqlite::memory:").await.unwrap();
    let priced = |prompt| {
        let mut e = event(UsageKind::Upstream, 0);
        e.upstream_model = Some("gpt-4o".into());
        e.usage = Usage {
            prompt_tokens: prompt,
            completion_tokens: 10,
            ..Usage::default()
        };
        e
    };
    let old = priced(5);
    assert_eq!(
        ledger
            .insert_batch(std::slice::from_ref(&old))
            .await
            .unwrap(),
        1
    );
    let mut batch: Vec<UsageEvent> = (0..300).map(|i| priced(100 + i)).collect();
    let mut twin = batch[7].clone();
    twin.usage.prompt_tokens = 999_999;
    batch.insert(290, twin);
    let mut replay = old.clone();
    replay.usage.prompt_tokens = 777;
    batch.push(replay);
    assert_eq!(ledger.insert_batch(&batch).await.unwrap(), 300);
    assert_eq!(ledger.count().await.unwrap(), 301);
    let first = &ledger.usage_for(batch[7].request_id).await.unwrap()[0];
    assert_eq!(first.usage.prompt_tokens, 107);
    assert_eq!(ledger.usage_for(old.request_id).await.unwrap()[0], old);
    let lines: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger_lines")
        .fetch_one(ledger.pool())
        .await
        .unwrap();
    // new_input and output per event.
    assert_eq!(lines, 2 * 301);
    let amount = ledger
        .lines_of(batch[7].request_id, UsageKind::Upstream, 0)
        .await
        .unwrap();
    assert_eq!(amount[0].1, 107);
}

#[tokio::test]
async fn rejects_unknown_url() {
    let err = Ledger::connect("mysql://x").await.unwrap_err();
    assert!(matches!(err, BillingError::UnsupportedUrl(_)));
}

#[test]
fn sqlite_url_gets_create_mode() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/a/b.db", dir.path().display());
    let (out, mem) = prepare_sqlite_url(&url).unwrap();
    assert_eq!(out, format!("{url}?mode=rwc"));
    assert!(!mem);
    assert!(dir.path().join("a").is_dir());
    let (out, _) = prepare_sqlite_url(&format!("{url}?mode=ro")).unwrap();
    assert!(out.ends_with("?mode=ro"));
    assert!(prepare_sqlite_url("sqlite::memory:").unwrap().1);
}

/// FC-11 through the ledger: the upstream row costs $0.005615 and carries one line per
/// billing type; a replay of the same event adds neither rows nor lines.
#[tokio::test]
async fn fc11_cost_and_lines_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/ledger.db", dir.path().display());
    let ledger = Ledger::connect(&url).await.unwrap();
    let mut e = event(UsageKind::Upstream, 0);
    e.upstream_model = Some("gpt-4o".into());
    e.usage = Usage {
        prompt_tokens: 2006,
        cached_tokens: 1920,
        completion_tokens: 300,
        ..Usage::default()
    };
    assert_eq!(ledger.insert_batch(&[e.clone()]).await.unwrap(), 1);
    assert_eq!(ledger.insert_batch(&[e.clone()]).await.unwrap(), 0);
    let cost = ledger
        .cost_of(e.request_id, UsageKind::Upstream, 0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cost.to_string(), "0.005615");
    let lines = ledger
        .lines_of(e.request_id, UsageKind::Upstream, 0)
        .await
        .unwrap();
    let got: Vec<(String, u64, String)> = lines
        .into_iter()
        .map(|(t, n, a)| (t, n, a.normalize().to_string()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("cached_input".to_string(), 1920, "0.0024".to_string()),
            ("new_input".to_string(), 86, "0.000215".to_string()),
            ("output".to_string(), 300, "0.003".to_string()),
        ]
    );
    // An unpriced model stores NULL cost, not zero.
    let mut u = event(UsageKind::Upstream, 0);
    u.upstream_model = Some("unknown-model".into());
    ledger.insert_batch(&[u.clone()]).await.unwrap();
    assert_eq!(
        ledger
            .cost_of(u.request_id, UsageKind::Upstream, 0)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn a_corrupt_amount_is_an_error_not_zero() {
    let ledger = Ledger::connect("sqlite::memory:").await.unwrap();
    let mut e = event(UsageKind::Upstream, 0);
    e.upstream_model = Some("gpt-4o".into());
    ledger.insert_batch(&[e.clone()]).await.unwrap();
    let id = e.request_id.to_string();
    let corrupt = |sql: &'static str| {
        let (ledger, id) = (ledger.clone(), id.clone());
        async move {
            let q = sqlx::query(sql).bind(id);
            q.execute(ledger.pool()).await.unwrap();
        }
    };
    let (rid, kind) = (e.request_id, UsageKind::Upstream);
    corrupt("UPDATE usage_events SET cost_usd = 'x1' WHERE request_id = $1").await;
    corrupt("UPDATE ledger_lines SET amount_usd = 'y2' WHERE request_id = $1 AND billing_type = 'output'").await;
    let bad = |what: &str| {
        format!("corrupt ledger row: {what} of {id}: Invalid decimal: unknown character")
    };
    let err = ledger.cost_of(rid, kind, 0).await.unwrap_err();
    assert_eq!(err.to_string(), bad("cost_usd `x1`"));
    let err = ledger.lines_of(rid, kind, 0).await.unwrap_err();
    assert_eq!(err.to_string(), bad("amount_usd `y2`"));
    corrupt("UPDATE ledger_lines SET amount_usd = '0.003', tokens = -1 WHERE request_id = $1")
        .await;
    let err = ledger.lines_of(rid, kind, 0).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "corrupt ledger row: tokens = -1 out of range"
    );
}
