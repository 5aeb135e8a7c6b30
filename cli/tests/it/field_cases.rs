//! Field cases from the providers issue (FC-06, FC-07, FC-10, FC-12, FC-17), end to end through the
//! gateway with the mock's wire fixtures, asserting the exact values a user would check.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use switchyard_schemas::usage::UsageStatus;
use switchyard_schemas::{ErrorClass, UsageKind};

/// A `demo/claude` stream whose mock upstream replays `fixture`.
async fn claude_fixture_sse(base: &str, fixture: &str) -> SseBody {
    post_sse(
        base,
        &chat("demo/claude", &format!("#mock fixture={fixture}"), true),
    )
    .await
}

/// FC-06: Anthropic stream `Hi`, ` there`, then `event: error` overloaded_error and a close without
/// `message_stop`: the client gets `Hi there` then an error, never `stop`/`[DONE]`; class overloaded.
#[tokio::test]
async fn fc06_anthropic_error_after_content() {
    let gw = billed_gateway().await;
    let r = claude_fixture_sse(&gw.base, "fc06_anthropic_overloaded").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "Hi there");
    assert_eq!(r.done_count(), 0);
    assert_eq!(r.finish_reason(), None);
    let last = r.json_events().last().cloned().unwrap();
    assert_eq!(last["error"]["code"], "overloaded");
    let rows = ledger_rows(gw.ledger.as_ref().unwrap(), request_id(&r.headers), 2).await;
    for row in rows {
        assert_eq!(row.status, UsageStatus::Error);
        assert_eq!(row.error_class, Some(ErrorClass::Overloaded));
    }
}

/// FC-07: `200 text/event-stream` whose only data is an OpenAI-style context-length error, then
/// `[DONE]`: HTTP 400 with the upstream message, and no fallback target called.
#[tokio::test]
async fn fc07_error_inside_200_stream_before_content() {
    let gw = start(Options::default()).await;
    for stream in [true, false] {
        gw.mock.state().clear();
        let body = chat(
            "demo/mock-then-claude",
            "#mock fixture=fc07_openai_error_in_200",
            stream,
        );
        let (status, _, body) = post_json(&gw.base, &body).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "context_length_exceeded");
        let msg = error_message(&body);
        assert!(
            msg.contains("This model's maximum context length is 8192 tokens."),
            "{msg}"
        );
        // Only the first target was called.
        assert_eq!(gw.mock.request_count(), 1);
        assert_eq!(gw.mock.requests()[0].path, "/v1/chat/completions");
    }
}

/// FC-10: cache-write usage in `message_delta` (and the variant with it in `message_start`):
/// prompt 9033, completion 5, total 9038, cache-write 4511, cost $0.03055725, nothing doubled.
#[tokio::test]
async fn fc10_anthropic_cache_write_usage_and_cost() {
    let gw = billed_gateway().await;
    for fixture in [
        "fc10_anthropic_usage_in_delta",
        "fc10_anthropic_usage_in_start",
    ] {
        let prompt = format!("#mock fixture={fixture}");
        let (status, headers, body) =
            post_json(&gw.base, &chat("anthropic/claude-sonnet-4", &prompt, false)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"], "Cached.");
        assert_eq!(body["usage"]["prompt_tokens"], 9033);
        assert_eq!(body["usage"]["completion_tokens"], 5);
        assert_eq!(body["usage"]["total_tokens"], 9038);
        let ledger = gw.ledger.as_ref().unwrap();
        let id = request_id(&headers);
        let rows = ledger_rows(ledger, id, 2).await;
        let upstream = rows.iter().find(|r| r.kind == UsageKind::Upstream).unwrap();
        assert_eq!(upstream.usage.prompt_tokens, 9033);
        assert_eq!(upstream.usage.cache_write_tokens, 4511);
        assert_eq!(upstream.usage.cached_tokens, 0);
        assert_eq!(upstream.usage.completion_tokens, 5);
        let cost = ledger
            .cost_of(id, UsageKind::Upstream, 0)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(cost.to_string(), "0.03055725", "{fixture}");
    }
}

/// FC-12: usage is always asked upstream; the client sees the usage chunk only when it asked.
#[tokio::test]
async fn fc12_usage_chunk_only_when_asked() {
    let gw = billed_gateway().await;
    let prompt = "#mock prompt_tokens=12 completion_tokens=5";
    let options = [None, Some(false), Some(true)];
    let mut ids = Vec::new();
    for opt in options {
        let mut body = chat("demo/mock", prompt, true);
        if let Some(include) = opt {
            body["stream_options"] = serde_json::json!({"include_usage": include});
        }
        let r = post_sse(&gw.base, &body).await;
        assert_eq!(r.status, 200);
        let usage_chunks: Vec<_> = r
            .json_events()
            .into_iter()
            .filter(|e| e["choices"] == serde_json::json!([]))
            .collect();
        let expected = usize::from(opt == Some(true));
        assert_eq!(usage_chunks.len(), expected, "{opt:?}");
        if let Some(u) = usage_chunks.first() {
            assert_eq!(u["usage"]["prompt_tokens"], 12);
            assert_eq!(u["usage"]["completion_tokens"], 5);
            assert_eq!(u["usage"]["total_tokens"], 17);
        }
        ids.push(request_id(&r.headers));
    }
    for up in gw.mock.requests() {
        assert_eq!(up.body["stream_options"]["include_usage"], true);
    }
    for id in ids {
        for row in ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await {
            assert_eq!(
                (row.usage.prompt_tokens, row.usage.completion_tokens),
                (12, 5)
            );
        }
    }
}

/// FC-17: Anthropic text block + tool_use `toolu_A` (index 1) + `toolu_B` (index 2) become OpenAI
/// tool_calls index 0 and 1 with the accumulated arguments and finish_reason `tool_calls`.
#[tokio::test]
async fn fc17_anthropic_tool_use_blocks_to_openai_indexes() {
    let gw = start(Options::default()).await;
    let r = claude_fixture_sse(&gw.base, "fc17_anthropic_two_tools").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "Let me check.");
    assert_eq!(r.finish_reason().as_deref(), Some("tool_calls"));
    let mut calls: Vec<(String, String, String)> = vec![Default::default(); 2];
    for e in r.json_events() {
        let Some(tcs) = e
            .pointer("/choices/0/delta/tool_calls")
            .and_then(|v| v.as_array())
        else {
            continue;
        };
        for tc in tcs {
            let i = tc["index"].as_u64().unwrap() as usize;
            if let Some(id) = tc["id"].as_str() {
                calls[i].0 = id.to_owned();
            }
            if let Some(name) = tc["function"]["name"].as_str() {
                calls[i].1 = name.to_owned();
            }
            calls[i]
                .2
                .push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(
        calls,
        vec![
            (
                "toolu_A".into(),
                "get_weather".into(),
                r#"{"city":"Paris"}"#.into()
            ),
            (
                "toolu_B".into(),
                "get_time".into(),
                r#"{"tz":"UTC"}"#.into()
            ),
        ]
    );
    let (_, _, body) = post_json(
        &gw.base,
        &chat(
            "demo/claude",
            "#mock fixture=fc17_anthropic_two_tools",
            false,
        ),
    )
    .await;
    let tcs = body["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap();
    assert_eq!(tcs.len(), 2);
    assert_eq!(tcs[1]["id"], "toolu_B");
    assert_eq!(tcs[1]["function"]["arguments"], r#"{"tz":"UTC"}"#);
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
}
