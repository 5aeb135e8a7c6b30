//! Issue 12: what coding agents and the newest SDKs send works unchanged. The lenient OpenAI
//! door (`store`, `service_tier`, `reasoning_effort`, `logprobs`, replayed `model_dump()`
//! history), `GET /v1/models/{id}`, legacy `POST /v1/completions`; the Anthropic door at full
//! fidelity (passthrough of Anthropic-only fields and `anthropic-beta`, thinking blocks — FC-37),
//! `count_tokens` (FC-43), Anthropic error envelopes and 529, argument-less tool calls (FC-38).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};
use switchyard_mock::DEFAULT_TEXT;

async fn send_json(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let (status, h, text) = post_to(base, path, headers, body).await;
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, h, v)
}

/// Streams chat `body` (asserting 200): its `data:` events.
async fn streamed_chat(base: &str, body: &Value) -> Vec<Value> {
    let (status, _, text) = post_to(base, "/v1/chat/completions", &[], body).await;
    assert_eq!(status, 200, "{text}");
    data_events(&text)
}

/// The strings at `pointer` of the `events` that have one, in order.
fn strings_at<'a>(events: &'a [Value], pointer: &'a str) -> impl Iterator<Item = &'a str> {
    events
        .iter()
        .filter_map(move |e| e.pointer(pointer).and_then(Value::as_str))
}

const ANTHROPIC: &[(&str, &str)] = &[("x-api-key", "sk-x"), ("anthropic-version", "2023-06-01")];

/// What the official SDKs send today is accepted, `null`s and replayed history included; OpenAI
/// gets `reasoning_effort`, `logprobs` and `service_tier`, an Anthropic upstream a thinking budget.
#[tokio::test]
async fn lenient_openai_door() {
    let gw = start(Options::default()).await;
    let body = json!({"model": "demo/mock", "store": false, "service_tier": "auto",
        "logprobs": false, "top_logprobs": null, "reasoning_effort": "low", "metadata": {"k": "v"},
        "modalities": ["text"], "prediction": null, "user": "u-1", "temperature": null,
        "stream": true, "stream_options": {"include_usage": true, "include_obfuscation": false},
        "messages": [
            {"role": "user", "content": "What time is it?", "name": null},
            {"role": "assistant", "content": null, "refusal": null, "audio": null,
             "annotations": [], "function_call": null,
             "tool_calls": [{"id": "call_1", "function": {"name": "now", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
            {"role": "assistant", "content": "It is noon.", "refusal": null, "tool_calls": null,
             "function_call": null, "audio": null},
            {"role": "user", "content": "Thanks"}]});
    let events = streamed_chat(&gw.base, &body).await;
    let content: String = strings_at(&events, "/choices/0/delta/content").collect();
    assert_eq!(content, DEFAULT_TEXT);
    let sent = &gw.mock.requests()[0].body;
    assert_eq!(sent["reasoning_effort"], "low");
    assert_eq!(sent["logprobs"], false);
    assert_eq!(sent["service_tier"], "auto");
    assert_eq!(sent["user"], "u-1");
    assert!(sent.get("store").is_none() && sent.get("metadata").is_none());
    assert_eq!(sent["messages"][1]["tool_calls"][0]["type"], "function");
    assert!(sent["messages"][3].get("tool_calls").is_none());

    // To an Anthropic upstream: a thinking budget instead; OpenAI-only fields stay behind.
    let mut body = body.clone();
    body["model"] = json!("demo/claude");
    body["max_completion_tokens"] = json!(3000);
    let (status, _, text) = post_to(&gw.base, "/v1/chat/completions", &[], &body).await;
    assert_eq!(status, 200, "{text}");
    let sent = &gw.mock.requests()[1].body;
    assert_eq!(
        sent["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );
    assert_eq!(sent["max_tokens"], 3000);
    for k in ["service_tier", "reasoning_effort", "logprobs", "store"] {
        assert!(sent.get(k).is_none(), "{k}: {sent}");
    }

    // Legacy functions.
    let body = json!({"model": "demo/mock", "functions": [{"name": "get_weather",
        "parameters": {"type": "object"}}], "function_call": "auto",
        "messages": [{"role": "user", "content": "Weather?\n#mock tool_calls=1"}]});
    let (status, _, v) = send_json(&gw.base, "/v1/chat/completions", &[], &body).await;
    assert_eq!(status, 200, "{v}");
    // Answered in the legacy shape the client spoke: `function_call`, no `tool_calls`.
    let message = &v["choices"][0]["message"];
    assert_eq!(message["function_call"]["name"], "get_weather");
    assert!(message["function_call"]["arguments"].is_string());
    assert!(message.get("tool_calls").is_none(), "{message}");
    assert_eq!(v["choices"][0]["finish_reason"], "function_call");
    assert_eq!(gw.mock.requests()[2].body["tool_choice"], "auto");
    // Streamed: `function_call` deltas and finish reason `function_call`.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = streamed_chat(&gw.base, &streamed).await;
    let name: String = strings_at(&events, "/choices/0/delta/function_call/name").collect();
    assert_eq!(name, "get_weather");
    assert!(
        events
            .iter()
            .all(|e| e.pointer("/choices/0/delta/tool_calls").is_none())
    );
    assert!(
        events
            .iter()
            .any(|e| e.pointer("/choices/0/finish_reason") == Some(&json!("function_call")))
    );

    // Unknown fields are still OpenAI's 400.
    let body =
        json!({"model": "demo/mock", "bogus": 1, "messages": [{"role": "user", "content": "x"}]});
    let (status, _, v) = send_json(&gw.base, "/v1/chat/completions", &[], &body).await;
    assert_eq!(status, 400);
    assert_eq!(
        v["error"]["message"],
        "Unrecognized request argument supplied: bogus"
    );
}

#[tokio::test]
async fn model_by_id_and_legacy_completions() {
    let gw = start(Options::default()).await;
    let get = |path: String| async move {
        let r = reqwest::get(path).await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let (status, v) = get(format!("{}/v1/models/demo/claude", gw.base)).await;
    assert_eq!(status, 200);
    assert_eq!(
        v,
        json!({"id": "demo/claude", "object": "model", "created": 0, "owned_by": "demo"})
    );
    let (status, v) = get(format!("{}/v1/models/nope", gw.base)).await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["type"], "invalid_request_error");

    let body = json!({"model": "demo/mock", "prompt": "Say this is a test", "max_tokens": 7,
        "temperature": 0, "stop": ["\n"]});
    let (status, _, v) = send_json(&gw.base, "/v1/completions", &[], &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(
        v["choices"],
        json!([{"text": "Hello from the Switchyard mock upstream. Every", "index": 0, "logprobs": null, "finish_reason": "length"}])
    );
    assert_eq!(v["usage"]["completion_tokens"], 7);
    let sent = &gw.mock.requests()[0].body;
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": "Say this is a test"}])
    );
    assert_eq!(sent["max_completion_tokens"], 7);
    assert_eq!(sent["stop"], json!(["\n"]));

    let body = json!({"model": "demo/mock", "prompt": ["Hi"], "stream": true});
    let (status, _, text) = post_to(&gw.base, "/v1/completions", &[], &body).await;
    assert_eq!(status, 200);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events = data_events(&text);
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, DEFAULT_TEXT);
    assert!(events.iter().all(|e| e["object"] == "text_completion"));
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    // Default max_tokens 16, as the legacy API.
    assert_eq!(gw.mock.requests()[1].body["max_completion_tokens"], 16);
}

/// Claude Code's first request shape: Anthropic-only fields reach the Anthropic upstream
/// unchanged (with `anthropic-beta`), a mid-conversation system message is accepted, and the same
/// body served by an OpenAI upstream is answered without them.
#[tokio::test]
async fn anthropic_passthrough_and_other_providers() {
    let gw = start(Options::default()).await;
    let system = json!([{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]);
    let tools = json!([{"name": "Bash", "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        "cache_control": {"type": "ephemeral"}}]);
    let body = |model: &str| {
        json!({"model": model, "max_tokens": 32000, "stream": true,
        "system": system, "tools": tools, "tool_choice": {"type": "auto"},
        "thinking": {"type": "adaptive"}, "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"}, "metadata": {"user_id": "user_abc"}, "top_k": 40,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "Reminder: be brief."},
            {"role": "user", "content": "please"}]})
    };
    let headers = [
        ANTHROPIC,
        &[(
            "anthropic-beta",
            "claude-code-20250219,interleaved-thinking-2025-05-14",
        )],
    ]
    .concat();
    let (status, _, text) = post_to(
        &gw.base,
        "/v1/messages?beta=true",
        &headers,
        &body("demo/claude"),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let r = &gw.mock.requests()[0];
    assert_eq!(
        r.header("anthropic-beta"),
        Some("claude-code-20250219,interleaved-thinking-2025-05-14")
    );
    for (k, v) in [
        ("thinking", json!({"type": "adaptive"})),
        (
            "context_management",
            body("x")["context_management"].clone(),
        ),
        ("output_config", json!({"effort": "medium"})),
        ("metadata", json!({"user_id": "user_abc"})),
        ("top_k", json!(40)),
        ("tools", tools.clone()),
    ] {
        assert_eq!(r.body[k], v, "{k}");
    }
    assert_eq!(
        r.body["system"],
        json!([system[0], {"type": "text", "text": "Reminder: be brief."}])
    );
    assert_eq!(
        r.body["messages"],
        json!([{"role": "user", "content": [
        {"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "please"}]}])
    );

    let (status, _, text) = post_to(&gw.base, "/v1/messages", &headers, &body("demo/mock")).await;
    assert_eq!(status, 200, "{text}");
    let sent = &gw.mock.requests()[1].body;
    for k in [
        "thinking",
        "context_management",
        "output_config",
        "top_k",
        "metadata",
    ] {
        assert!(sent.get(k).is_none(), "{k}: {sent}");
    }
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "You are Claude Code."})
    );
    assert_eq!(
        sent["messages"][2],
        json!({"role": "system", "content": "Reminder: be brief."})
    );
    assert_eq!(sent["tools"][0]["function"]["name"], "Bash");
    assert_eq!(
        sent["messages"][1],
        json!({"role": "user", "content": "say hi"})
    );
}

/// FC-37: a streamed thinking block (thinking_delta × 2, signature_delta) reaches /v1/messages
/// clients unchanged, the chat view as reasoning, and the turn replays on both routes.
#[tokio::test]
async fn fc37_thinking_block_round_trip() {
    let gw = start(Options::default()).await;
    let ask =
        json!({"role": "user", "content": "What is 2+2?\n#mock fixture=fc37_anthropic_thinking"});
    let body = json!({"model": "demo/claude", "max_tokens": 2048, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": [ask]});
    let (status, _, text) = post_to(&gw.base, "/v1/messages", ANTHROPIC, &body).await;
    assert_eq!(status, 200, "{text}");
    let got = named_events(&text);
    let upstream = named_events(include_str!(
        "../../../mock/src/fixtures/fc37_anthropic_thinking.sse"
    ));
    // Every content-block event is byte-for-byte the upstream's.
    let blocks = |evs: &[(String, Value)]| -> Vec<Value> {
        evs.iter()
            .filter(|(n, _)| n.starts_with("content_block"))
            .map(|(_, d)| d.clone())
            .collect()
    };
    assert_eq!(blocks(&got), blocks(&upstream));
    assert_eq!(got.last().unwrap().0, "message_stop");
    assert_eq!(
        gw.mock.requests()[0].body["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );

    // Non-streamed: exactly one thinking block with the full text and the signature.
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    let (status, _, m) = send_json(&gw.base, "/v1/messages", ANTHROPIC, &plain).await;
    assert_eq!(status, 200, "{m}");
    let thinking = json!({"type": "thinking", "thinking": "Let me add 2 and 2.", "signature": "EqQBCkYIBRgCKkA1"});
    assert_eq!(
        m["content"],
        json!([thinking, {"type": "text", "text": "4"}])
    );

    // The chat view: reasoning_content deltas, then the signature as a thinking block.
    let chat = json!({"model": "demo/claude", "stream": true, "messages": [ask]});
    let events = streamed_chat(&gw.base, &chat).await;
    let reasoning: Vec<&str> = strings_at(&events, "/choices/0/delta/reasoning_content").collect();
    assert_eq!(reasoning, ["Let me add ", "2 and 2."]);
    let sig: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.pointer("/choices/0/delta/thinking_blocks/0"))
        .collect();
    assert_eq!(
        sig,
        [&json!({"type": "thinking", "thinking": "", "signature": "EqQBCkYIBRgCKkA1"})]
    );
    let mut chat_plain = chat.clone();
    chat_plain["stream"] = json!(false);
    let (_, _, c) = send_json(&gw.base, "/v1/chat/completions", &[], &chat_plain).await;
    let msg = &c["choices"][0]["message"];
    assert_eq!(msg["content"], "4");
    assert_eq!(msg["reasoning_content"], "Let me add 2 and 2.");
    assert_eq!(msg["thinking_blocks"], json!([thinking]));

    // Replays: the Anthropic route with the assistant's content blocks, the chat route with the
    // message as received; both reach the upstream with the signed block first.
    gw.mock.state().clear();
    let next = json!({"role": "user", "content": "And 3+3?"});
    let replay = json!({"model": "demo/claude", "max_tokens": 2048,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [ask, {"role": "assistant", "content": m["content"]}, next]});
    let (status, _, v) = send_json(&gw.base, "/v1/messages", ANTHROPIC, &replay).await;
    assert_eq!(status, 200, "{v}");
    let mut chat_msg = msg.clone();
    chat_msg.as_object_mut().unwrap().remove("refusal");
    let replay = json!({"model": "demo/claude", "messages": [ask, chat_msg, next]});
    let (status, _, v) = send_json(&gw.base, "/v1/chat/completions", &[], &replay).await;
    assert_eq!(status, 200, "{v}");
    for r in gw.mock.requests() {
        assert_eq!(
            r.body["messages"][1],
            json!({"role": "assistant", "content": [thinking, {"type": "text", "text": "4"}]})
        );
    }
}

/// FC-43: count_tokens with a virtual key, `anthropic-beta`, `system` and one tool: the
/// upstream's own count; its 401 comes back as 401 in Anthropic's envelope. No usage, no spend.
#[tokio::test]
async fn fc43_count_tokens() {
    let gw = start(Options {
        config: test_config(
            json!({"keys": [{"id": "k1", "tenant": "t1", "key": "sk-sy-virtual-0123456789"}]}),
        ),
        billing: true,
        ..Options::default()
    })
    .await;
    let headers = [
        ("x-api-key", "sk-sy-virtual-0123456789"),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "token-counting-2024-11-01"),
    ];
    let body = |directives: &str| {
        json!({"model": "demo/claude", "system": "You are a weather bot.",
        "tools": [{"name": "get_weather", "description": "Weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [{"role": "user", "content": format!("Weather in Paris?\n#mock {directives}")}]})
    };
    let (status, h, v) = send_json(
        &gw.base,
        "/v1/messages/count_tokens?beta=true",
        &headers,
        &body("prompt_tokens=728"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v, json!({"input_tokens": 728}));
    assert_eq!(h["x-switchyard-token-count"], "exact");
    let r = &gw.mock.requests()[0];
    assert_eq!(r.path, "/v1/messages/count_tokens");
    assert_eq!(r.body["system"], "You are a weather bot.");
    assert_eq!(r.body["tools"][0]["name"], "get_weather");
    assert_eq!(r.body["model"], "claude-test");
    assert!(r.body.get("max_tokens").is_none());
    assert_eq!(
        r.header("anthropic-beta"),
        Some("token-counting-2024-11-01")
    );

    let (status, _, v) = send_json(
        &gw.base,
        "/v1/messages/count_tokens",
        &headers,
        &body("status=401"),
    )
    .await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");

    // An OpenAI-style target has no count endpoint: the local estimate, marked.
    let mut b = body("");
    b["model"] = json!("demo/mock");
    let (status, h, v) = send_json(&gw.base, "/v1/messages/count_tokens", &headers, &b).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["input_tokens"].as_u64().unwrap() > 10, "{v}");
    assert_eq!(h["x-switchyard-token-count"], "estimate");
    assert_eq!(
        gw.mock.requests().len(),
        2,
        "no upstream call for an estimate"
    );
    // Counting never reaches the ledger: after one chat request's two rows (upstream + charge)
    // are in, the ledger holds exactly those.
    let chat_body = json!({"model": "demo/claude", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    let (status, h, _) = send_json(&gw.base, "/v1/messages", &headers, &chat_body).await;
    assert_eq!(status, 200);
    let ledger = gw.ledger.as_ref().unwrap();
    let id = h["x-request-id"].to_str().unwrap().parse().unwrap();
    ledger_rows(ledger, id, 2).await;
    assert_eq!(ledger.count().await.unwrap(), 2);
}

/// Errors on Anthropic paths use Anthropic's envelope; an upstream 529 stays 529.
#[tokio::test]
async fn anthropic_errors_and_529() {
    let gw = start(Options::default()).await;
    let (status, _, v) = send_json(
        &gw.base,
        "/v1/messages/batches/x/cancelled",
        ANTHROPIC,
        &json!({}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "not_found_error");
    let body = json!({"model": "demo/claude", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi\n#mock status=529"}]});
    let (status, _, v) = send_json(&gw.base, "/v1/messages", ANTHROPIC, &body).await;
    assert_eq!(status, 529, "{v}");
    assert_eq!(v["error"]["type"], "overloaded_error");
    // The OpenAI door keeps 503.
    let (status, _, v) = post_json(
        &gw.base,
        &chat("demo/claude", "hi\n#mock status=529", false),
    )
    .await;
    assert_eq!(status, 503, "{v}");
}

/// FC-38: parallel tool calls, one without arguments: `"{}"` streamed and non-streamed, and the
/// turn replayed to an Anthropic upstream sends `"input": {}`.
#[tokio::test]
async fn fc38_tool_call_without_arguments() {
    let gw = start(Options::default()).await;
    let ask = "Weather and time?\n#mock fixture=fc38_openai_parallel_no_args";
    let r = post_sse(&gw.base, &chat("demo/mock", ask, true)).await;
    assert_eq!(r.status, 200);
    let mut args = vec![String::new(); 2];
    for tc in r.tool_call_deltas() {
        args[tc["index"].as_u64().unwrap() as usize]
            .push_str(tc["function"]["arguments"].as_str().unwrap());
    }
    assert_eq!(args, ["{\"city\":\"Paris\"}", "{}"]);
    assert_eq!(r.finish_reason().as_deref(), Some("tool_calls"));
    let (status, _, v) = post_json(&gw.base, &chat("demo/mock", ask, false)).await;
    assert_eq!(status, 200);
    let calls = &v["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    assert_eq!(calls[1]["function"]["arguments"], "{}");

    // The Anthropic door streams both tool_use blocks with valid JSON input.
    let body = json!({"model": "demo/mock", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": ask}]});
    let (status, _, text) = post_to(&gw.base, "/v1/messages", ANTHROPIC, &body).await;
    assert_eq!(status, 200);
    let mut inputs = vec![String::new(); 2];
    for (_, d) in named_events(&text) {
        if let Some(p) = d.pointer("/delta/partial_json").and_then(Value::as_str) {
            inputs[d["index"].as_u64().unwrap() as usize].push_str(p);
        }
    }
    assert_eq!(inputs, ["{\"city\":\"Paris\"}", "{}"]);

    // Replay the turn to the Anthropic upstream, from both doors.
    let history = json!([
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": null, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_w", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_t", "content": "12:00"}]);
    let (status, _, v) = post_json(
        &gw.base,
        &json!({"model": "demo/claude", "messages": history}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let sent = gw.mock.requests().last().unwrap().body.clone();
    assert_eq!(
        sent["messages"][1]["content"][1],
        json!({"type": "tool_use", "id": "call_t", "name": "get_time", "input": {}})
    );
    let content = json!([{"type": "tool_use", "id": "call_w", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_t", "name": "get_time", "input": {}}]);
    let body = json!({"model": "demo/claude", "max_tokens": 100, "messages": [
        {"role": "user", "content": "Weather and time?"}, {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_w", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "call_t", "content": "12:00"}]}]});
    let (status, _, v) = send_json(&gw.base, "/v1/messages", ANTHROPIC, &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        gw.mock.requests().last().unwrap().body["messages"][1]["content"],
        content
    );
}

/// `logprobs` reach an OpenAI-style upstream and its `logprobs.content` entries come back,
/// streamed and not; an Anthropic upstream gets no `logprobs`.
#[tokio::test]
async fn logprobs_pass_through() {
    let gw = start(Options::default()).await;
    let body = json!({"model": "demo/mock", "logprobs": true, "top_logprobs": 0,
        "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, v) = send_json(&gw.base, "/v1/chat/completions", &[], &body).await;
    assert_eq!(status, 200, "{v}");
    let entries = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let tokens: String = entries
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert_eq!(tokens, DEFAULT_TEXT);
    assert_eq!(entries.len(), 13);
    assert!(entries.iter().all(|e| e["logprob"] == -0.5));
    let sent = &gw.mock.requests()[0].body;
    assert_eq!(
        (sent["logprobs"].clone(), sent["top_logprobs"].clone()),
        (json!(true), json!(0))
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, _, text) = post_to(&gw.base, "/v1/chat/completions", &[], &streamed).await;
    assert_eq!(status, 200);
    let tokens: String = data_events(&text)
        .iter()
        .filter_map(|e| {
            e.pointer("/choices/0/logprobs/content")
                .and_then(Value::as_array)
        })
        .flatten()
        .map(|e| e["token"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tokens, DEFAULT_TEXT);
    // As in OpenAI's own stream, each chunk's logprobs ride on that chunk's content.
    for e in data_events(&text) {
        if let Some(lp) = e
            .pointer("/choices/0/logprobs/content")
            .and_then(Value::as_array)
        {
            let token: String = lp.iter().map(|t| t["token"].as_str().unwrap()).collect();
            assert_eq!(
                e["choices"][0]["delta"]["content"].as_str(),
                Some(token.as_str()),
                "{e}"
            );
        }
    }

    let mut claude = body.clone();
    claude["model"] = json!("demo/claude");
    let (status, _, v) = send_json(&gw.base, "/v1/chat/completions", &[], &claude).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    assert!(gw.mock.requests()[2].body.get("logprobs").is_none());
}

/// Anthropic server tools (`web_search_…`) are accepted: an Anthropic upstream gets them
/// unchanged, an OpenAI-style one only the custom tools.
#[tokio::test]
async fn server_tools_reach_anthropic_only() {
    let gw = start(Options::default()).await;
    let tools = json!([{"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
        {"name": "get_weather", "input_schema": {"type": "object"}}]);
    let body = |model: &str| {
        json!({"model": model, "max_tokens": 64, "tools": tools,
        "messages": [{"role": "user", "content": "News?"}]})
    };
    let (status, _, v) = send_json(&gw.base, "/v1/messages", ANTHROPIC, &body("demo/claude")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(gw.mock.requests()[0].body["tools"], tools);
    let (status, _, v) = send_json(&gw.base, "/v1/messages", ANTHROPIC, &body("demo/mock")).await;
    assert_eq!(status, 200, "{v}");
    let sent = &gw.mock.requests()[1].body["tools"];
    assert_eq!(sent.as_array().unwrap().len(), 1);
    assert_eq!(sent[0]["function"]["name"], "get_weather");
}

/// Claude Code's `metadata.user_id` (a JSON text over OpenAI's 64-character `user` limit)
/// reaches an OpenAI-style upstream as its SHA-256 (64 hex characters), Anthropic unchanged.
#[tokio::test]
async fn long_user_ids_fit_openai() {
    let gw = start(Options::default()).await;
    let user_id = r#"{"device_id":"68414b438263708e3c5d8d28a12d9e3cf4e4a041e5bcf2d023008378597112e2","account_uuid":"","session_id":"597b40ff-c118-4eab-a281-4b5e50a25146"}"#;
    let body = |model: &str| {
        json!({"model": model, "max_tokens": 32, "metadata": {"user_id": user_id},
        "messages": [{"role": "user", "content": "hi"}]})
    };
    let (status, _, v) = send_json(&gw.base, "/v1/messages", ANTHROPIC, &body("demo/mock")).await;
    assert_eq!(status, 200, "{v}");
    let sent = &gw.mock.requests()[0].body["user"];
    assert_eq!(
        sent,
        &json!(switchyard_schemas::tenancy::sha256_hex(user_id))
    );
    let (status, _, v) = send_json(&gw.base, "/v1/messages", ANTHROPIC, &body("demo/claude")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(gw.mock.requests()[1].body["metadata"]["user_id"], user_id);
}
