//! OpenAI `n > 1` on the chat door (issue 12): `n` reaches an upstream that samples several
//! choices natively, and the choices come back as the upstream sent them — streamed one choice
//! per chunk with its own `index`, role chunk and `finish_reason` chunk, then one usage chunk;
//! non-streamed as `choices` 0..n-1, each with its own `message`, `finish_reason` and
//! `logprobs`. Usage is the upstream's (prompt once); providers without native `n` get a 400
//! naming `n` and the provider; the budget reservation counts `n` × `max_tokens`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};
use switchyard_schemas::UsageKind;

/// Choice 0 "Red" (stop), 1 "Blue sky" (stop), 2 "Green grass grows tall" cut to three words by
/// `max_tokens: 3` (length); the prompt is 1,000 tokens.
const PROMPT: &str = "Colors?\n#mock texts=Red|Blue+sky|Green+grass+grows+tall prompt_tokens=1000";

fn config() -> switchyard_schemas::config::GatewayConfig {
    test_config(json!({
        "targets": [
            {"id": "gpt", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "gpt-4o-mini"},
            {"id": "claude", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-test"},
            {"id": "gemini", "provider": "gemini", "base_url": "builtin:mock", "upstream_model": "gemini-test"}
        ],
        "models": [
            {"id": "openai/gpt-4o-mini", "targets": ["gpt"]},
            {"id": "demo/claude", "targets": ["claude"]},
            {"id": "demo/claude-or-gpt", "targets": ["claude", "gpt"]},
            {"id": "demo/gemini", "targets": ["gemini"]}
        ]
    }))
}

fn body(stream: bool) -> Value {
    let mut b = chat("openai/gpt-4o-mini", PROMPT, stream);
    b["n"] = json!(3);
    b["logprobs"] = json!(true);
    b["top_logprobs"] = json!(2);
    b["max_tokens"] = json!(3);
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

/// One `logprobs.content` entry as the mock writes it with `top_logprobs: 2`.
fn entry(token: &str) -> Value {
    json!({"token": token, "logprob": -0.5, "bytes": token.as_bytes(), "top_logprobs": [
        {"token": token, "logprob": -0.5, "bytes": token.as_bytes()},
        {"token": "alt1", "logprob": -1.5, "bytes": "alt1".as_bytes()}]})
}

/// Upstream and charge rows both cost 1,000 × $0.15/M + 6 × $0.60/M = $0.0001536.
async fn assert_billed(gw: &Gateway, id: uuid::Uuid) {
    let ledger = gw.ledger.as_ref().unwrap();
    let rows = ledger_rows(ledger, id, 2).await;
    for row in &rows {
        assert_eq!(
            (row.usage.prompt_tokens, row.usage.completion_tokens),
            (1000, 6),
            "{:?}",
            row.kind
        );
    }
    for kind in [UsageKind::Upstream, UsageKind::Charge] {
        let cost = ledger.cost_of(id, kind, 0).await.unwrap().unwrap();
        assert_eq!(cost.to_string(), "0.0001536", "{kind:?}");
    }
}

#[tokio::test]
async fn n3_with_logprobs_not_streamed() {
    let gw = start_billed(config()).await;
    let (status, headers, v) = post_json(&gw.base, &body(false)).await;
    assert_eq!(status, 200, "{v}");
    let sent = &gw.mock.requests()[0].body;
    assert_eq!(
        (&sent["n"], &sent["logprobs"], &sent["top_logprobs"]),
        (&json!(3), &json!(true), &json!(2))
    );
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let expect = [
        ("Red", vec!["Red"], "stop"),
        ("Blue sky", vec!["Blue ", "sky"], "stop"),
        (
            "Green grass grows",
            vec!["Green ", "grass ", "grows"],
            "length",
        ),
    ];
    for (i, (c, (text, tokens, finish))) in choices.iter().zip(expect).enumerate() {
        let entries: Vec<Value> = tokens.iter().map(|t| entry(t)).collect();
        assert_eq!(
            c,
            &json!({"index": i, "message": {"role": "assistant", "content": text, "refusal": null},
                "logprobs": {"content": entries, "refusal": null}, "finish_reason": finish}),
        );
    }
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 1000, "completion_tokens": 6, "total_tokens": 1006,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0}})
    );
    assert_billed(&gw, request_id(&headers)).await;
}

#[tokio::test]
async fn n3_with_logprobs_streamed_like_the_upstream() {
    let gw = start_billed(config()).await;
    let sse = post_sse(&gw.base, &body(true)).await;
    assert_eq!(sse.status, 200, "{:?}", sse.events);
    assert_eq!(sse.done_count(), 1);
    let ours = sse.json_events();

    // The same upstream request sent to the mock directly: every chunk's `choices` is the
    // upstream's, byte for byte, in the upstream's order.
    let sent = gw.mock.requests()[0].body.clone();
    assert_eq!((&sent["n"], &sent["stream"]), (&json!(3), &json!(true)));
    let text = post_text(format!("{}/v1/chat/completions", gw.mock.base_url()), &sent).await;
    let upstream = data_events(&text);
    let choices = |events: &[Value]| -> Vec<String> {
        events.iter().map(|e| e["choices"].to_string()).collect()
    };
    assert_eq!(choices(&ours), choices(&upstream));

    // What that order is: all role chunks, then round robin, each choice's finish after its
    // last content, then one usage chunk.
    let shape: Vec<String> = ours
        .iter()
        .map(|e| match e["choices"].get(0) {
            None => format!("usage {}", e["usage"]["completion_tokens"]),
            Some(c) => {
                let i = &c["index"];
                if let Some(f) = c["finish_reason"].as_str() {
                    format!("{i} finish {f}")
                } else if c["delta"].get("role").is_some() {
                    format!("{i} role")
                } else {
                    assert_eq!(
                        c["logprobs"]["content"],
                        json!([entry(c["delta"]["content"].as_str().unwrap())])
                    );
                    format!("{i} {}", c["delta"]["content"])
                }
            }
        })
        .collect();
    assert_eq!(
        shape,
        [
            "0 role",
            "1 role",
            "2 role",
            "0 \"Red\"",
            "1 \"Blue \"",
            "2 \"Green \"",
            "0 finish stop",
            "1 \"sky\"",
            "2 \"grass \"",
            "1 finish stop",
            "2 \"grows\"",
            "2 finish length",
            "usage 6",
        ]
    );
    let usage = &ours.last().unwrap()["usage"];
    assert_eq!(
        (&usage["prompt_tokens"], &usage["total_tokens"]),
        (&json!(1000), &json!(1006))
    );
    assert_billed(&gw, request_id(&sse.headers)).await;
}

/// Providers without native `n` (Anthropic, Gemini): a 400 naming `n` and the provider; a model
/// with such a target and an OpenAI one is served by the OpenAI one.
#[tokio::test]
async fn n_needs_a_native_provider() {
    let gw = start_config(config()).await;
    for (model, target, provider) in [
        ("demo/claude", "claude", "anthropic"),
        ("demo/gemini", "gemini", "gemini"),
    ] {
        let mut b = chat(model, "hi", false);
        b["n"] = json!(2);
        let (status, _, v) = post_json(&gw.base, &b).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], "n");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(
            v["error"]["message"],
            format!(
                "Model `{model}` has no target that supports n ({target}: provider {provider} lacks n)."
            )
        );
    }
    assert_eq!(gw.mock.request_count(), 0);
    let mut b = chat("demo/claude-or-gpt", "hi", false);
    b["n"] = json!(2);
    let (status, headers, v) = post_json(&gw.base, &b).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(headers["x-switchyard-target"], "gpt");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    // `n: 1` and no `n` still go anywhere.
    let mut b = chat("demo/claude", "hi", false);
    b["n"] = json!(1);
    let (status, _, v) = post_json(&gw.base, &b).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    let mut b = chat("demo/claude", "hi", false);
    b["n"] = json!(129);
    let (status, _, v) = post_json(&gw.base, &b).await;
    assert_eq!((status, &v["error"]["param"]), (400, &json!("n")));
}

/// The reservation counts every choice's output: `n: 4` × `max_tokens: 300` does not fit a
/// 1,000-token-per-minute quota that one choice fits.
#[tokio::test]
async fn reservation_counts_every_choice() {
    const KEY: &str = "sk-choices-0123456789";
    let mut config = config();
    let extra = test_config(json!({
        "keys": [{"id": "k1", "tenant": "acme", "key": KEY, "budget": {"tokens_per_minute": 1000}}]
    }));
    config.keys = extra.keys;
    let gw = start_config(config).await;
    let call = |n: u32| {
        let base = gw.base.clone();
        async move {
            let mut b = chat("openai/gpt-4o-mini", "hi", false);
            b["n"] = json!(n);
            b["max_tokens"] = json!(300);
            let resp = post_keyed(&base, KEY, &b).await;
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let (status, v) = call(4).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["type"], "insufficient_quota");
    assert!(
        error_message(&v).starts_with(
            "The per-minute token quota of key `k1` would be exceeded: 0 of 1000 tokens"
        ),
        "{v}"
    );
    assert_eq!(gw.mock.request_count(), 0);
    let (status, v) = call(1).await;
    assert_eq!(status, 200, "{v}");
}
