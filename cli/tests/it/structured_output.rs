//! Structured output across providers (issue 12, Deliver 5; FC-41, BerriAI/litellm #6741,
//! #7135): `response_format` `json_schema` on an Anthropic upstream (the synthetic
//! `json_tool_call` tool) and a Gemini upstream (`responseJsonSchema`) answers the JSON in
//! `content`, never in `tool_calls`, with `finish_reason: "stop"`; a real user tool the model
//! calls instead comes back alone; the upstream sees the schema with the keywords it rejects
//! stripped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};

/// The JSON the model answers, exactly.
const WEATHER: &str = r#"{"city":"Paris","temp_c":21}"#;

/// `#mock` line making the mock's model answer [`WEATHER`] (as the forced tool's input on
/// Anthropic, as the JSON text on Gemini).
const WEATHER_DIRECTIVE: &str =
    "#mock tool_args=%7B%22city%22%3A%22Paris%22%2C%22temp_c%22%3A21%7D";

async fn gateway() -> Gateway {
    let config = test_config(json!({
        "targets": [
            {"id": "claude", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-test"},
            {"id": "gemini", "provider": "gemini", "base_url": "builtin:mock", "upstream_model": "gemini-test"}
        ],
        "models": [
            {"id": "demo/claude", "targets": ["claude"]},
            {"id": "demo/gemini", "targets": ["gemini"]}
        ]
    }));
    start_config(config).await
}

/// The OpenAI `response_format` a Pydantic `Weather(city: str, temp_c: int)` becomes in the
/// official SDK's `parse()` (strict, `additionalProperties: false`, a `title`).
fn weather_format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "weather", "strict": true, "schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Weather",
        "type": "object",
        "properties": {"city": {"title": "City", "type": "string"},
                       "temp_c": {"title": "Temp C", "type": "integer"}},
        "required": ["city", "temp_c"],
        "additionalProperties": false}}})
}

fn get_weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

fn weather_request(model: &str, prompt: &str, stream: bool) -> Value {
    let mut body = chat(model, &format!("Weather in Paris?\n{prompt}"), stream);
    body["response_format"] = weather_format();
    body
}

/// The one upstream request the mock received.
fn upstream_body(gw: &Gateway) -> Value {
    let requests = gw.mock.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    requests[0].body.clone()
}

fn assert_no_tool_call_deltas(r: &SseBody) {
    for e in r.json_events() {
        assert!(
            e.pointer("/choices/0/delta/tool_calls").is_none(),
            "tool call delta in {e}"
        );
    }
}

/// POSTs `body` (not streamed) and asserts the answer is [`WEATHER`] as `content`, no
/// `tool_calls`, `finish_reason: "stop"`.
async fn assert_weather_content(gw: &Gateway, body: &Value) {
    let (status, _, b) = post_json(&gw.base, body).await;
    assert_eq!(status, 200, "{b}");
    let choice = &b["choices"][0];
    assert_eq!(choice["message"]["content"], WEATHER);
    assert!(choice["message"].get("tool_calls").is_none(), "{b}");
    assert_eq!(choice["finish_reason"], "stop");
}

/// Streams `body` and asserts [`WEATHER`] comes as content deltas, none a tool call, ending
/// with `finish_reason: "stop"`; the stream, for more checks.
async fn assert_weather_streamed(gw: &Gateway, body: &Value) -> SseBody {
    let r = post_sse(&gw.base, body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), WEATHER);
    assert_no_tool_call_deltas(&r);
    assert_eq!(r.finish_reason().as_deref(), Some("stop"));
    r
}

/// [`weather_format`]'s schema as Gemini gets it: `$schema` and `additionalProperties` stripped,
/// the rest unchanged.
fn gemini_schema() -> Value {
    json!({"title": "Weather", "type": "object",
        "properties": {"city": {"title": "City", "type": "string"},
                       "temp_c": {"title": "Temp C", "type": "integer"}},
        "required": ["city", "temp_c"]})
}

#[tokio::test]
async fn fc41_claude_json_schema_is_content_not_tool_calls() {
    let gw = gateway().await;
    assert_weather_content(
        &gw,
        &weather_request("demo/claude", WEATHER_DIRECTIVE, false),
    )
    .await;
    // The upstream got the synthetic tool, forced, with the schema as its input_schema.
    let sent = upstream_body(&gw);
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "tool", "name": "json_tool_call"})
    );
    assert_eq!(sent["tools"].as_array().unwrap().len(), 1);
    assert_eq!(sent["tools"][0]["name"], "json_tool_call");
    // Only `$schema` stripped.
    let mut schema = gemini_schema();
    schema["additionalProperties"] = json!(false);
    assert_eq!(sent["tools"][0]["input_schema"], schema);
}

#[tokio::test]
async fn fc41_claude_json_schema_streamed_as_content_deltas() {
    let gw = gateway().await;
    let r = assert_weather_streamed(
        &gw,
        &weather_request("demo/claude", WEATHER_DIRECTIVE, true),
    )
    .await;
    let deltas = r.content_pieces();
    assert!(deltas >= 2, "streamed in pieces, got {deltas}");
    assert_eq!(r.done_count(), 1);
}

/// With a real user tool the model calls instead of answering: only that tool appears (no JSON
/// content, no `json_tool_call`); the upstream was asked with `auto` and both tools.
#[tokio::test]
async fn fc41_claude_real_tool_call_alongside_json_schema() {
    let gw = gateway().await;
    let call = "#mock call=get_weather:%7B%22city%22%3A%22Paris%22%7D";
    let mut body = weather_request("demo/claude", call, false);
    body["tools"] = get_weather();
    let (status, _, b) = post_json(&gw.base, &body).await;
    assert_eq!(status, 200, "{b}");
    let msg = &b["choices"][0]["message"];
    let calls = msg["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{b}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Paris"}"#);
    assert!(msg["content"].is_null(), "{b}");
    assert_eq!(b["choices"][0]["finish_reason"], "tool_calls");
    let sent = upstream_body(&gw);
    let names: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["get_weather", "json_tool_call"]);
    assert_eq!(sent["tool_choice"], json!({"type": "auto"}));

    // Streamed: the same single call.
    body["stream"] = json!(true);
    let r = post_sse(&gw.base, &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "");
    let mut names = Vec::new();
    let mut args = String::new();
    for e in r.json_events() {
        if let Some(tcs) = e
            .pointer("/choices/0/delta/tool_calls")
            .and_then(Value::as_array)
        {
            for tc in tcs {
                assert_eq!(tc["index"], 0, "{e}");
                if let Some(n) = tc.pointer("/function/name").and_then(Value::as_str) {
                    names.push(n.to_owned());
                }
                args.push_str(
                    tc.pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                );
            }
        }
    }
    assert_eq!(names, ["get_weather"]);
    assert_eq!(args, r#"{"city":"Paris"}"#);
    assert_eq!(r.finish_reason().as_deref(), Some("tool_calls"));
}

/// With a user tool declared but not called, the JSON still comes back as content.
#[tokio::test]
async fn claude_json_schema_with_unused_user_tool() {
    let gw = gateway().await;
    let mut body = weather_request("demo/claude", WEATHER_DIRECTIVE, false);
    body["tools"] = get_weather();
    body["tool_choice"] = json!("none");
    assert_weather_content(&gw, &body).await;
}

#[tokio::test]
async fn fc41_gemini_json_schema_is_content_with_translated_schema() {
    let gw = gateway().await;
    assert_weather_content(
        &gw,
        &weather_request("demo/gemini", WEATHER_DIRECTIVE, false),
    )
    .await;
    let sent = upstream_body(&gw);
    let config = &sent["generationConfig"];
    assert_eq!(config["responseMimeType"], "application/json");
    assert_eq!(config["responseJsonSchema"], gemini_schema());
    assert_weather_streamed(
        &gw,
        &weather_request("demo/gemini", WEATHER_DIRECTIVE, true),
    )
    .await;
}

/// The Responses door's `text.format` maps to the same field: a Claude answer is one
/// `output_text`, no `function_call` item.
#[tokio::test]
async fn responses_text_format_on_claude() {
    let gw = gateway().await;
    let rf = weather_format();
    let mut format = rf["json_schema"].clone();
    format["type"] = json!("json_schema");
    let body = json!({"model": "demo/claude", "store": false,
        "input": format!("Weather in Paris?\n{WEATHER_DIRECTIVE}"),
        "text": {"format": format}});
    let b = json_ok(
        reqwest::Client::new()
            .post(format!("{}/v1/responses", gw.base))
            .bearer_auth("sk-test")
            .json(&body),
    )
    .await;
    let output = b["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{b}");
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["content"][0]["type"], "output_text");
    assert_eq!(output[0]["content"][0]["text"], WEATHER);
    assert_eq!(b["status"], "completed");
}

/// Gemini with a user tool: no JSON mode upstream (Gemini 2.x rejects it with function
/// calling) but the synthetic `json_tool_call` function; its call is the content, a real tool
/// call comes back alone.
#[tokio::test]
async fn gemini_json_schema_alongside_user_tools() {
    let gw = gateway().await;
    let weather = "%7B%22city%22%3A%22Paris%22%2C%22temp_c%22%3A21%7D";
    let mut body = weather_request(
        "demo/gemini",
        &format!("#mock call=json_tool_call:{weather}"),
        false,
    );
    body["tools"] = get_weather();
    assert_weather_content(&gw, &body).await;
    let sent = upstream_body(&gw);
    assert!(
        sent["generationConfig"].get("responseMimeType").is_none(),
        "{sent}"
    );
    assert_eq!(
        sent["tools"][0]["functionDeclarations"][1]["parametersJsonSchema"],
        gemini_schema()
    );

    let mut body = weather_request(
        "demo/gemini",
        "#mock call=get_weather:%7B%22city%22%3A%22Paris%22%7D",
        true,
    );
    body["tools"] = get_weather();
    let r = post_sse(&gw.base, &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), "");
    let names: Vec<String> = r
        .json_events()
        .iter()
        .filter_map(|e| e.pointer("/choices/0/delta/tool_calls/0/function/name"))
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, ["get_weather"]);
    assert_eq!(r.finish_reason().as_deref(), Some("tool_calls"));
}
