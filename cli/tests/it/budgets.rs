//! API keys, budgets and quotas: authentication, atomic reservation under concurrency (FC-23),
//! settlement with the actual charge, tenant budgets shared by keys, token quotas, and
//! cost-priority routing. Exact values on SQLite and PostgreSQL.

use crate::common::*;
use rust_decimal::Decimal;
use serde_json::{Value, json};
use switchyard_schemas::UsageKind;
use switchyard_schemas::tenancy::Budget;

const FC23_KEY: &str = "sk-fc23-0123456789abcdef";
const OTHER_KEY: &str = "sk-other-0123456789abcdef";

fn d(s: &str) -> Decimal {
    s.parse().unwrap()
}

/// Prices per 1M tokens: `test/fc23` $10 in / $30 out (FC-23), `test/cheap` $1 / $3.
fn write_catalog(dir: &std::path::Path) -> String {
    catalog_file(
        dir,
        "currency: USD\nas_of: 2026-11-29\n\
         upstream:\n  fc23-upstream: {input: 10, output: 30}\n  cheap-upstream: {input: 1, output: 3}\n\
         standard:\n  test/fc23: {input: 10, output: 30}\n  test/cheap: {input: 1, output: 3}\n",
    )
}

/// The FC-23 gateway: the mock waits 500 ms and reports 100 + 100 tokens on every model.
fn config(
    dir: &std::path::Path,
    keys: Value,
    tenants: Value,
) -> switchyard_schemas::config::GatewayConfig {
    let mock = "builtin:mock/x/ttft_ms=500,prompt_tokens=100,completion_tokens=100";
    test_config(json!({
        "pricing_file": write_catalog(dir),
        "targets": [
            {"id": "fc23", "provider": "openai", "base_url": mock, "upstream_model": "fc23-upstream"},
            {"id": "cheap", "provider": "openai", "base_url": mock, "upstream_model": "cheap-upstream"}
        ],
        "models": [
            {"id": "test/fc23", "targets": ["fc23"], "cheaper": "test/cheap"},
            {"id": "test/cheap", "targets": ["cheap"]}
        ],
        "keys": keys,
        "tenants": tenants,
        "timeouts": {"first_frame_ms": 5000, "worker_silence_ms": 5000, "heartbeat_ms": 200}
    }))
}

async fn call(
    base: &str,
    key: Option<&str>,
    model: &str,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({
            "model": model,
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]
        }));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    read_json(req.send().await.unwrap()).await
}

/// FC-23: a key with a $0.010 daily budget and nothing spent; 5 concurrent non-streaming
/// requests with `max_tokens: 100` to a model priced $10 / $30; the mock waits 500 ms and reports
/// 100 + 100 tokens ($0.004 each). Exactly 2 succeed, 3 get 429 `insufficient_quota`, recorded
/// spend is $0.008.
async fn fc23(billing_url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let keys = json!([{"id": "fc23-key", "tenant": "acme", "key": FC23_KEY,
                       "budget": {"daily_usd": "0.010"}}]);
    let gw = start(Options {
        config: config(dir.path(), keys, json!([])),
        billing: true,
        billing_url,
        ..Options::default()
    })
    .await;
    let calls = (0..5).map(|_| call(&gw.base, Some(FC23_KEY), "test/fc23"));
    let results = futures::future::join_all(calls).await;
    let ok: Vec<_> = results.iter().filter(|r| r.0 == 200).collect();
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert_eq!((ok.len(), refused.len()), (2, 3), "{results:?}");
    for (_, _, body) in &refused {
        assert_eq!(body["error"]["type"], "insufficient_quota");
        assert_quota_refused(body, "The daily budget of key `fc23-key` would be exceeded");
    }
    for (_, _, body) in &ok {
        assert_eq!(body["usage"]["prompt_tokens"], 100);
        assert_eq!(body["usage"]["completion_tokens"], 100);
    }

    // The ledger: one charge and one upstream row per success, none for the refusals.
    let ledger = gw.ledger.as_ref().unwrap();
    let mut spend = Decimal::ZERO;
    for (_, headers, _) in &ok {
        let id = request_id(headers);
        let rows = ledger_rows(ledger, id, 2).await;
        assert_eq!(
            rows.iter().filter(|r| r.kind == UsageKind::Charge).count(),
            1
        );
        assert_eq!(rows[0].key_id.as_deref(), Some("fc23-key"));
        assert_eq!(rows[0].tenant.as_deref(), Some("acme"));
        spend += ledger
            .cost_of(id, UsageKind::Charge, 0)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(spend, d("0.008"));
    assert_eq!(ledger.count().await.unwrap(), 4);

    // The budget store settled to the same $0.008 with nothing left reserved.
    let spent = settled_budget(&gw, "key", "fc23-key").await;
    assert_eq!((spent.day_usd, spent.day_tokens), (d("0.008"), 400));
}

sqlite_and_postgres!(
    fc23: fc23_concurrent_requests_never_overshoot_the_daily_budget_sqlite,
    fc23_concurrent_requests_never_overshoot_the_daily_budget_postgres
);

#[tokio::test]
async fn keys_are_required_and_checked_in_each_front_doors_error_shape() {
    let dir = tempfile::tempdir().unwrap();
    let keys = json!([
        {"id": "a", "tenant": "acme", "key": FC23_KEY},
        {"id": "off", "tenant": "acme", "key": OTHER_KEY, "enabled": false}
    ]);
    let gw = start_config(config(dir.path(), keys, json!([]))).await;
    let (status, _, body) = call(&gw.base, None, "test/cheap").await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(error_message(&body).starts_with("You didn't provide an API key"));
    let (status, _, body) = call(&gw.base, Some("sk-wrong-0123456789"), "test/cheap").await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    assert_eq!(
        body["error"]["message"],
        "Incorrect API key provided: sk-w…6789."
    );
    let (status, _, body) = call(&gw.base, Some(OTHER_KEY), "test/cheap").await;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"]["message"],
        "The API key sk-o…cdef is disabled."
    );
    let (status, _, _) = call(&gw.base, Some(FC23_KEY), "test/cheap").await;
    assert_eq!(status, 200);

    // Anthropic front door: `x-api-key`, and Anthropic's error shape.
    let messages = |key: &str| {
        reqwest::Client::new()
            .post(format!("{}/v1/messages", gw.base))
            .header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
            .json(&json!({"model": "test/cheap", "max_tokens": 10,
                          "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let resp = messages("sk-wrong-0123456789").await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "authentication_error");
    assert_eq!(messages(FC23_KEY).await.unwrap().status().as_u16(), 200);

    // Health and metrics stay open.
    let h = reqwest::get(format!("{}/healthz", gw.base)).await.unwrap();
    assert_eq!(h.status().as_u16(), 200);
}

/// A tenant budget is shared by its keys; the reservation is charged to both scopes.
#[tokio::test]
async fn tenant_budget_is_shared_by_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let keys = json!([
        {"id": "k1", "tenant": "acme", "key": FC23_KEY},
        {"id": "k2", "tenant": "acme", "key": OTHER_KEY}
    ]);
    // $0.005: room for one $0.004 request (reserved at ~$0.0034), not two.
    let tenants = json!([{"id": "acme", "budget": {"daily_usd": 0.005}}]);
    let gw = start_config(config(dir.path(), keys, tenants)).await;
    let (s1, _, _) = call(&gw.base, Some(FC23_KEY), "test/fc23").await;
    assert_eq!(s1, 200);
    assert_eq!(
        settled_budget(&gw, "tenant", "acme").await.day_usd,
        d("0.004")
    );
    let (s2, _, body) = call(&gw.base, Some(OTHER_KEY), "test/fc23").await;
    assert_eq!(s2, 429, "{body}");
    assert!(
        error_message(&body)
            .starts_with("The daily budget of tenant `acme` would be exceeded: $0.004 of $0.005"),
        "{body}"
    );
}

/// Token quotas: 200 tokens per request, 300 per minute → the second request is refused with
/// `Retry-After`.
#[tokio::test]
async fn token_quota_per_minute() {
    let dir = tempfile::tempdir().unwrap();
    let keys = json!([{"id": "k1", "tenant": "acme", "key": FC23_KEY,
                       "budget": {"tokens_per_minute": 300}}]);
    let gw = start_config(config(dir.path(), keys, json!([]))).await;
    let (s1, _, _) = call(&gw.base, Some(FC23_KEY), "test/cheap").await;
    assert_eq!(s1, 200);
    let spend = settled_budget(&gw, "key", "k1").await;
    // Unless the clock minute turned in between, the 200 settled tokens count.
    if spend.minute_tokens == 200 {
        let (s2, h, body) = call(&gw.base, Some(FC23_KEY), "test/cheap").await;
        if s2 == 429 {
            assert_eq!(body["error"]["type"], "insufficient_quota");
            assert!(error_message(&body).starts_with(
                "The per-minute token quota of key `k1` would be exceeded: 200 of 300 tokens"
            ));
            let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
            assert!((1..=60).contains(&retry));
        } else {
            // The minute turned between the two calls.
            assert_eq!(s2, 200);
        }
    }
}

/// Cost-priority routing: past `downgrade_at` of the daily budget, `test/fc23` is served by its
/// `cheaper` model, and the response says so.
#[tokio::test]
async fn past_downgrade_share_the_cheaper_model_serves() {
    let dir = tempfile::tempdir().unwrap();
    let keys = json!([{"id": "k1", "tenant": "acme", "key": FC23_KEY,
                       "budget": {"daily_usd": 1, "downgrade_at": 0.003}}]);
    let gw = start_config(config(dir.path(), keys, json!([]))).await;
    let (s1, h1, _) = call(&gw.base, Some(FC23_KEY), "test/fc23").await;
    assert_eq!(s1, 200);
    assert_eq!(h1["x-switchyard-target"], "fc23");
    assert!(h1.get("x-switchyard-downgraded-from").is_none());
    assert_eq!(settled_budget(&gw, "key", "k1").await.day_usd, d("0.004"));
    // $0.004 of $1 = 0.4 % ≥ 0.3 %.
    let (s2, h2, body) = call(&gw.base, Some(FC23_KEY), "test/fc23").await;
    assert_eq!(s2, 200, "{body}");
    assert_eq!(h2["x-switchyard-target"], "cheap");
    assert_eq!(h2["x-switchyard-downgraded-from"], "test/fc23");
    assert_eq!(body["model"], "test/fc23");
}

/// Embeddings are admitted against the same quotas (input estimated at 4 bytes per token).
#[tokio::test]
async fn embeddings_respect_token_quotas() {
    let dir = tempfile::tempdir().unwrap();
    let keys = json!([{"id": "k1", "tenant": "acme", "key": FC23_KEY,
                       "budget": {"tokens_per_day": 10}}]);
    let mut config = config(dir.path(), keys, json!([]));
    config.targets.push(
        serde_json::from_value(json!({"id": "emb", "provider": "openai",
            "base_url": "builtin:mock", "upstream_model": "text-embedding-3-small"}))
        .unwrap(),
    );
    config.models.push(
        serde_json::from_value(json!({"id": "openai/text-embedding-3-small", "targets": ["emb"]}))
            .unwrap(),
    );
    let gw = start_config(config).await;
    let embed = |input: &str| {
        reqwest::Client::new()
            .post(format!("{}/v1/embeddings", gw.base))
            .bearer_auth(FC23_KEY)
            .json(&json!({"model": "openai/text-embedding-3-small", "input": input}))
            .send()
    };
    // 8 bytes → 2 tokens: admitted.
    assert_eq!(embed("two word").await.unwrap().status().as_u16(), 200);
    // 80 bytes → 20 tokens > 10 per day.
    let resp = embed(&"x".repeat(80)).await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "insufficient_quota");
    assert!(
        error_message(&body).starts_with("The daily token quota of key `k1` would be exceeded"),
        "{body}"
    );
}

/// `switchyard budgets rebuild` into a bucket an ingress has already written to (a lost bucket
/// re-created): the scope without an entry is written from every charge, the one the ingress
/// created gets the ledger's spend from before the bucket added ($0.003 + its live $0.003), and
/// a second run keeps both.
#[tokio::test]
async fn budgets_rebuild_command_writes_merges_and_keeps() {
    use switchyard_budgets::{BudgetStore, Demand};
    let dir = tempfile::tempdir().unwrap();
    let nats = switchyard_natsd::NatsServer::start_temp().unwrap();
    let db = format!("sqlite://{}/ledger.db?mode=rwc", dir.path().display());
    let catalog = switchyard_schemas::pricing::Catalog::parse(
        "test",
        "currency: USD\nupstream: {}\nstandard:\n  gpt-t: {input: 2, output: 10}\n",
    )
    .unwrap();
    let ledger = switchyard_billing::Ledger::connect(&db)
        .await
        .unwrap()
        .with_catalog(catalog);
    // 1,000 in + 100 out at $2 / $10 per 1M: $0.003.
    let mut charge = switchyard_schemas::usage::UsageEvent::new(
        uuid::Uuid::now_v7(),
        UsageKind::Charge,
        switchyard_schemas::now_ms() - 1_000,
        "gpt-t",
    );
    charge.key_id = Some("k1".into());
    charge.tenant = Some("acme".into());
    charge.usage.prompt_tokens = 1_000;
    charge.usage.completion_tokens = 100;
    ledger.insert_batch(&[charge]).await.unwrap();

    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let ingress = BudgetStore::connect(&js, "ingress-1").await;
    let (reserved, actual) = (
        Demand {
            usd: d("0.01"),
            tokens: 5_000,
        },
        Demand {
            usd: d("0.003"),
            tokens: 1_100,
        },
    );
    let budget = Budget {
        monthly_usd: Some(d("1")),
        ..Budget::default()
    };
    let until = switchyard_schemas::now_ms() + 60_000;
    ingress
        .reserve("key.k1", &budget, reserved, until)
        .await
        .unwrap();
    ingress.settle("key.k1", reserved, actual).await.unwrap();
    ingress.close().await;

    let args = [
        "budgets",
        "rebuild",
        "--nats-url",
        &nats.url(),
        "--database-url",
        &db,
    ];
    assert_eq!(
        cli_ok(&args, "").await,
        "rebuilt tenant.acme\n\
         merged  key.k1 (the ledger's spend from before the bucket added)\n"
    );
    let k1 = ingress.peek("key.k1").await.unwrap();
    assert_eq!((k1.month_usd, k1.day_tokens), (d("0.006"), 2_200));
    assert_eq!(
        cli_ok(&args, "").await,
        "kept    key.k1 (rebuilt already; --overwrite replaces it)\n\
         kept    tenant.acme (rebuilt already; --overwrite replaces it)\n"
    );
    assert_eq!(ingress.peek("key.k1").await.unwrap().month_usd, d("0.006"));
}
