//! The Anthropic front door, `POST /v1/messages`, end to end: HTTP → ingress → NATS → worker →
//! mock upstream (OpenAI format `demo/mock`, Anthropic format `demo/claude`) → Anthropic
//! `Message` objects and stream events (Anthropic API reference, "Messages", "Streaming Messages").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};
use switchyard_mock::DEFAULT_TEXT;

/// Both upstream wire formats behind the one front door.
const MODELS: [&str; 2] = ["demo/mock", "demo/claude"];

fn messages_body(model: &str, content: &str, stream: bool) -> Value {
    json!({"model": model, "max_tokens": 256, "stream": stream,
        "messages": [{"role": "user", "content": content}]})
}

async fn post_messages(base: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", "sk-anything")
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn post_message_json(base: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    read_json(post_messages(base, body).await).await
}

/// A streamed answer: `(event name, data)` pairs in order.
struct Events {
    status: u16,
    headers: reqwest::header::HeaderMap,
    events: Vec<(String, Value)>,
}

impl Events {
    fn names(&self) -> Vec<&str> {
        self.events.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// All `text_delta` text joined.
    fn text(&self) -> String {
        self.events
            .iter()
            .filter_map(|(_, d)| d.pointer("/delta/text").and_then(Value::as_str))
            .collect()
    }

    fn last(&self, name: &str) -> &Value {
        let found = self.events.iter().rev().find(|(n, _)| n == name);
        &found.unwrap_or_else(|| panic!("no {name} event")).1
    }
}

async fn post_stream(base: &str, body: &Value) -> Events {
    let resp = post_messages(base, body).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let events = typed_events(&text);
    Events {
        status,
        headers,
        events,
    }
}

#[tokio::test]
async fn non_streamed_text_and_usage_from_both_upstream_formats() {
    let gw = start(Options::default()).await;
    for model in MODELS {
        let (status, headers, body) =
            post_message_json(&gw.base, &messages_body(model, "Say hello please", false)).await;
        assert_eq!(status, 200, "{body}");
        let request_id = headers["request-id"].to_str().unwrap();
        assert_eq!(headers["x-request-id"], request_id);
        let simple = crate::common::request_id(&headers).simple().to_string();
        assert_eq!(body["id"], format!("msg_{simple}"));
        assert_eq!(body["type"], "message");
        assert_eq!(body["role"], "assistant");
        assert_eq!(body["model"], model);
        assert_eq!(
            body["content"],
            json!([{"type": "text", "text": DEFAULT_TEXT}])
        );
        assert_eq!(body["stop_reason"], "end_turn");
        assert_eq!(body["stop_sequence"], Value::Null);
        let usage = json!({"input_tokens": 3, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0, "output_tokens": 13});
        assert_eq!(body["usage"], usage, "{model}");
    }
    // The OpenAI-format upstream got a normalised Chat Completions body.
    let sent = &gw.mock.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.body["max_completion_tokens"], 256);
    // A non-streaming client: a non-streaming upstream call.
    assert_eq!(sent.body.get("stream"), None);
}

#[tokio::test]
async fn cached_tokens_are_not_input_tokens() {
    let gw = start(Options::default()).await;
    let prompt = "#mock prompt_tokens=11 completion_tokens=5 cached_tokens=3";
    for model in MODELS {
        let (status, _, body) =
            post_message_json(&gw.base, &messages_body(model, prompt, false)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["input_tokens"], 8, "{model}");
        assert_eq!(body["usage"]["cache_read_input_tokens"], 3);
        assert_eq!(body["usage"]["output_tokens"], 5);
        let r = post_stream(&gw.base, &messages_body(model, prompt, true)).await;
        let usage = &r.last("message_delta")["usage"];
        assert_eq!(usage["input_tokens"], 8, "{model}");
        assert_eq!(usage["cache_read_input_tokens"], 3);
        assert_eq!(usage["output_tokens"], 5);
    }
}

#[tokio::test]
async fn streamed_text_has_the_exact_event_sequence() {
    let gw = start(Options::default()).await;
    for model in MODELS {
        let r = post_stream(&gw.base, &messages_body(model, "Say hello please", true)).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["content-type"], "text/event-stream");
        assert_eq!(r.headers["cache-control"], "no-cache");
        assert!(r.headers.contains_key("request-id"));
        let mut expected = vec!["message_start", "ping", "content_block_start"];
        expected.extend(["content_block_delta"; 13]);
        expected.extend(["content_block_stop", "message_delta", "message_stop"]);
        assert_eq!(r.names(), expected, "{model}");
        assert_eq!(r.text(), DEFAULT_TEXT);
        let start = &r.events[0].1["message"];
        assert_eq!(start["content"], json!([]));
        assert_eq!(start["model"], model);
        assert_eq!(start["stop_reason"], Value::Null);
        assert!(start["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(
            r.events[2].1,
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}})
        );
        assert_eq!(r.events[3].1["delta"]["type"], "text_delta");
        let delta = r.last("message_delta");
        assert_eq!(
            delta["delta"],
            json!({"stop_reason": "end_turn", "stop_sequence": null})
        );
        assert_eq!(delta["usage"]["input_tokens"], 3);
        assert_eq!(delta["usage"]["output_tokens"], 13);
    }
}

fn weather_tools() -> Value {
    json!([{"name": "get_weather", "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])
}

#[tokio::test]
async fn tool_use_round_trip() {
    let gw = start(Options::default()).await;
    let question = "Weather in two cities?\n#mock tool_calls=2";
    for (n, model) in MODELS.into_iter().enumerate() {
        let mut body = messages_body(model, question, false);
        body["tools"] = weather_tools();
        let (status, _, first) = post_message_json(&gw.base, &body).await;
        assert_eq!(status, 200, "{first}");
        assert_eq!(first["stop_reason"], "tool_use");
        let blocks = first["content"].as_array().unwrap();
        assert_eq!(blocks.len(), 2, "{first}");
        for b in blocks {
            assert_eq!(b["type"], "tool_use");
            assert_eq!(b["name"], "get_weather");
            assert!(b["id"].as_str().is_some_and(|id| !id.is_empty()));
            assert!(b["input"]["city"].is_string(), "{b}");
        }

        // Streamed, the same calls arrive as two tool_use blocks of JSON pieces.
        body["stream"] = json!(true);
        let r = post_stream(&gw.base, &body).await;
        let starts: Vec<&Value> = r
            .events
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, d)| d)
            .collect();
        assert_eq!(starts.len(), 2);
        for (i, s) in starts.iter().enumerate() {
            assert_eq!(s["index"], i);
            assert_eq!(s["content_block"]["type"], "tool_use");
            assert_eq!(s["content_block"]["input"], json!({}));
            let json: String = r
                .events
                .iter()
                .filter(|(_, d)| d["index"] == i && d["delta"]["type"] == "input_json_delta")
                .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
                .collect();
            let input: Value = serde_json::from_str(&json).unwrap();
            assert_eq!(input, blocks[i]["input"]);
        }
        assert_eq!(r.last("message_delta")["delta"]["stop_reason"], "tool_use");
        assert_eq!(r.names().last(), Some(&"message_stop"));

        // The follow-up: the assistant's tool_use blocks and the user's tool_result blocks.
        let (id0, id1) = (blocks[0]["id"].clone(), blocks[1]["id"].clone());
        let follow = json!({"model": model, "max_tokens": 256, "tools": weather_tools(),
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": first["content"]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": id0, "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": id1,
                        "content": [{"type": "text", "text": "rain"}]},
                    {"type": "text", "text": "Thanks!"}]}]});
        let (status, _, answer) = post_message_json(&gw.base, &follow).await;
        assert_eq!(status, 200, "{answer}");
        let requests = gw.mock.requests();
        assert_eq!(requests.len(), 3 * (n + 1));
        let sent = &requests.last().unwrap().body;
        if model == "demo/mock" {
            let args = |b: &Value| b["input"].to_string();
            assert_eq!(
                sent["messages"],
                json!([
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": question},
                    {"role": "assistant", "tool_calls": [
                        {"id": id0, "type": "function",
                            "function": {"name": "get_weather", "arguments": args(&blocks[0])}},
                        {"id": id1, "type": "function",
                            "function": {"name": "get_weather", "arguments": args(&blocks[1])}}]},
                    {"role": "tool", "content": "sunny", "tool_call_id": id0},
                    {"role": "tool", "content": "rain", "tool_call_id": id1},
                    {"role": "user", "content": "Thanks!"}
                ]),
                "{sent}"
            );
            assert_eq!(sent["tools"][0]["function"]["name"], "get_weather");
        } else {
            assert_eq!(sent["system"], "Be brief.");
            assert_eq!(
                sent["messages"][1],
                json!({"role": "assistant", "content": first["content"]})
            );
            assert_eq!(
                sent["messages"][2]["content"],
                json!([
                    {"type": "tool_result", "tool_use_id": id0, "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": id1, "content": "rain"},
                    {"type": "text", "text": "Thanks!"}])
            );
        }
    }
}

#[tokio::test]
async fn errors_use_the_anthropic_shape() {
    let gw = start(Options::default()).await;
    let mut body = messages_body("demo/mock", "hi", false);
    body.as_object_mut().unwrap().remove("max_tokens");
    let (status, _, err) = post_message_json(&gw.base, &body).await;
    assert_eq!(status, 400);
    assert_eq!(
        err,
        json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "max_tokens: Field required"}})
    );

    let (status, _, err) =
        post_message_json(&gw.base, &messages_body("nope/nope", "hi", true)).await;
    assert_eq!(status, 404);
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "not_found_error");
    assert!(error_message(&err).contains("nope/nope"), "{err}");

    let mut body = messages_body("demo/mock", "hi", false);
    body["bogus"] = json!(5);
    let (status, _, err) = post_message_json(&gw.base, &body).await;
    assert_eq!(status, 400);
    assert_eq!(
        err["error"]["message"],
        "bogus: Extra inputs are not permitted"
    );
    assert_eq!(gw.mock.request_count(), 0);

    // An upstream 429 keeps its status and Retry-After; the type is Anthropic's.
    let body = messages_body("demo/claude", "#mock status=429 retry_after=7", false);
    let resp = post_messages(&gw.base, &body).await;
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn mid_stream_error_is_an_error_event_without_message_stop() {
    let gw = start(Options::default()).await;
    for (model, kind) in [
        ("demo/mock", "api_error"),
        ("demo/claude", "overloaded_error"),
    ] {
        let r = post_stream(&gw.base, &messages_body(model, "#mock error_after=2", true)).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "Hello from ");
        let names = r.names();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "error"
            ],
            "{model}"
        );
        let err = r.last("error");
        assert_eq!(err["error"]["type"], kind, "{model}");
        assert!(err["error"]["message"].is_string());
    }
}
