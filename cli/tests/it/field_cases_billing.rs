//! Billing field cases of issue #16 end to end (HTTP → ingress → NATS → worker → the mock
//! upstream → billing → the ledger), each with the exact ledger values:
//! - a client that leaves a stream whose upstream reported its input counts at the start
//!   (Anthropic `message_start`) is billed from that report plus the text delivered, as
//!   `cancelled` (not an upstream error), on both ledger rows;
//! - usage that arrives only in a trailing event after the stop (OpenAI's `choices: []` chunk,
//!   Gemini's last `usageMetadata`, Bedrock's `metadata` after `messageStop`) is billed from it;
//! - an answer a provider's safety system blocked (OpenAI `content_filter`, Anthropic `refusal`,
//!   Gemini `SAFETY` / `PROHIBITED_CONTENT`, Bedrock `content_filtered` /
//!   `guardrail_intervened`) ends as `content_filter` on the OpenAI door and `refusal` on the
//!   Anthropic door, never as a normal stop, and the ledger's `finish_reason` says so.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use futures::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;
use switchyard_schemas::usage::{Usage, UsageStatus};
use switchyard_schemas::{ErrorClass, FinishReason, UsageKind};

/// Test prices per 1M tokens, the same as cost and as sale price.
const CATALOG: &str = r#"currency: USD
as_of: 2026-12-01
upstream:
  claude-t: {input: 3, cache_write: 3.75, cached_input: 0.30, output: 15}
  gpt-t: {input: 2.5, cached_input: 1.25, output: 10}
  gem-t: {input: 1.25, cached_input: 0.125, output: 10}
  bedrock-t: {input: 3, cache_write: 3.75, cached_input: 0.30, output: 15}
standard:
  claude-t: {input: 3, cache_write: 3.75, cached_input: 0.30, output: 15}
  gpt-t: {input: 2.5, cached_input: 1.25, output: 10}
  gem-t: {input: 1.25, cached_input: 0.125, output: 10}
  bedrock-t: {input: 3, cache_write: 3.75, cached_input: 0.30, output: 15}
"#;

/// One target per provider family on the built-in mock; each model id names its target. The
/// ledger is SQLite in the temp dir, or `billing_url`.
async fn gateway(dir: &std::path::Path, billing_url: Option<String>) -> Gateway {
    let aws = json!({"region": "us-east-1", "access_key_id": "AKIDEXAMPLE",
        "secret_access_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"});
    let targets: Vec<Value> = [
        ("claude-t", "anthropic"),
        ("gpt-t", "openai"),
        ("gem-t", "gemini"),
        ("bedrock-t", "bedrock"),
    ]
    .iter()
    .map(|(id, provider)| {
        let mut t = json!({"id": id, "provider": provider, "base_url": "builtin:mock",
            "upstream_model": id});
        if *provider == "bedrock" {
            t["aws"] = aws.clone();
        }
        t
    })
    .collect();
    let models: Vec<Value> = ["claude-t", "gpt-t", "gem-t", "bedrock-t"]
        .iter()
        .map(|id| json!({"id": id, "targets": [id]}))
        .collect();
    start(Options {
        config: test_config(json!({
            "pricing_file": catalog_file(dir, CATALOG),
            "targets": targets,
            "models": models,
            "timeouts": {"first_frame_ms": 5000, "worker_silence_ms": 5000, "heartbeat_ms": 200}
        })),
        billing: true,
        billing_url,
        ..Options::default()
    })
    .await
}

sqlite_and_postgres!(
    disconnect_after_start_usage: disconnect_after_start_usage_is_billed_from_the_report_sqlite,
    disconnect_after_start_usage_is_billed_from_the_report_postgres
);

sqlite_and_postgres!(
    usage_after_the_stop: usage_only_after_the_stop_is_billed_from_it_sqlite,
    usage_only_after_the_stop_is_billed_from_it_postgres
);

sqlite_and_postgres!(
    safety_blocks: safety_blocks_end_as_content_filter_on_both_doors_sqlite,
    safety_blocks_end_as_content_filter_on_both_doors_postgres
);

/// Cost (`upstream`, attempt 0) and charge of request `id`, normalised USD strings.
async fn cost_and_charge(gw: &Gateway, id: uuid::Uuid) -> (String, String) {
    let ledger = gw.ledger.as_ref().unwrap();
    let get = |kind| async move {
        let c = ledger.cost_of(id, kind, 0).await.unwrap();
        c.map_or_else(|| "NULL".to_owned(), |c| c.normalize().to_string())
    };
    (get(UsageKind::Upstream).await, get(UsageKind::Charge).await)
}

fn usage(prompt: u64, cached: u64, completion: u64, reasoning: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        cached_tokens: cached,
        completion_tokens: completion,
        reasoning_tokens: reasoning,
        ..Usage::default()
    }
}

/// Field case (a): Anthropic reports 1,200 new + 800 cached input tokens in `message_start`,
/// streams three 40-byte text deltas and then nothing (the connection stays open); the client
/// reads them and leaves. Both rows: the reported input counts, 30 output tokens for the 120
/// bytes delivered (the only estimate), `cancelled`; the daily report counts a cancellation and
/// no upstream error.
async fn disconnect_after_start_usage(billing_url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), billing_url).await;
    let body = chat(
        "claude-t",
        "#mock fixture=fc_anthropic_start_usage_then_hold hold=1",
        true,
    );
    let resp = post(&gw.base, &body).await;
    assert_eq!(resp.status(), 200);
    let id = request_id(resp.headers());
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !seen.contains("the stream here..") {
            let chunk = stream.next().await.unwrap().unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("third delta never arrived: {seen}"));
    drop(stream);

    let rows = ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await;
    for row in &rows {
        assert_eq!(row.usage, usage(2000, 800, 30, 0), "{:?}", row.kind);
        assert!(row.estimated, "{:?}", row.kind);
        assert_eq!(row.status, UsageStatus::Cancelled, "{:?}", row.kind);
        assert_eq!(
            row.error_class,
            Some(ErrorClass::Cancelled),
            "{:?}",
            row.kind
        );
        assert_eq!(row.finish_reason, None, "{:?}", row.kind);
    }
    // 1,200 × $3 + 800 × $0.30 + 30 × $15 per 1M (a byte estimate of the prompt would differ).
    assert_eq!(
        cost_and_charge(&gw, id).await,
        ("0.00429".into(), "0.00429".into())
    );
    let today = switchyard_billing::report::utc_date(switchyard_schemas::now_ms());
    let r = switchyard_billing::daily_report(gw.ledger.as_ref().unwrap(), &today)
        .await
        .unwrap();
    assert_eq!(
        (r.totals.requests, r.totals.cancelled, r.totals.errors),
        (1, 1, 0)
    );
    assert_eq!((r.totals.upstream_calls, r.totals.upstream_errors), (1, 0));
    assert_eq!(r.reconciliation.counts.estimated, 1);
    assert_eq!(r.reconciliation.counts.usage_mismatch, 0);
}

/// Field case (b): usage only in a trailing event after the stop, per provider family, through
/// the streaming OpenAI door; each row is billed from it exactly (nothing estimated).
async fn usage_after_the_stop(billing_url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), billing_url).await;
    let bedrock_usage = r#"{"inputTokens":100,"outputTokens":40,"cacheReadInputTokens":500,"cacheWriteInputTokens":0,"totalTokens":640}"#;
    let cases = [
        // `choices: []` usage chunk after the `finish_reason` chunk, then `[DONE]`:
        // 476 × $2.50 + 1,024 × $1.25 + 250 × $10 per 1M.
        (
            "gpt-t",
            "#mock fixture=fc_openai_usage_after_stop".to_owned(),
            usage(1500, 1024, 250, 0),
            "0.00497",
        ),
        // `usageMetadata` alone after the `finishReason: STOP` chunk:
        // 1,000 × $1.25 + 2,000 × $0.125 + (120 + 80 thoughts) × $10 per 1M.
        (
            "gem-t",
            "#mock fixture=fc_gemini_usage_after_stop".to_owned(),
            usage(3000, 2000, 200, 80),
            "0.0035",
        ),
        // Converse stream: `metadata` (usage) after `messageStop`:
        // 100 × $3 + 500 × $0.30 + 40 × $15 per 1M.
        (
            "bedrock-t",
            mock_usage(bedrock_usage),
            usage(600, 500, 40, 0),
            "0.00105",
        ),
    ];
    for (model, prompt, expected, usd) in cases {
        let resp = post(&gw.base, &chat(model, &prompt, true)).await;
        assert_eq!(resp.status(), 200, "{model}");
        let id = request_id(resp.headers());
        let text = resp.text().await.unwrap();
        assert!(text.contains("[DONE]"), "{model}: {text}");
        for row in ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await {
            assert_eq!(row.usage, expected, "{model} {:?}", row.kind);
            assert!(!row.estimated, "{model} {:?}", row.kind);
            assert_eq!(row.status, UsageStatus::Ok, "{model}");
            assert_eq!(row.finish_reason, Some(FinishReason::Stop), "{model}");
        }
        assert_eq!(
            cost_and_charge(&gw, id).await,
            (usd.to_owned(), usd.to_owned()),
            "{model}"
        );
    }
}

/// Field case (c): every provider family's safety-block reason ends the answer as
/// `content_filter` (OpenAI door, streamed and not) and `refusal` (Anthropic door), and both
/// ledger rows carry `finish_reason` `content_filter`; an ordinary answer stays `stop`.
async fn safety_blocks(billing_url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), billing_url).await;
    let ledger = gw.ledger.as_ref().unwrap();
    let cases = [
        ("gpt-t", "content_filter"),
        ("claude-t", "refusal"),
        ("gem-t", "SAFETY"),
        ("gem-t", "PROHIBITED_CONTENT"),
        ("bedrock-t", "content_filtered"),
        ("bedrock-t", "guardrail_intervened"),
    ];
    let http = reqwest::Client::new();
    for (model, native) in cases {
        let prompt = format!("#mock finish={native}");
        let mut ids = Vec::new();

        // OpenAI door, not streamed.
        let resp = post(&gw.base, &chat(model, &prompt, false)).await;
        assert_eq!(resp.status(), 200, "{model} {native}");
        ids.push(request_id(resp.headers()));
        let v: Value = resp.json().await.unwrap();
        assert_eq!(
            v["choices"][0]["finish_reason"], "content_filter",
            "{model} {native}: {v}"
        );

        // OpenAI door, streamed.
        let sse = post_sse(&gw.base, &chat(model, &prompt, true)).await;
        assert_eq!(sse.status, 200, "{model} {native}");
        ids.push(request_id(&sse.headers));
        assert_eq!(
            sse.finish_reason().as_deref(),
            Some("content_filter"),
            "{model} {native}"
        );

        // Anthropic door, not streamed and streamed.
        for stream in [false, true] {
            let resp = http
                .post(format!("{}/v1/messages", gw.base))
                .header("x-api-key", "sk-anything")
                .header("anthropic-version", "2023-06-01")
                .json(&json!({"model": model, "max_tokens": 64, "stream": stream,
                    "messages": [{"role": "user", "content": prompt}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{model} {native}");
            ids.push(request_id(resp.headers()));
            let text = resp.text().await.unwrap();
            let stop = if stream {
                text.lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                    .find(|d| d["type"] == "message_delta")
                    .map(|d| d["delta"]["stop_reason"].clone())
            } else {
                serde_json::from_str::<Value>(&text)
                    .ok()
                    .map(|v| v["stop_reason"].clone())
            };
            assert_eq!(stop, Some(json!("refusal")), "{model} {native}: {text}");
        }

        for id in ids {
            for row in ledger_rows(ledger, id, 2).await {
                assert_eq!(
                    row.finish_reason,
                    Some(FinishReason::ContentFilter),
                    "{model} {native} {:?}",
                    row.kind
                );
                assert_eq!(row.status, UsageStatus::Ok, "{model} {native}");
            }
        }
    }
    // Control: an ordinary answer is a normal stop, in the ledger too.
    let resp = post(&gw.base, &chat("claude-t", "hi", false)).await;
    let id = request_id(resp.headers());
    for row in ledger_rows(ledger, id, 2).await {
        assert_eq!(row.finish_reason, Some(FinishReason::Stop));
    }
}

/// The demo prices of the bundled catalog make the quick start's model spend real money: a key
/// with a $0.01 daily budget gets exactly five requests of 1,000 prompt + 500 output tokens on
/// `demo/mock` ($1.00 / $2.00 per 1M: $0.002 each), the sixth is refused, and the ledger holds
/// the charge and the `mock` upstream's demo cost (1,000 × $0.50 + 500 × $1.50 per 1M).
#[tokio::test]
async fn demo_prices_make_a_usd_budget_refuse() {
    const KEY: &str = "sk-demo-budget-0123456789";
    let gw = start(Options {
        config: test_config(json!({
            "keys": [{"id": "demo", "tenant": "quickstart", "key": KEY,
                "budget": {"daily_usd": "0.01"}}]
        })),
        billing: true,
        ..Options::default()
    })
    .await;
    let mut body = chat(
        "demo/mock",
        "#mock prompt_tokens=1000 completion_tokens=500",
        false,
    );
    body["max_tokens"] = json!(500);
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    let mut first = None;
    for _ in 0..6 {
        let resp = http
            .post(format!("{}/v1/chat/completions", gw.base))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
        first.get_or_insert_with(|| request_id(resp.headers()));
        if resp.status() == 429 {
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
        }
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let id = first.unwrap();
    ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await;
    assert_eq!(
        cost_and_charge(&gw, id).await,
        ("0.00125".into(), "0.002".into())
    );
}
