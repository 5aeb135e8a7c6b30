//! Budgets at the concurrency users run: 1,000 concurrent requests of one tenant's keys through
//! two ingress processes against a tenant budget that allows exactly K of them.

use crate::common::*;
use rust_decimal::Decimal;
use serde_json::json;
use std::time::Duration;
use switchyard_ingress::budget::{Scope, Spend};
use switchyard_schemas::UsageKind;
use switchyard_schemas::tenancy::Budget;

const REQUESTS: usize = 1_000;
/// Requests the budget has room for.
const K: usize = 100;
const OUTPUT_TOKENS: u64 = 50;
const PROMPT: &str = "What is the capital of France?";

fn key(i: usize) -> String {
    format!("sk-load-{i:02}-0123456789abcdef")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_k_of_1000_concurrent_requests_are_admitted_through_two_ingresses() {
    // The mock reports exactly the reserved token counts and the margin is 0, so every settled
    // charge equals its reservation: the admitted count is K whatever the interleaving.
    let prompt_tokens = prompt_tokens(PROMPT);
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(
        &catalog,
        "currency: USD\nas_of: 2026-12-01\nupstream:\n  load-upstream: {input: 10, output: 30}\n\
         standard:\n  test/load: {input: 10, output: 30}\n",
    )
    .unwrap();
    // One request: prompt × $10/M + 50 × $30/M.
    let each = (Decimal::from(prompt_tokens) * Decimal::from(10)
        + Decimal::from(OUTPUT_TOKENS * 30))
        / Decimal::from(1_000_000);
    let limit = each * Decimal::from(K as u64) + each / Decimal::from(2);
    let mock = format!(
        "builtin:mock/x/ttft_ms=200,prompt_tokens={prompt_tokens},completion_tokens={OUTPUT_TOKENS}"
    );
    let keys: Vec<_> = (0..8)
        .map(|i| json!({"id": format!("k{i}"), "tenant": "acme", "key": key(i)}))
        .collect();
    let config = test_config(json!({
        "pricing_file": catalog.display().to_string(),
        "targets": [{"id": "load", "provider": "openai", "base_url": mock, "upstream_model": "load-upstream"}],
        "models": [{"id": "test/load", "targets": ["load"]}],
        "keys": keys,
        "tenants": [{"id": "acme", "budget": {"daily_usd": limit.to_string()}}],
        "budgets": {"safety_margin": 0},
        "timeouts": {"first_frame_ms": 30000, "worker_silence_ms": 30000, "heartbeat_ms": 1000, "total_ms": 120000}
    }));
    let gw = start_billed(config).await;
    let (second, _) = spawn_ingress(&gw).await;
    let bases = [gw.base.clone(), second];

    let body = json!({"model": "test/load", "max_tokens": OUTPUT_TOKENS,
                      "messages": [{"role": "user", "content": PROMPT}]});
    let results = chat_fan_out(&bases, REQUESTS, |i| key(i % 8), &body).await;
    assert_admitted(&results, |r| r.status, K);
    for Answer { status, body, .. } in &results {
        if *status == 429 {
            assert_quota_refused(body, "The daily budget of tenant `acme` would be exceeded");
        } else {
            assert_eq!(body["usage"]["completion_tokens"], OUTPUT_TOKENS);
        }
    }

    // Ledger spend = KV settled spend, to the cent (here: exactly), nothing left held.
    let scope = Scope {
        kind: "tenant",
        id: "acme".into(),
        budget: Budget::default(),
    };
    let spend: Spend = eventually(Duration::from_secs(30), || {
        let (app, scope) = (gw.ingress.clone(), scope.clone());
        async move {
            let s = app.budgets.peek(&scope).await.unwrap();
            (s.held.is_empty() && s.day_usd == each * Decimal::from(K as u64)).then_some(s)
        }
    })
    .await;
    let ledger = gw.ledger.as_ref().unwrap();
    let mut ledger_spend = Decimal::ZERO;
    for answer in results.iter().filter(|r| r.status == 200) {
        let id = request_id(&answer.headers);
        ledger_rows(ledger, id, 2).await;
        ledger_spend += ledger
            .cost_of(id, UsageKind::Charge, 0)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(ledger_spend, each * Decimal::from(K as u64));
    assert_eq!(spend.day_usd, ledger_spend);
    assert_eq!(spend.day_tokens, (prompt_tokens + OUTPUT_TOKENS) * K as u64);
    // Refused requests left no usage record: 2 rows per admitted request.
    assert_eq!(ledger.count().await.unwrap(), 2 * K as u64);
}
