//! Prepaid tenant balances (docs/budgets.md, "Prepaid balances"): a balance topped up to $0.01
//! admits exactly the requests it covers across two ingress processes (1,000 concurrent), top-ups
//! are idempotent by id, the low-balance threshold downgrades or refuses, and the balance entry
//! is rebuilt from the ledger. SQLite and PostgreSQL.

use crate::common::*;
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::Duration;
use switchyard_ingress::budget::{Scope, Spend};
use switchyard_schemas::tenancy::sha256_hex;

const ADMIN_KEY: &str = "sk-admin-balance-0123456789";
const TENANT_ADMIN: &str = "sk-admin-balance-acme-012345";
const REQUESTS: usize = 1_000;
const PROMPT: &str = "What is the capital of France?";

fn d(s: &str) -> Decimal {
    s.parse().unwrap()
}

fn key(i: usize) -> String {
    format!("sk-balance-{i:02}-0123456789abcdef")
}

/// Prices per 1M tokens: `test/unit` $1 in and out, `test/big` $10 / $30, `test/small` $1 / $3.
fn catalog(dir: &std::path::Path) -> String {
    catalog_file(
        dir,
        "currency: USD\nas_of: 2026-12-01\nupstream:\n  unit-up: {input: 1, output: 1}\n  \
         big-up: {input: 10, output: 30}\n  small-up: {input: 1, output: 3}\n\
         standard:\n  test/unit: {input: 1, output: 1}\n  test/big: {input: 10, output: 30}\n  \
         test/small: {input: 1, output: 3}\n",
    )
}

/// Tenant `acme` with 8 keys and `balance`; the mock reports `prompt` + `completion` tokens.
fn config(
    dir: &std::path::Path,
    balance: Value,
    prompt: u64,
    completion: u64,
) -> switchyard_schemas::config::GatewayConfig {
    let mock =
        format!("builtin:mock/x/ttft_ms=200,prompt_tokens={prompt},completion_tokens={completion}");
    let keys: Vec<_> = (0..8)
        .map(|i| json!({"id": format!("k{i}"), "tenant": "acme", "key": key(i)}))
        .collect();
    test_config(json!({
        "pricing_file": catalog(dir),
        "targets": [
            {"id": "unit", "provider": "openai", "base_url": mock, "upstream_model": "unit-up"},
            {"id": "big", "provider": "openai", "base_url": mock, "upstream_model": "big-up"},
            {"id": "small", "provider": "openai", "base_url": mock, "upstream_model": "small-up"}
        ],
        "models": [
            {"id": "test/unit", "targets": ["unit"]},
            {"id": "test/big", "targets": ["big"], "cheaper": "test/small"},
            {"id": "test/small", "targets": ["small"]}
        ],
        "keys": keys,
        "tenants": [{"id": "acme", "balance": balance}, {"id": "other"}],
        "admin": {"keys": [
            {"id": "ops", "key_sha256": sha256_hex(ADMIN_KEY)},
            {"id": "acme-admin", "key_sha256": sha256_hex(TENANT_ADMIN), "tenant": "acme"}
        ]},
        "budgets": {"safety_margin": 0},
        "timeouts": {"first_frame_ms": 30000, "worker_silence_ms": 30000, "heartbeat_ms": 1000,
                     "total_ms": 120000}
    }))
}

/// `POST /admin/tenants/{tenant}/balance/topups` with `body` (and `Idempotency-Key` when given).
async fn top_up(
    base: &str,
    admin: &str,
    tenant: &str,
    body: Value,
    idem: Option<&str>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/admin/tenants/{tenant}/balance/topups"))
        .bearer_auth(admin)
        .json(&body);
    if let Some(k) = idem {
        req = req.header("idempotency-key", k);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// [`top_up`] by the global admin without an `Idempotency-Key`.
async fn credit(base: &str, tenant: &str, body: Value) -> (u16, Value) {
    top_up(base, ADMIN_KEY, tenant, body, None).await
}

/// `GET /admin/tenants/{tenant}/balance`.
async fn show(base: &str, admin: &str, tenant: &str) -> (u16, Value) {
    get_as(
        format!("{base}/admin/tenants/{tenant}/balance?limit=1000"),
        admin,
    )
    .await
}

/// A chat of `PROMPT` on `model` with bearer `key`.
async fn chat_as(
    base: &str,
    key: &str,
    model: &str,
    max_tokens: u64,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let body = json!({"model": model, "max_tokens": max_tokens,
                      "messages": [{"role": "user", "content": PROMPT}]});
    post_chat_as(base, key, &body).await
}

/// The KV entry `balance.acme` once nothing is held and it has settled `spent`.
/// The budget store's entry of tenant `acme`'s balance, as `app` sees it.
async fn acme_balance(app: &switchyard_ingress::AppState) -> Spend {
    app.budgets.peek(&Scope::balance("acme")).await.unwrap()
}

async fn settled(gw: &Gateway, spent: Decimal) -> Spend {
    eventually(Duration::from_secs(30), || {
        let app = gw.ingress.clone();
        async move {
            let s = acme_balance(&app).await;
            (s.held.is_empty() && s.prepaid.is_some_and(|p| p.spent_usd == spent)).then_some(s)
        }
    })
    .await
}

/// The acceptance test: $0.01 covers exactly K = 100 requests of $0.0001 each (100 tokens at
/// $1/M, margin 0, the mock reporting exactly the reserved tokens), so of 1,000 concurrent
/// requests through two ingress processes exactly 100 are answered 200 and 900 are 429
/// `insufficient_quota`, none 503; the ledger's charges equal the balance deducted, nothing stays
/// reserved, and a rebuild from the ledger yields the same entry.
async fn exactly_what_it_covers(billing_url: Option<String>) {
    const K: usize = 100;
    let prompt = prompt_tokens(PROMPT);
    let output = 100 - prompt;
    let dir = tempfile::tempdir().unwrap();
    let gw = start(Options {
        config: config(dir.path(), json!({"enabled": true}), prompt, output),
        billing: true,
        billing_url,
        ..Options::default()
    })
    .await;
    let (second, _) = spawn_ingress(&gw).await;
    let (status, body) = credit(
        &gw.base,
        "acme",
        json!({"amount_usd": "0.01", "id": "inv-1"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["balance"]["available_usd"], "0.01");
    let bases = [gw.base.clone(), second];
    let body = json!({"model": "test/unit", "max_tokens": output,
                      "messages": [{"role": "user", "content": PROMPT}]});
    let results = chat_fan_out(&bases, REQUESTS, |i| key(i % 8), &body).await;
    assert_admitted(&results, |r| r.status, K);
    for Answer { status, body, .. } in &results {
        if *status == 429 {
            assert_eq!(body["error"]["type"], "insufficient_quota");
            assert_quota_refused(
                body,
                "The prepaid balance of tenant `acme` is insufficient: $",
            );
        } else {
            assert_eq!(body["usage"]["total_tokens"], 100);
        }
    }

    let spend = settled(&gw, d("0.01")).await;
    let p = spend.prepaid.unwrap();
    assert_eq!(
        (p.topped_up_usd, p.spent_usd, p.balance()),
        (d("0.01"), d("0.01"), d("0"))
    );
    // The ledger's charges are the balance deducted, to the cent (here: exactly).
    let ledger = gw.ledger.as_ref().unwrap();
    let view = eventually(Duration::from_secs(30), || {
        let base = gw.base.clone();
        async move {
            let (s, v) = show(&base, ADMIN_KEY, "acme").await;
            assert_eq!(s, 200, "{v}");
            (v["ledger"]["charged_usd"] == "0.01").then_some(v)
        }
    })
    .await;
    assert_eq!(view["balance_usd"], "0");
    assert_eq!(view["reserved_usd"], "0");
    assert_eq!(view["available_usd"], "0");
    assert_eq!(view["topped_up_usd"], "0.01");
    assert_eq!(view["spent_usd"], "0.01");
    assert_eq!(view["ledger"]["topped_up_usd"], "0.01");
    let movements = view["movements"].as_array().unwrap();
    assert_eq!(movements.len(), K + 1);
    let charges: Vec<_> = movements.iter().filter(|m| m["type"] == "charge").collect();
    assert_eq!(charges.len(), K);
    assert!(
        charges
            .iter()
            .all(|m| m["amount_usd"] == "-0.0001" && m["model"] == "test/unit"),
        "{charges:?}"
    );
    assert_eq!(movements.last().unwrap()["type"], "topup");
    assert_eq!(movements.last().unwrap()["id"], "inv-1");
    // Refused requests left no usage record: 2 rows per admitted request.
    assert_eq!(ledger.count().await.unwrap(), 2 * K as u64);

    // Rebuilt from the ledger (top-ups minus charges), the entry is the same.
    let store = gw.ingress.budgets.store();
    let rebuilt = switchyard_billing::budget_rebuild::rebuild(
        ledger,
        store,
        switchyard_schemas::now_ms(),
        true,
    )
    .await
    .unwrap();
    assert!(
        rebuilt.written.contains(&"balance.acme".to_owned()),
        "{rebuilt:?}"
    );
    let after = acme_balance(&gw.ingress).await;
    assert_eq!(after.prepaid, Some(p));
}

sqlite_and_postgres!(
    exactly_what_it_covers: a_one_cent_balance_admits_exactly_what_it_covers_through_two_ingresses,
    a_one_cent_balance_admits_exactly_what_it_covers_postgres,
    flavor = "multi_thread", worker_threads = 2
);

/// Top-ups: refused before the first one, idempotent by id (body `id` or `Idempotency-Key`), 409
/// for an id reused with another amount, gateway-wide admin keys only; each in the ledger and
/// the balance; a rebuild after the entry is lost restores top-ups minus charges.
async fn top_ups(billing_url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let gw = start(Options {
        config: config(dir.path(), json!({"enabled": true}), 100, 100),
        billing: true,
        billing_url,
        ..Options::default()
    })
    .await;
    let k = key(0);
    // No top-up yet: nothing fits.
    let (s, _, body) = chat_as(&gw.base, &k, "test/big", 100).await;
    assert_eq!(s, 429, "{body}");
    assert_quota_refused(
        &body,
        "The prepaid balance of tenant `acme` is insufficient: $0 left, $0 of it",
    );
    // The Anthropic door refuses in its own shape.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/messages", gw.base))
        .header("x-api-key", &k)
        .json(&json!({"model": "test/big", "max_tokens": 100,
                      "messages": [{"role": "user", "content": PROMPT}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert!(
        error_message(&body).starts_with("The prepaid balance of tenant `acme` is insufficient"),
        "{body}"
    );

    let (s, first) = credit(
        &gw.base,
        "acme",
        json!({"amount_usd": 0.5, "id": "inv-7", "note": "PO 7"}),
    )
    .await;
    assert_eq!(s, 201, "{first}");
    assert_eq!(first["object"], "balance.topup");
    assert_eq!(first["id"], "inv-7");
    assert_eq!(first["amount_usd"], "0.5");
    assert_eq!(first["created"], true);
    assert_eq!(first["balance"]["topped_up_usd"], "0.5");
    // The same top-up again records nothing.
    let (s, again) = credit(
        &gw.base,
        "acme",
        json!({"amount_usd": "0.50", "id": "inv-7", "note": "PO 7"}),
    )
    .await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["created"], false);
    assert_eq!(again["balance"]["topped_up_usd"], "0.5");
    let (s, conflict) = credit(&gw.base, "acme", json!({"amount_usd": 0.7, "id": "inv-7"})).await;
    assert_eq!(s, 409, "{conflict}");
    assert_eq!(conflict["error"]["code"], "topup_id_conflict");
    // The Idempotency-Key header names the top-up when the body does not.
    for expect in [201, 200] {
        let (s, v) = top_up(
            &gw.base,
            ADMIN_KEY,
            "acme",
            json!({"amount_usd": 0.25}),
            Some("idem-1"),
        )
        .await;
        assert_eq!(s, expect, "{v}");
        assert_eq!(v["id"], "idem-1");
        assert_eq!(v["balance"]["topped_up_usd"], "0.75");
    }
    // Out of scope or invalid.
    let (s, v) = top_up(
        &gw.base,
        TENANT_ADMIN,
        "acme",
        json!({"amount_usd": 1}),
        None,
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].clone()),
        (403, json!("permission_denied"))
    );
    let (s, _) = credit(&gw.base, "nobody", json!({"amount_usd": 1})).await;
    assert_eq!(s, 404);
    for bad in [
        json!({"amount_usd": 0}),
        json!({"amount_usd": -1}),
        json!({}),
        json!({"amount_usd": 1, "id": "has space"}),
        json!({"amount_usd": 1, "x": 1}),
    ] {
        let (s, v) = top_up(&gw.base, ADMIN_KEY, "acme", bad.clone(), None).await;
        assert_eq!(s, 400, "{bad} → {v}");
    }
    let (s, v) = show(&gw.base, TENANT_ADMIN, "other").await;
    assert_eq!(s, 404, "{v}");
    // The OpenAPI document lists both routes.
    let doc: Value = reqwest::get(format!("{}/openapi.json", gw.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["paths"]["/admin/tenants/{id}/balance"]["get"].is_object());
    assert!(
        doc["paths"]["/admin/tenants/{id}/balance/topups"]["post"]["responses"]["409"].is_object()
    );

    // One request of $0.004 (100 in at $10/M + 100 out at $30/M).
    let (s, _, body) = chat_as(&gw.base, &k, "test/big", 100).await;
    assert_eq!(s, 200, "{body}");
    settled(&gw, d("0.004")).await;
    let v = eventually(Duration::from_secs(30), || {
        let base = gw.base.clone();
        async move {
            let (_, v) = show(&base, TENANT_ADMIN, "acme").await;
            (v["ledger"]["charged_usd"] == "0.004").then_some(v)
        }
    })
    .await;
    assert_eq!(v["balance_usd"], "0.746");
    assert_eq!(v["topped_up_usd"], "0.75");
    let kinds: Vec<_> = v["movements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["type"].as_str().unwrap(),
                m["amount_usd"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [("charge", "-0.004"), ("topup", "0.25"), ("topup", "0.5")]
    );

    // The entry lost: the next balance read restores it from the ledger's totals (top-ups and
    // the charges since the first), never crediting the past spend again...
    let store = gw.ingress.budgets.store();
    let wiped = switchyard_budgets::Spend::default();
    store
        .seed("balance.acme", &wiped, &wiped, true, true)
        .await
        .unwrap();
    let (_, v) = show(&gw.base, ADMIN_KEY, "acme").await;
    assert_eq!(
        (v["balance_usd"].clone(), v["spent_usd"].clone()),
        (json!("0.746"), json!("0.004"))
    );
    // ...and so does billing's rebuild.
    store
        .seed("balance.acme", &wiped, &wiped, true, true)
        .await
        .unwrap();
    let rebuilt = switchyard_billing::budget_rebuild::rebuild(
        gw.ledger.as_ref().unwrap(),
        store,
        switchyard_schemas::now_ms(),
        true,
    )
    .await
    .unwrap();
    assert!(rebuilt.written.contains(&"balance.acme".to_owned()));
    let p = acme_balance(&gw.ingress).await.prepaid.unwrap();
    assert_eq!((p.topped_up_usd, p.spent_usd), (d("0.75"), d("0.004")));
}

sqlite_and_postgres!(
    top_ups: top_ups_are_idempotent_and_in_the_ledger,
    top_ups_are_idempotent_and_in_the_ledger_postgres
);

/// A gateway with billing whose tenant `acme` has `balance` (the mock reports 100 prompt and 100
/// completion tokens) and a $0.50 top-up credited (201).
async fn topped_up_half_a_dollar(dir: &std::path::Path, balance: Value) -> Gateway {
    let gw = start_billed(config(dir, balance, 100, 100)).await;
    let (s, _) = credit(&gw.base, "acme", json!({"amount_usd": 0.5})).await;
    assert_eq!(s, 201);
    gw
}

/// Below `low_balance_usd` with `on_low: downgrade`, `test/big` is served by its `cheaper` model;
/// topped up above the threshold, by itself again.
#[tokio::test]
async fn a_low_balance_downgrades_to_the_cheaper_model() {
    let dir = tempfile::tempdir().unwrap();
    let gw = topped_up_half_a_dollar(
        dir.path(),
        json!({"enabled": true, "low_balance_usd": 1.0, "on_low": "downgrade"}),
    )
    .await;
    let k = key(1);
    let (s, h, body) = chat_as(&gw.base, &k, "test/big", 100).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(h["x-switchyard-target"], "small");
    assert_eq!(h["x-switchyard-downgraded-from"], "test/big");
    assert_eq!(body["model"], "test/big");
    // Charged at the cheaper model's price: 100 × $1/M + 100 × $3/M.
    settled(&gw, d("0.0004")).await;
    let (s, _) = credit(&gw.base, "acme", json!({"amount_usd": 5})).await;
    assert_eq!(s, 201);
    let (s, h, body) = chat_as(&gw.base, &k, "test/big", 100).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(h["x-switchyard-target"], "big");
    assert!(h.get("x-switchyard-downgraded-from").is_none());
}

/// Below `low_balance_usd` with `on_low: refuse`, every request is 429 `insufficient_quota`
/// naming the threshold; topped up above it, admitted.
#[tokio::test]
async fn a_low_balance_refuses_until_topped_up() {
    let dir = tempfile::tempdir().unwrap();
    let gw = topped_up_half_a_dollar(
        dir.path(),
        json!({"enabled": true, "low_balance_usd": "1", "on_low": "refuse"}),
    )
    .await;
    let k = key(2);
    let (s, h, body) = chat_as(&gw.base, &k, "test/small", 100).await;
    assert_eq!(s, 429, "{body}");
    assert!(h.get("retry-after").is_none());
    assert_eq!(body["error"]["code"], "insufficient_quota");
    assert_eq!(
        body["error"]["message"],
        "The prepaid balance of tenant `acme` is below its low-balance threshold: $0.5 left \
         after requests in flight, threshold $1. Top it up (POST /admin/tenants/acme/balance/topups)."
    );
    // Topped up with the CLI (`switchyard balance topup`), twice with the same id: $1 once.
    for _ in 0..2 {
        let args = [
            "balance",
            "topup",
            "--tenant",
            "acme",
            "--amount-usd",
            "1.00",
            "--id",
            "cli-1",
            "--url",
            &gw.base,
        ];
        let v: Value = serde_json::from_str(&cli_ok(&args, ADMIN_KEY).await).unwrap();
        assert_eq!(v["balance"]["topped_up_usd"], "1.5");
    }
    let (s, _, body) = chat_as(&gw.base, &k, "test/small", 100).await;
    assert_eq!(s, 200, "{body}");
    let args = ["balance", "show", "--tenant", "acme", "--url", &gw.base];
    let v: Value = serde_json::from_str(&cli_ok(&args, ADMIN_KEY).await).unwrap();
    assert_eq!(v["tenant"], "acme");
    assert_eq!(v["topped_up_usd"], "1.5");
}

/// Without billing (the ledger's owner) a top-up is not recorded anywhere: 503, nothing credited.
#[tokio::test]
async fn a_top_up_without_billing_is_503_and_credits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let gw = start_config(config(dir.path(), json!({"enabled": true}), 100, 100)).await;
    let (s, v) = credit(&gw.base, "acme", json!({"amount_usd": 1})).await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], "admin_unavailable");
    assert_eq!(
        v["error"]["message"],
        "No billing service is running to record balances."
    );
    let s = acme_balance(&gw.ingress).await;
    assert_eq!(s.prepaid, None);
}

/// A top-up to a tenant without an enabled `balance:` section is recorded (201) but says that
/// admission will not draw on it; an enabled tenant's answer carries no such warning.
#[tokio::test]
async fn a_top_up_to_a_tenant_without_a_balance_section_says_it_is_not_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let gw = start_billed(config(dir.path(), json!({"enabled": true}), 10, 10)).await;
    let (status, body) = credit(&gw.base, "other", json!({"amount_usd": "5", "id": "inv-o"})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["balance"]["enabled"], false);
    assert_eq!(
        body["balance"]["warning"],
        "tenant `other` has no enabled `balance:` section in the config: this balance is \
         recorded but not enforced or drawn on at admission"
    );
    let (status, body) = credit(&gw.base, "acme", json!({"amount_usd": "5", "id": "inv-a"})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["balance"]["enabled"], true);
    assert!(body["balance"].get("warning").is_none(), "{body}");
}
