//! The capability matrix: the same behavioural tests (plain chat, stream, tools, stream + tools,
//! image, JSON mode, usage, error classes) against every provider family through the mock
//! upstream, which reproduces each provider's documented wire format. One table row per provider
//! states what it supports; unsupported combinations must be a clear 400 naming the parameter.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};
use switchyard_mock::DEFAULT_TEXT;

/// What a provider family supports through Switchyard.
struct Row {
    model: &'static str,
    /// `response_format: json_object` is translated (else: 400 naming `response_format`).
    json_mode: bool,
    /// Image by http(s) URL is translated (else: 400; data URLs always work).
    image_url: bool,
}

const ROWS: &[Row] = &[
    Row {
        model: "m/openai",
        json_mode: true,
        image_url: true,
    },
    Row {
        model: "m/openai_compatible",
        json_mode: true,
        image_url: true,
    },
    Row {
        model: "m/azure_openai",
        json_mode: true,
        image_url: true,
    },
    Row {
        model: "m/anthropic",
        json_mode: true,
        image_url: true,
    },
    Row {
        model: "m/gemini",
        json_mode: true,
        image_url: true,
    },
    Row {
        model: "m/bedrock",
        json_mode: false,
        image_url: false,
    },
];

fn matrix_config() -> switchyard_schemas::config::GatewayConfig {
    let mut targets = Vec::new();
    let mut models = Vec::new();
    for (provider, extra) in [
        ("openai", json!({})),
        ("openai_compatible", json!({})),
        ("azure_openai", json!({"api_version": "2024-10-21"})),
        ("anthropic", json!({})),
        ("gemini", json!({})),
        (
            "bedrock",
            json!({"aws": {"region": "us-east-1", "access_key_id": "AKIDEXAMPLE", "secret_access_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}}),
        ),
    ] {
        let mut t = json!({"id": format!("t-{provider}"), "provider": provider, "base_url": "builtin:mock", "upstream_model": "mock-model"});
        for (k, v) in extra.as_object().unwrap() {
            t[k] = v.clone();
        }
        targets.push(t);
        models.push(json!({"id": format!("m/{provider}"), "targets": [format!("t-{provider}")]}));
    }
    let c: switchyard_schemas::config::GatewayConfig = serde_json::from_value(json!({
        "targets": targets, "models": models,
        "timeouts": {"first_frame_ms": 2000, "worker_silence_ms": 3000, "heartbeat_ms": 200}
    }))
    .unwrap();
    c.validate().unwrap();
    c
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}
    ])
}

async fn gateway() -> Gateway {
    start_config(matrix_config()).await
}

#[tokio::test]
async fn plain_chat_and_usage() {
    let gw = gateway().await;
    for row in ROWS {
        let (status, _, body) = post_json(&gw.base, &chat(row.model, "one two three", false)).await;
        assert_eq!(status, 200, "{}: {body}", row.model);
        assert_eq!(
            body["choices"][0]["message"]["content"], DEFAULT_TEXT,
            "{}",
            row.model
        );
        assert_eq!(body["choices"][0]["finish_reason"], "stop", "{}", row.model);
        assert_eq!(body["model"], row.model);
        assert_eq!(body["usage"]["prompt_tokens"], 3, "{}", row.model);
        assert_eq!(body["usage"]["completion_tokens"], 13, "{}", row.model);
    }
}

#[tokio::test]
async fn streaming() {
    let gw = gateway().await;
    for row in ROWS {
        let mut body = chat(row.model, "one two three", true);
        body["stream_options"] = json!({"include_usage": true});
        let r = post_sse(&gw.base, &body).await;
        assert_eq!(r.status, 200, "{}", row.model);
        assert_eq!(r.content(), DEFAULT_TEXT, "{}", row.model);
        assert_eq!(r.finish_reason().as_deref(), Some("stop"), "{}", row.model);
        assert_eq!(r.done_count(), 1, "{}", row.model);
        let last = r.json_events().last().cloned().unwrap();
        assert_eq!(last["usage"]["prompt_tokens"], 3, "{}", row.model);
        assert_eq!(last["usage"]["completion_tokens"], 13, "{}", row.model);
    }
}

/// Two parallel tool calls, streamed and not: names from the request's tools, JSON arguments.
#[tokio::test]
async fn tools_and_stream_tools() {
    let gw = gateway().await;
    for row in ROWS {
        for stream in [false, true] {
            let mut body = chat(row.model, "weather and time\n#mock tool_calls=2", stream);
            body["tools"] = tools();
            let calls: Vec<(String, String, String)> = if stream {
                let r = post_sse(&gw.base, &body).await;
                assert_eq!(r.status, 200, "{} stream", row.model);
                assert_eq!(
                    r.finish_reason().as_deref(),
                    Some("tool_calls"),
                    "{}",
                    row.model
                );
                let mut calls: Vec<(String, String, String)> = Vec::new();
                for tc in &r.tool_call_deltas() {
                    let i = tc["index"].as_u64().unwrap() as usize;
                    if calls.len() <= i {
                        calls.resize(i + 1, Default::default());
                    }
                    if let Some(id) = tc["id"].as_str() {
                        calls[i].0 = id.into();
                    }
                    if let Some(n) = tc["function"]["name"].as_str() {
                        calls[i].1 = n.into();
                    }
                    calls[i]
                        .2
                        .push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
                }
                calls
            } else {
                let (status, _, b) = post_json(&gw.base, &body).await;
                assert_eq!(status, 200, "{}: {b}", row.model);
                assert_eq!(
                    b["choices"][0]["finish_reason"], "tool_calls",
                    "{}",
                    row.model
                );
                b["choices"][0]["message"]["tool_calls"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| {
                        (
                            c["id"].as_str().unwrap().into(),
                            c["function"]["name"].as_str().unwrap().into(),
                            c["function"]["arguments"].as_str().unwrap().into(),
                        )
                    })
                    .collect()
            };
            assert_eq!(calls.len(), 2, "{} stream={stream}: {calls:?}", row.model);
            let names: Vec<&str> = calls.iter().map(|c| c.1.as_str()).collect();
            assert_eq!(
                names,
                vec!["get_weather", "get_time"],
                "{} stream={stream}",
                row.model
            );
            for (id, _, args) in &calls {
                assert!(!id.is_empty(), "{}", row.model);
                let v: Value = serde_json::from_str(args)
                    .unwrap_or_else(|e| panic!("{}: {args}: {e}", row.model));
                assert!(v.is_object(), "{}", row.model);
            }
        }
    }
}

/// A tool result round trip: the follow-up request with the assistant's tool calls and the tool
/// results is accepted and answered.
#[tokio::test]
async fn tool_result_round_trip() {
    let gw = gateway().await;
    for row in ROWS {
        let body = json!({
            "model": row.model,
            "tools": tools(),
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"}
            ]
        });
        let (status, _, b) = post_json(&gw.base, &body).await;
        assert_eq!(status, 200, "{}: {b}", row.model);
        assert_eq!(
            b["choices"][0]["message"]["content"], DEFAULT_TEXT,
            "{}",
            row.model
        );
    }
}

#[tokio::test]
async fn images() {
    let gw = gateway().await;
    let png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    for row in ROWS {
        for (url, supported) in [(png, true), ("https://example.com/cat.png", row.image_url)] {
            let body = json!({"model": row.model, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": url}}
            ]}]});
            let (status, _, b) = post_json(&gw.base, &body).await;
            if supported {
                assert_eq!(status, 200, "{} {url}: {b}", row.model);
                let sent = gw.mock.requests().last().unwrap().body.to_string();
                let marker = if url.starts_with("data:") {
                    "iVBORw0KGgo"
                } else {
                    "cat.png"
                };
                assert!(
                    sent.contains(marker),
                    "{}: image not sent upstream: {sent}",
                    row.model
                );
            } else {
                assert_eq!(status, 400, "{} {url}: {b}", row.model);
                assert!(
                    b["error"]["param"]
                        .as_str()
                        .unwrap_or("")
                        .contains("messages"),
                    "{}: {b}",
                    row.model
                );
            }
        }
    }
}

#[tokio::test]
async fn json_mode() {
    let gw = gateway().await;
    for row in ROWS {
        let mut body = chat(
            row.model,
            "json please\n#mock text=%7B%22a%22%3A1%7D",
            false,
        );
        body["response_format"] = json!({"type": "json_object"});
        let (status, _, b) = post_json(&gw.base, &body).await;
        if row.json_mode {
            assert_eq!(status, 200, "{}: {b}", row.model);
            assert_eq!(
                b["choices"][0]["message"]["content"], "{\"a\":1}",
                "{}",
                row.model
            );
        } else {
            assert_eq!(status, 400, "{}: {b}", row.model);
            assert_eq!(b["error"]["param"], "response_format", "{}", row.model);
        }
    }
}

/// Upstream HTTP errors, in each provider's own error shape, map to the same classes.
#[tokio::test]
async fn error_classes() {
    let gw = gateway().await;
    // (mock status, client status, OpenAI error code)
    let cases = [
        (400, 400, Value::Null),
        (401, 502, json!("upstream_auth_failed")),
        (403, 502, json!("upstream_permission_denied")),
        (429, 429, json!("rate_limit_exceeded")),
        (500, 502, json!("upstream_error")),
        (503, 503, json!("overloaded")),
    ];
    for row in ROWS {
        for (mock, client, code) in &cases {
            let prompt = format!("x\n#mock status={mock}");
            let (status, _, b) = post_json(&gw.base, &chat(row.model, &prompt, false)).await;
            assert_eq!(status, *client, "{} mock {mock}: {b}", row.model);
            assert_eq!(&b["error"]["code"], code, "{} mock {mock}: {b}", row.model);
        }
    }
}

/// An error after content inside a 200 stream becomes an in-stream error event.
#[tokio::test]
async fn error_mid_stream() {
    let gw = gateway().await;
    for row in ROWS {
        let r = post_sse(&gw.base, &chat(row.model, "x\n#mock error_after=2", true)).await;
        assert_eq!(r.status, 200, "{}", row.model);
        assert_eq!(r.content(), "Hello from ", "{}", row.model);
        assert_eq!(r.done_count(), 0, "{}", row.model);
        assert!(
            r.json_events().last().unwrap().get("error").is_some(),
            "{}",
            row.model
        );
    }
}

/// Deliver 8: a non-streaming client is served by a non-streaming upstream call (OpenAI-style
/// bodies without `stream`, Anthropic without `stream`, Gemini `:generateContent`, Bedrock
/// `/converse`), and a stream request answered with `application/json` (`json_for_stream=1`) is
/// read as the complete answer: one content chunk, usage, `[DONE]`.
#[tokio::test]
async fn upstream_call_fits_the_client() {
    let gw = gateway().await;
    for row in ROWS {
        gw.mock.state().clear();
        let (status, _, body) = post_json(&gw.base, &chat(row.model, "one two three", false)).await;
        assert_eq!(status, 200, "{}: {body}", row.model);
        assert_eq!(body["choices"][0]["message"]["content"], DEFAULT_TEXT);
        let sent = &gw.mock.requests()[0];
        assert_eq!(gw.mock.request_count(), 1, "{}", row.model);
        assert_eq!(sent.body.get("stream"), None, "{}", row.model);
        assert_eq!(sent.body.get("stream_options"), None, "{}", row.model);
        assert!(
            !sent.path.contains("stream") && !sent.path.contains("Stream"),
            "{}: {}",
            row.model,
            sent.path
        );

        let mut body = chat(
            row.model,
            "one two three\n#mock json_for_stream=1 prompt_tokens=3",
            true,
        );
        body["stream_options"] = json!({"include_usage": true});
        let r = post_sse(&gw.base, &body).await;
        assert_eq!(r.status, 200, "{}", row.model);
        assert_eq!(r.content(), DEFAULT_TEXT, "{}", row.model);
        let pieces = r.content_pieces();
        assert_eq!(pieces, 1, "{}: text coalesced", row.model);
        assert_eq!(r.finish_reason().as_deref(), Some("stop"), "{}", row.model);
        assert_eq!(r.done_count(), 1, "{}", row.model);
        let last = r.json_events().last().cloned().unwrap();
        assert_eq!(last["usage"]["prompt_tokens"], 3, "{}", row.model);
        assert_eq!(last["usage"]["completion_tokens"], 13, "{}", row.model);
    }
}
