//! Price dimensions and provider usage shapes end to end (docs/pricing.md): HTTP → ingress → NATS
//! → worker → the mock upstream reporting a given provider-native usage object (`usage=`) →
//! billing → the ledger, asserting the exact cost. FC-34 (Anthropic cache writes by TTL) and
//! FC-35 (Gemini thoughts and implicit caching) on SQLite and PostgreSQL; Bedrock Converse cache
//! reads/writes; OpenAI audio, prediction and service-tier details; the unpriced policy;
//! `switchyard pricing check` and `pricing import`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};
use switchyard_schemas::UsageKind;
use switchyard_schemas::usage::ServiceTier;

/// Test prices per 1M tokens; each client model id names the upstream model of the same id.
const CATALOG: &str = r#"currency: USD
as_of: 2026-11-29
upstream:
  claude-t: {input: 3, cache_write: 3.75, cache_write_1h: 6.00, cached_input: 0.30, output: 15}
  claude-no1h: {input: 3, cache_write: 3.75, cached_input: 0.30, output: 15}
  gem-t: {input: 1.25, cached_input: 0.125, output: 10}
  bedrock-t: {input: 3, cache_write: 3.75, cached_input: 0.30, output: 15}
  gpt-t: {input: 2.5, cached_input: 1.25, output: 10, audio_input: 40, audio_output: 80, priority: {input: 4.25, cached_input: 2.125, output: 17}}
  gpt-tiered: {input: 2, cached_input: 1, output: 8, reasoning: 12, flex: {input: 1, cached_input: 0.5, output: 4}, tiers: [{above_prompt_tokens: 200000, input: 4, cached_input: 2, output: 16}]}
standard:
  claude-t: {input: 3, cache_write: 3.75, cache_write_1h: 6.00, cached_input: 0.30, output: 15}
  claude-no1h: {input: 3, cache_write: 3.75, cached_input: 0.30, output: 15}
  gem-t: {input: 1.25, cached_input: 0.125, output: 10}
  bedrock-t: {input: 3, cache_write: 3.75, cached_input: 0.30, output: 15}
  gpt-t: {input: 2.5, cached_input: 1.25, output: 10, audio_input: 40, audio_output: 80, priority: {input: 4.25, cached_input: 2.125, output: 17}}
  gpt-tiered: {input: 2, cached_input: 1, output: 8, reasoning: 12, flex: {input: 1, cached_input: 0.5, output: 4}, tiers: [{above_prompt_tokens: 200000, input: 4, cached_input: 2, output: 16}]}
"#;

const KEY_BUDGET: &str = "sk-budget-0123456789abcdef";
const KEY_FREE: &str = "sk-free-0123456789abcdef";

/// The FC-34 upstream usage, byte for byte.
const FC34_USAGE: &str = r#"{"input_tokens":12,"cache_creation_input_tokens":9628,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":9628},"output_tokens":20}"#;

fn config(dir: &std::path::Path, extra: Value) -> switchyard_schemas::config::GatewayConfig {
    let aws = json!({"region": "us-east-1", "access_key_id": "AKIDEXAMPLE",
        "secret_access_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"});
    let mut v = json!({
        "pricing_file": catalog_file(dir, CATALOG),
        "targets": [
            {"id": "claude-t", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-t"},
            {"id": "claude-no1h", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-no1h"},
            {"id": "gem-t", "provider": "gemini", "base_url": "builtin:mock", "upstream_model": "gem-t"},
            {"id": "bedrock-t", "provider": "bedrock", "base_url": "builtin:mock", "upstream_model": "bedrock-t", "aws": aws},
            {"id": "gpt-t", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "gpt-t"},
            {"id": "unpriced", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "nowhere-priced"},
            {"id": "gpt-tiered", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "gpt-tiered"}
        ],
        "models": [
            {"id": "claude-t", "targets": ["claude-t"]},
            {"id": "claude-no1h", "targets": ["claude-no1h"]},
            {"id": "gem-t", "targets": ["gem-t"]},
            {"id": "bedrock-t", "targets": ["bedrock-t"]},
            {"id": "gpt-t", "targets": ["gpt-t"]},
            {"id": "test/unpriced", "targets": ["unpriced"]},
            {"id": "gpt-tiered", "targets": ["gpt-tiered"]}
        ],
        "timeouts": {"first_frame_ms": 5000, "worker_silence_ms": 5000, "heartbeat_ms": 200}
    });
    for (k, val) in extra.as_object().unwrap() {
        v[k] = val.clone();
    }
    test_config(v)
}

async fn gateway(dir: &std::path::Path, billing_url: Option<String>, extra: Value) -> Gateway {
    start(Options {
        config: config(dir, extra),
        billing: true,
        billing_url,
        ..Options::default()
    })
    .await
}

async fn messages(base: &str, body: &Value, key: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .json(body);
    req = req.header("x-api-key", key.unwrap_or("sk-anything"));
    req.send().await.unwrap()
}

fn messages_body(model: &str, prompt: &str, stream: bool) -> Value {
    json!({"model": model, "max_tokens": 256, "stream": stream,
        "messages": [{"role": "user", "content": prompt}]})
}

/// The `data:` of the last `message_delta` event of an Anthropic stream.
async fn last_message_delta(resp: reqwest::Response) -> Value {
    let text = resp.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|block| {
            let (head, data) = block.split_once('\n')?;
            (head == "event: message_delta")
                .then(|| serde_json::from_str(data.strip_prefix("data: ")?).ok())?
        })
        .last()
        .unwrap_or_else(|| panic!("no message_delta in {text}"))
}

/// The cost (`upstream`) and charge (`charge`) of request `id`, USD strings, once billed.
async fn cost_and_charge(gw: &Gateway, id: uuid::Uuid) -> (String, String) {
    let ledger = gw.ledger.as_ref().unwrap();
    ledger_rows(ledger, id, 2).await;
    let get = |kind| async move {
        let c = ledger.cost_of(id, kind, 0).await.unwrap();
        c.map_or_else(|| "NULL".to_owned(), |c| c.normalize().to_string())
    };
    (get(UsageKind::Upstream).await, get(UsageKind::Charge).await)
}

/// The upstream row's ledger lines as (billing type, tokens, amount).
async fn lines(gw: &Gateway, id: uuid::Uuid) -> Vec<(String, u64, String)> {
    let ledger = gw.ledger.as_ref().unwrap();
    let lines = ledger.lines_of(id, UsageKind::Upstream, 0).await.unwrap();
    lines
        .into_iter()
        .map(|(t, n, a)| (t, n, a.normalize().to_string()))
        .collect()
}

/// Asserts request `id` cost `cost` upstream and was charged as much, and that its upstream row's
/// lines are exactly `want` (billing type, tokens, amount); `ctx` names the case on failure.
async fn assert_priced(
    gw: &Gateway,
    id: uuid::Uuid,
    cost: &str,
    want: &[(&str, u64, &str)],
    ctx: &str,
) {
    assert_eq!(
        cost_and_charge(gw, id).await,
        (cost.to_owned(), cost.to_owned()),
        "{ctx}"
    );
    let want: Vec<_> = want.iter().map(|(t, n, a)| s(t, *n, a)).collect();
    assert_eq!(lines(gw, id).await, want, "{ctx}");
}

fn s(t: &str, n: u64, a: &str) -> (String, u64, String) {
    (t.to_owned(), n, a.to_owned())
}

/// FC-34: Anthropic cache writes by TTL through `/v1/messages` and the chat view.
async fn fc34(billing_url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), billing_url, json!({})).await;
    let prompt = mock_usage(FC34_USAGE);

    // The usage object reaches the /v1/messages client unchanged, streamed or not.
    let resp = messages(&gw.base, &messages_body("claude-t", &prompt, false), None).await;
    assert_eq!(resp.status().as_u16(), 200);
    let id = request_id(resp.headers());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["usage"].to_string(), FC34_USAGE);
    let resp = messages(&gw.base, &messages_body("claude-t", &prompt, true), None).await;
    assert_eq!(
        last_message_delta(resp).await["usage"].to_string(),
        FC34_USAGE
    );
    // Cost $0.058104: 12 × $3 + 9628 × $6.00 + 20 × $15 per 1M.
    assert_priced(
        &gw,
        id,
        "0.058104",
        &[
            ("cache_write_1h", 9628, "0.057768"),
            ("new_input", 12, "0.000036"),
            ("output", 20, "0.0003"),
        ],
        "",
    )
    .await;
    let rows = ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await;
    for r in &rows {
        assert_eq!(
            (
                r.usage.prompt_tokens,
                r.usage.cache_write_tokens,
                r.usage.cache_write_1h_tokens
            ),
            (9640, 9628, 9628)
        );
    }

    // The chat view: prompt_tokens 9640.
    let (status, headers, body) = post_json(&gw.base, &chat("claude-t", &prompt, false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 9640);
    assert_eq!(body["usage"]["completion_tokens"], 20);
    assert_eq!(body["usage"]["total_tokens"], 9660);
    assert_eq!(
        cost_and_charge(&gw, request_id(&headers)).await.0,
        "0.058104"
    );

    // Split 1000 (5 m) / 2000 (1 h) of 3000: $0.016086.
    let split = r#"{"input_tokens":12,"cache_creation_input_tokens":3000,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":2000},"output_tokens":20}"#;
    let resp = messages(
        &gw.base,
        &messages_body("claude-t", &mock_usage(split), false),
        None,
    )
    .await;
    let id = request_id(resp.headers());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["usage"].to_string(), split);
    assert_priced(
        &gw,
        id,
        "0.016086",
        &[
            ("cache_write", 1000, "0.00375"),
            ("cache_write_1h", 2000, "0.012"),
            ("new_input", 12, "0.000036"),
            ("output", 20, "0.0003"),
        ],
        "",
    )
    .await;

    // No `cache_creation` object: all writes at the 5-minute rate (12 × 3 + 3000 × 3.75 + 20 × 15).
    let plain = r#"{"input_tokens":12,"cache_creation_input_tokens":3000,"cache_read_input_tokens":0,"output_tokens":20}"#;
    let resp = messages(
        &gw.base,
        &messages_body("claude-t", &mock_usage(plain), false),
        None,
    )
    .await;
    let id = request_id(resp.headers());
    assert_eq!(
        cost_and_charge(&gw, id).await,
        ("0.011586".into(), "0.011586".into())
    );
    assert_eq!(lines(&gw, id).await[0], s("cache_write", 3000, "0.01125"));

    // A catalog entry without a 1-hour price: `unpriced_component`, in the ledger and in
    // reconciliation (the 1-hour writes are recorded at $0 under the default policy).
    let resp = messages(
        &gw.base,
        &messages_body("claude-no1h", &prompt, false),
        None,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let id = request_id(resp.headers());
    assert_eq!(
        cost_and_charge(&gw, id).await,
        ("0.000336".into(), "0.000336".into())
    );
    let ledger = gw.ledger.as_ref().unwrap();
    for kind in [UsageKind::Upstream, UsageKind::Charge] {
        assert_eq!(
            ledger.unpriced_of(id, kind, 0).await.unwrap(),
            vec!["cache_write_1h".to_owned()]
        );
    }
    let now = switchyard_schemas::now_ms();
    let rec = switchyard_billing::reconcile(ledger, 0, now + 60_000, 1000)
        .await
        .unwrap();
    let found: Vec<_> = rec
        .rows
        .iter()
        .filter(|d| d.class == switchyard_billing::DiscrepancyClass::UnpricedComponent)
        .collect();
    assert_eq!(found.len(), 1, "{:?}", rec.rows);
    assert_eq!(found[0].request_id, id.to_string());
    assert!(
        found[0].details.contains("cache_write_1h"),
        "{}",
        found[0].details
    );
    assert_eq!(rec.counts.unpriced_component, 1);
    // ...and in the daily report: the two rows of the request counted unpriced, the finding
    // counted and listed.
    let today = utc_today();
    let report = switchyard_billing::report::daily_report(ledger, &today)
        .await
        .unwrap();
    assert_eq!(report.totals.unpriced_rows, 2);
    assert_eq!(report.reconciliation.counts.unpriced_component, 1);
    let table = report.to_table();
    assert!(table.contains(", unpriced rows 2\n"), "{table}");
    let finding = table
        .lines()
        .find(|l| l.starts_with(&id.to_string()))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        finding.contains("unpriced_component") && finding.contains("cache_write_1h"),
        "{finding}"
    );
}

/// Today's UTC date, `YYYY-MM-DD` (the report's day).
fn utc_today() -> String {
    switchyard_budgets::spend::windows(switchyard_schemas::now_ms()).0
}

sqlite_and_postgres!(
    fc34: fc34_anthropic_cache_writes_by_ttl_sqlite,
    fc34_anthropic_cache_writes_by_ttl_postgres
);

/// FC-35: a Gemini stream whose last `usageMetadata` has implicit-cache and thinking counts.
async fn fc35(billing_url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), billing_url, json!({})).await;
    let meta = r#"{"promptTokenCount":10000,"cachedContentTokenCount":8000,"candidatesTokenCount":50,"thoughtsTokenCount":400,"totalTokenCount":10450}"#;
    let prompt = mock_usage(meta);
    let mut body = chat("gem-t", &prompt, true);
    body["stream_options"] = json!({"include_usage": true});
    let r = post_sse(&gw.base, &body).await;
    assert_eq!(r.status, 200);
    let usage = r
        .json_events()
        .into_iter()
        .find(|e| e["choices"] == json!([]))
        .unwrap()["usage"]
        .clone();
    assert_eq!(usage["prompt_tokens"], 10000);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 8000);
    assert_eq!(usage["completion_tokens"], 450);
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 400);
    assert_eq!(usage["total_tokens"], 10450);
    let id = request_id(&r.headers);
    // 2000 × 1.25 + 8000 × 0.125 + 50 × 10 + 400 × 10 per 1M.
    assert_priced(
        &gw,
        id,
        "0.008",
        &[
            ("cached_input", 8000, "0.001"),
            ("new_input", 2000, "0.0025"),
            ("output", 50, "0.0005"),
            ("reasoning", 400, "0.004"),
        ],
        "",
    )
    .await;
    // The /v1/messages view, streamed.
    let resp = messages(&gw.base, &messages_body("gem-t", &prompt, true), None).await;
    let u = &last_message_delta(resp).await["usage"];
    assert_eq!(u["input_tokens"], 2000);
    assert_eq!(u["cache_read_input_tokens"], 8000);
    assert_eq!(u["output_tokens"], 450);
}

sqlite_and_postgres!(
    fc35: fc35_gemini_thoughts_and_implicit_cache_sqlite,
    fc35_gemini_thoughts_and_implicit_cache_postgres
);

/// Bedrock Converse usage with cache reads and writes (`inputTokens` excludes both):
/// 100 × 3 + 1000 × 0.30 + 3000 × 3.75 + 50 × 15 per 1M = $0.0126.
#[tokio::test]
async fn bedrock_converse_cache_reads_and_writes_are_priced() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), None, json!({})).await;
    let usage = r#"{"inputTokens":100,"outputTokens":50,"totalTokens":4150,"cacheReadInputTokens":1000,"cacheWriteInputTokens":3000}"#;
    for stream in [false, true] {
        let (status, headers, body) = if stream {
            let r = post_sse(&gw.base, &chat("bedrock-t", &mock_usage(usage), true)).await;
            (r.status, r.headers, Value::Null)
        } else {
            post_json(&gw.base, &chat("bedrock-t", &mock_usage(usage), false)).await
        };
        assert_eq!(status, 200, "{body}");
        if !stream {
            assert_eq!(body["usage"]["prompt_tokens"], 4100);
            assert_eq!(
                body["usage"]["prompt_tokens_details"]["cached_tokens"],
                1000
            );
            assert_eq!(body["usage"]["total_tokens"], 4150);
        }
        let id = request_id(&headers);
        assert_priced(
            &gw,
            id,
            "0.0126",
            &[
                ("cache_write", 3000, "0.01125"),
                ("cached_input", 1000, "0.0003"),
                ("new_input", 100, "0.0003"),
                ("output", 50, "0.00075"),
            ],
            &format!("stream {stream}"),
        )
        .await;
    }
}

/// OpenAI `prompt_tokens_details` / `completion_tokens_details`: audio tokens at the audio
/// prices, accepted and rejected prediction tokens as output (they are inside
/// `completion_tokens`), and the `priority` service tier at its own prices, recorded.
#[tokio::test]
async fn openai_usage_details_and_service_tier_are_priced() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), None, json!({})).await;
    let usage = r#"{"prompt_tokens":1000,"completion_tokens":500,"total_tokens":1500,"prompt_tokens_details":{"cached_tokens":200,"audio_tokens":100},"completion_tokens_details":{"reasoning_tokens":100,"audio_tokens":50,"accepted_prediction_tokens":20,"rejected_prediction_tokens":30}}"#;
    // Default tier: 700 × 2.5 + 200 × 1.25 + 100 × 40 + 350 × 10 + 100 × 10 + 50 × 80 per 1M.
    // Priority: 700 × 4.25 + 200 × 2.125 + 100 × 40 + 350 × 17 + 100 × 17 + 50 × 80 per 1M.
    for (tier, cost) in [("default", "0.0145"), ("priority", "0.01905")] {
        let prompt = format!("{} service_tier={tier}", mock_usage(usage));
        let (status, headers, body) = post_json(&gw.base, &chat("gpt-t", &prompt, false)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["prompt_tokens_details"]["audio_tokens"], 100);
        assert_eq!(
            body["usage"]["completion_tokens_details"]["audio_tokens"],
            50
        );
        let id = request_id(&headers);
        assert_eq!(
            cost_and_charge(&gw, id).await,
            (cost.into(), cost.into()),
            "{tier}"
        );
        let rows = ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await;
        let expected = (tier == "priority").then_some(ServiceTier::Priority);
        for r in &rows {
            assert_eq!(r.usage.service_tier, expected);
            assert_eq!(
                (r.usage.audio_input_tokens, r.usage.audio_output_tokens),
                (100, 50)
            );
        }
        let types: Vec<String> = lines(&gw, id).await.into_iter().map(|l| l.0).collect();
        assert_eq!(
            types,
            [
                "audio_input",
                "audio_output",
                "cached_input",
                "new_input",
                "output",
                "reasoning"
            ]
        );
    }
}

/// Through the ledger: a reasoning price of its own, the flex service tier and a long-context
/// tier (above 200,000 prompt tokens the tier's prices; reasoning keeps the card's price), cost
/// and charge to the cent and one line per billing type.
#[tokio::test]
async fn reasoning_price_flex_tier_and_long_context_tier_reach_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), None, json!({})).await;
    let usage = |prompt: u64, cached: u64, completion: u64, reasoning: u64| {
        mock_usage(&format!(
            r#"{{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{},"prompt_tokens_details":{{"cached_tokens":{cached}}},"completion_tokens_details":{{"reasoning_tokens":{reasoning}}}}}"#,
            prompt + completion
        ))
    };
    let cases = [
        // 800 × 2 + 200 × 1 + 400 × 8 + 100 × 12 per 1M.
        (
            "standard",
            usage(1_000, 200, 500, 100),
            "0.0062",
            [
                ("cached_input", 200, "0.0002"),
                ("new_input", 800, "0.0016"),
                ("output", 400, "0.0032"),
                ("reasoning", 100, "0.0012"),
            ],
        ),
        // Flex: 800 × 1 + 200 × 0.5 + 400 × 4 + 100 × 12 per 1M.
        (
            "flex",
            format!("{} service_tier=flex", usage(1_000, 200, 500, 100)),
            "0.0037",
            [
                ("cached_input", 200, "0.0001"),
                ("new_input", 800, "0.0008"),
                ("output", 400, "0.0016"),
                ("reasoning", 100, "0.0012"),
            ],
        ),
        // Above 200k: 200,000 × 4 + 50,000 × 2 + 800 × 16 + 200 × 12 per 1M.
        (
            "long context",
            usage(250_000, 50_000, 1_000, 200),
            "0.9152",
            [
                ("cached_input", 50_000, "0.1"),
                ("new_input", 200_000, "0.8"),
                ("output", 800, "0.0128"),
                ("reasoning", 200, "0.0024"),
            ],
        ),
    ];
    for (name, prompt, cost, want) in cases {
        let (status, headers, body) =
            post_json(&gw.base, &chat("gpt-tiered", &prompt, false)).await;
        assert_eq!(status, 200, "{name}: {body}");
        assert_priced(&gw, request_id(&headers), cost, &want, name).await;
    }
}

/// No silent $0: with keys on, a key with a USD budget is refused a model without a price (in
/// each front door's error shape); a key without one is served, charged $0 and the gap recorded
/// (ledger, reconciliation, metric).
#[tokio::test]
async fn unpriced_model_refused_for_budgeted_keys_and_recorded_for_others() {
    let dir = tempfile::tempdir().unwrap();
    let keys = json!([
        {"id": "budgeted", "tenant": "acme", "key": KEY_BUDGET, "budget": {"daily_usd": 1}},
        {"id": "free", "tenant": "acme", "key": KEY_FREE}
    ]);
    let gw = gateway(dir.path(), None, json!({"keys": keys})).await;
    let (status, _, body) =
        post_chat_as(&gw.base, KEY_BUDGET, &chat("test/unpriced", "hi", false)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "model_not_priced");
    let message = error_message(&body);
    assert!(
        message.contains("`test/unpriced` has no price"),
        "{message}"
    );
    let resp = messages(
        &gw.base,
        &messages_body("test/unpriced", "hi", false),
        Some(KEY_BUDGET),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(error_message(&body).contains("test/unpriced"));
    // A priced model is still served to the budgeted key.
    let (status, _, _) = post_chat_as(&gw.base, KEY_BUDGET, &chat("gpt-t", "hi", false)).await;
    assert_eq!(status, 200);

    // The key without a budget: served, charged nothing, the gap recorded.
    let (status, headers, body) = post_chat_as(
        &gw.base,
        KEY_FREE,
        &chat("test/unpriced", "hi there", false),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let id = request_id(&headers);
    assert_eq!(
        cost_and_charge(&gw, id).await,
        ("NULL".into(), "NULL".into())
    );
    let ledger = gw.ledger.as_ref().unwrap();
    for kind in [UsageKind::Upstream, UsageKind::Charge] {
        assert_eq!(
            ledger.unpriced_of(id, kind, 0).await.unwrap(),
            vec!["model".to_owned()]
        );
    }
    let rec = switchyard_billing::reconcile(ledger, 0, switchyard_schemas::now_ms() + 60_000, 100)
        .await
        .unwrap();
    assert_eq!(rec.counts.unpriced_component, 1, "{:?}", rec.rows);
    let metrics = metrics_text(&gw.base).await;
    assert!(
        metrics.contains(
            r#"switchyard_unpriced_total{side="charge",model="test/unpriced",component="model"} 1"#
        ),
        "{metrics}"
    );
}

/// The explicit policies: `reject` refuses an unpriced model to every caller, a key without a
/// budget too; `zero` serves it even to a key whose *tenant* has a USD budget (the default would
/// refuse that one: a tenant budget counts like a key's), the charge row's cost NULL and the gap
/// recorded.
#[tokio::test]
async fn explicit_reject_and_zero_policies_and_a_tenant_budget() {
    let keys = json!([
        {"id": "free", "tenant": "acme", "key": KEY_FREE},
        {"id": "tenant-budgeted", "tenant": "capped", "key": KEY_BUDGET}
    ]);
    let tenants = json!([{"id": "capped", "budget": {"monthly_usd": 5}}]);
    let refused = |status: u16, body: &Value| {
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "model_not_priced");
        assert!(error_message(body).contains("`test/unpriced` has no price"));
    };

    // Default: the key of a budgeted tenant is refused, the free key served.
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), None, json!({"keys": keys, "tenants": tenants})).await;
    let (status, _, body) =
        post_chat_as(&gw.base, KEY_BUDGET, &chat("test/unpriced", "hi", false)).await;
    refused(status, &body);
    let (status, _, _) =
        post_chat_as(&gw.base, KEY_FREE, &chat("test/unpriced", "hi", false)).await;
    assert_eq!(status, 200);
    drop(gw);

    // `reject`: the free key too.
    let dir = tempfile::tempdir().unwrap();
    let extra = json!({"keys": keys, "tenants": tenants, "unpriced": "reject"});
    let gw = gateway(dir.path(), None, extra).await;
    let (status, _, body) =
        post_chat_as(&gw.base, KEY_FREE, &chat("test/unpriced", "hi", false)).await;
    refused(status, &body);
    drop(gw);

    // `zero`: the tenant-budgeted key is served; nothing is charged, the gap is recorded.
    let dir = tempfile::tempdir().unwrap();
    let extra = json!({"keys": keys, "tenants": tenants, "unpriced": "zero"});
    let gw = gateway(dir.path(), None, extra).await;
    let (status, headers, body) =
        post_chat_as(&gw.base, KEY_BUDGET, &chat("test/unpriced", "hi", false)).await;
    assert_eq!(status, 200, "{body}");
    let id = request_id(&headers);
    assert_eq!(
        cost_and_charge(&gw, id).await,
        ("NULL".into(), "NULL".into())
    );
    let ledger = gw.ledger.as_ref().unwrap();
    assert_eq!(
        ledger.unpriced_of(id, UsageKind::Charge, 0).await.unwrap(),
        vec!["model".to_owned()]
    );
}

/// `unpriced: {charge_at: gpt-t}`: an unpriced model is charged at the fallback's card.
#[tokio::test]
async fn charge_at_prices_an_unpriced_model_with_the_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        dir.path(),
        None,
        json!({"unpriced": {"charge_at": "gpt-t"}}),
    )
    .await;
    let prompt = "#mock prompt_tokens=1000 completion_tokens=100";
    let (status, headers, body) = post_json(&gw.base, &chat("test/unpriced", prompt, false)).await;
    assert_eq!(status, 200, "{body}");
    let id = request_id(&headers);
    // 1000 × 2.5 + 100 × 10 per 1M; the cost price stays unknown.
    assert_eq!(
        cost_and_charge(&gw, id).await,
        ("NULL".into(), "0.0035".into())
    );
    let ledger = gw.ledger.as_ref().unwrap();
    assert_eq!(
        ledger.unpriced_of(id, UsageKind::Charge, 0).await.unwrap(),
        vec!["model".to_owned()]
    );
}

fn switchyard(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .env_remove("SWITCHYARD_CONFIG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap()
}

/// `pricing check`: nothing missing on the default config; an unpriced target and a model
/// without a sale price are named (exit 1).
#[test]
fn pricing_check_names_what_has_no_price() {
    let out = switchyard(&["pricing", "check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(
        stdout,
        "nothing missing: 2 targets and 2 models priced (catalog <bundled>, as of 2026-12-01)\n"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "targets:\n\
         - {id: mock, provider: openai, base_url: 'builtin:mock', upstream_model: mock}\n\
         - {id: mystery, provider: openai, base_url: 'builtin:mock', upstream_model: mystery-1}\n\
         - {id: sonnet-old, provider: anthropic, base_url: 'builtin:mock', upstream_model: claude-3-7-sonnet-20250219}\n\
         models:\n\
         - {id: demo/mock, targets: [mock]}\n\
         - {id: test/mystery, targets: [mystery]}\n",
    )
    .unwrap();
    let out = switchyard(&["pricing", "check", "--config", path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert_eq!(
        stdout,
        "target mystery (upstream model mystery-1): no cost price\n\
         target sonnet-old (upstream model claude-3-7-sonnet-20250219): no cost price\n\
         model test/mystery: no sale price (standard:)\n"
    );
}

/// `pricing import`: a LiteLLM price list becomes a catalog a gateway can load.
#[test]
fn pricing_import_writes_a_loadable_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("prices.json");
    std::fs::write(
        &src,
        r#"{"sample_spec": {"input_cost_per_token": 0, "output_cost_per_token": 0},
            "claude-t": {"mode": "chat", "input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05,
              "cache_read_input_token_cost": 3e-07, "cache_creation_input_token_cost": 3.75e-06,
              "cache_creation_input_token_cost_above_1hr": 6e-06},
            "text-embedding-3-small": {"mode": "embedding", "input_cost_per_token": 2e-08, "output_cost_per_token": 0}}"#,
    )
    .unwrap();
    let out_path = dir.path().join("catalog.yaml");
    let out = switchyard(&[
        "pricing",
        "import",
        src.to_str().unwrap(),
        "--out",
        out_path.to_str().unwrap(),
        "--as-of",
        "2026-11-29",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&out_path).unwrap();
    let catalog = switchyard_schemas::pricing::Catalog::parse("out", &text).unwrap();
    assert_eq!(catalog.upstream.len(), 1);
    assert!(
        text.contains(
            r#""claude-t": {input: 3, output: 15, cached_input: 0.3, cache_write: 3.75, cache_write_1h: 6, as_of: "2026-11-29"}"#
        ),
        "{text}"
    );
    let u = switchyard_schemas::Usage {
        prompt_tokens: 9640,
        cache_write_tokens: 9628,
        cache_write_1h_tokens: 9628,
        completion_tokens: 20,
        ..Default::default()
    };
    let cost = catalog.upstream_cost("claude-t", &u, false).unwrap();
    assert_eq!(cost.total.to_string(), "0.058104");
}

/// Acceptance: on one config file, `pricing check` names the unpriced target and its model
/// (exit 1), and a gateway running that file refuses a budgeted key's request to the model with
/// 400 `model_not_priced` naming it, while serving the priced model.
#[tokio::test]
async fn pricing_check_gap_is_refused_for_a_budgeted_key() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(&catalog, CATALOG).unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(
        &path,
        format!(
            "pricing_file: {catalog}\n\
             targets:\n\
             - {{id: gpt-t, provider: openai, base_url: 'builtin:mock', upstream_model: gpt-t}}\n\
             - {{id: mystery, provider: openai, base_url: 'builtin:mock', upstream_model: mystery-1}}\n\
             models:\n\
             - {{id: gpt-t, targets: [gpt-t]}}\n\
             - {{id: test/mystery, targets: [mystery]}}\n\
             keys:\n\
             - {{id: budgeted, tenant: acme, key: {KEY_BUDGET}, budget: {{daily_usd: 1}}}}\n",
            catalog = catalog.display()
        ),
    )
    .unwrap();
    let out = switchyard(&["pricing", "check", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "target mystery (upstream model mystery-1): no cost price\n\
         model test/mystery: no sale price (standard:)\n"
    );

    let mut config = switchyard::config::load(Some(&path)).unwrap();
    config.timeouts = test_config(json!({})).timeouts;
    let gw = start_billed(config).await;
    let (status, _, body) =
        post_chat_as(&gw.base, KEY_BUDGET, &chat("test/mystery", "hi", false)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "model_not_priced");
    assert_eq!(
        body["error"]["message"],
        "The model `test/mystery` has no price in the pricing catalog, and a USD budget cannot \
         count its spend. Add it to the catalog (`standard:` in the pricing file), or set \
         `unpriced: {charge_at: <model>}`."
    );
    let (status, _, _) = post_chat_as(&gw.base, KEY_BUDGET, &chat("gpt-t", "hi", false)).await;
    assert_eq!(status, 200);
}
