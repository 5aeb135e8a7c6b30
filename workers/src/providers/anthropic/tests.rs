//! Unit tests of the Anthropic adapter.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::stream::tool_frame;
use super::*;
use crate::provider::SseTranslator;
use crate::providers::test_support::{self, ANTHROPIC, end, text};
use futures::StreamExt;
use serde_json::json;
use std::collections::VecDeque;
use switchyard_mock::MockUpstream;
use switchyard_schemas::ErrorClass;
use switchyard_schemas::{FinishReason, FrameBody};

/// Feeds `chunks` as separate writes through the SSE parser and the translator.
fn translate_chunks(chunks: &[&str]) -> Vec<Item> {
    test_support::translate_chunks::<AnthropicTranslator>(chunks)
}

fn usage(prompt: u64, cached: u64, write: u64, completion: u64) -> Item {
    test_support::usage(prompt, cached, write, completion, 0)
}
/// One SSE event per line of JSON, named after its `type` (as Anthropic sends them).
fn sse(lines: &str) -> String {
    let event = |l: &str| {
        let kind = serde_json::from_str::<Value>(l).unwrap()["type"].clone();
        format!("event: {}\ndata: {l}\n\n", kind.as_str().unwrap())
    };
    lines
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| event(l.trim()))
        .collect()
}

/// The events of "Hello, world" read from writes split inside an event: the provisional usage
/// (`message_start`'s `prompt` input tokens, one output token), the text, then the final report
/// (`completion` output tokens) and a `stop`.
fn hello_world_split(prompt: u64, completion: u64) -> Vec<Item> {
    vec![
        usage(prompt, 0, 0, 1),
        text("Hello, world"),
        usage(prompt, 0, 0, completion),
        end(FinishReason::Stop),
    ]
}

fn find(hay: &str, needle: &str, from: usize) -> usize {
    from + hay[from..]
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in {hay:?}"))
}

/// FC-01: the `content_block_delta` event arrives as three writes, cut inside `text_del|ta`.
#[tokio::test]
async fn fc01_split_delta_event() {
    let mock = MockUpstream::start().await.unwrap();
    let directives = "text=Hello,+world chunks=1 prompt_tokens=5 completion_tokens=2 id=msg_fc01";
    // Fetch the unsplit body once (same bytes: fixed id and usage) to find the byte offsets.
    let body = build_request(
        &ANTHROPIC.target(&mock.base_url()),
        &ANTHROPIC.ask(directives),
    )
    .unwrap();
    let url = format!("{}/v1/messages", mock.base_url());
    let resp = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let raw = resp.text().await.unwrap();
    let start = find(&raw, "event: content_block_delta\n", 0);
    let data = start + "event: content_block_delta\n".len();
    let cut = find(&raw, "text_del", data) + "text_del".len();
    let end_at = find(&raw, "\n\n", cut) + 2;
    assert!(raw[data..cut].starts_with("data: {"), "{raw}");
    assert!(raw[cut..end_at].starts_with("ta\""), "{raw}");
    assert!(
        raw[data..end_at].contains(r#""text":"Hello, world""#),
        "{raw}"
    );

    let req = ANTHROPIC.ask(&format!("{directives} split={start},{data},{cut},{end_at}"));
    let events = ANTHROPIC.run(&mock, &req).await.unwrap();
    assert_eq!(events, hello_world_split(5, 2));
    let sent = &mock.requests()[1];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("anthropic-version"), Some(ANTHROPIC_VERSION));
    assert_eq!(sent.header("x-api-key"), None);
    assert_eq!(sent.body["stream"], json!(true));
    assert_eq!(sent.body["model"], json!("claude-test"));
    assert_eq!(sent.body["max_tokens"], json!(DEFAULT_MAX_TOKENS));
}

/// The exact three writes of the brief (Anthropic's own key order), without network.
#[test]
fn split_writes_offline() {
    let events = translate_chunks(&[
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"usage":{"input_tokens":4,"output_tokens":1}}}"#,
        "\n\nevent: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_del"#,
        "ta\",\"text\":\"Hello, world\"}}\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}"#,
        "\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ]);
    assert_eq!(events, hello_world_split(4, 3));
}

#[test]
fn bad_json_and_missing_stop_are_protocol_errors() {
    for body in [
        "event: message_start\ndata: {not json\n\n",
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n",
    ] {
        let events = translate_chunks(&[body]);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].clone().unwrap_err().class, ErrorClass::Protocol);
    }
}

const MIXED: &str = r#"
    {"type":"message_start","message":{"usage":{"input_tokens":7,"cache_read_input_tokens":20,"cache_creation_input_tokens":5,"output_tokens":1}}}
    {"type": "ping"}
    {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}
    {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}
    {"type":"content_block_stop","index":0}
    {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"now","input":{}}}
    {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}
    {"type":"content_block_stop","index":1}
    {"type":"some_future_event"}
    {"type":"message_delta","delta":{"stop_reason":"refusal"},"usage":{"output_tokens":9}}
    {"type":"message_stop"}"#;

#[test]
fn thinking_ping_empty_tool_args_and_cache_writes() {
    let (id, name) = (Some("toolu_1".to_owned()), Some("now".to_owned()));
    let expected = vec![
        usage(32, 20, 5, 1),
        Ok(FrameBody::Reasoning { text: "hmm".into() }),
        tool_frame(0, id, name, String::new()),
        tool_frame(0, None, None, "{}".into()),
        usage(32, 20, 5, 9),
        end(FinishReason::ContentFilter),
    ];
    assert_eq!(translate_chunks(&[&sse(MIXED)]), expected);
}

#[test]
fn in_stream_error_events_are_classified() {
    let cases = [
        ("overloaded_error", ErrorClass::Overloaded),
        ("rate_limit_error", ErrorClass::RateLimited),
        ("api_error", ErrorClass::Upstream5xx),
        ("invalid_request_error", ErrorClass::InvalidRequest),
        ("something_new", ErrorClass::Upstream5xx),
    ];
    test_support::in_stream_errors::<AnthropicTranslator>(&cases, |kind| {
        let data = json!({"type": "error", "error": {"type": kind, "message": "m"}});
        format!("event: error\ndata: {data}\n\n")
    });
}

#[tokio::test]
async fn usage_with_cached_tokens_and_api_key() {
    let mock = MockUpstream::start().await.unwrap();
    let mut t = ANTHROPIC.target(&mock.base_url());
    t.api_key = switchyard_schemas::Secret::new("sk-ant-test");
    let req = ANTHROPIC.ask("cached_tokens=3 prompt_tokens=10 completion_tokens=4");
    let up = crate::provider::Upstream {
        http: &reqwest::Client::new(),
        target: &t,
        base_url: &t.base_url,
    };
    let s = AnthropicProvider.stream_chat(up, &req);
    let events: Vec<Item> = s.await.unwrap().collect().await;
    assert!(events.iter().all(Result::is_ok), "{events:?}");
    let tail = [usage(10, 3, 0, 4), end(FinishReason::Stop)];
    assert_eq!(events[events.len() - 2..], tail);
    assert_eq!(mock.requests()[0].header("x-api-key"), Some("sk-ant-test"));
}

#[tokio::test]
async fn streamed_tool_calls() {
    let mock = MockUpstream::start().await.unwrap();
    let events = ANTHROPIC
        .run_ask(&mock, "tool_calls=2 chunks=3")
        .await
        .unwrap();
    let mut calls: Vec<(Option<String>, Option<String>, String)> = Vec::new();
    for (index, id, name, arguments) in test_support::tool_call_pieces(&events) {
        if id.is_some() {
            assert_eq!((index, arguments), (calls.len(), ""));
            calls.push((id.cloned(), name.cloned(), String::new()));
        } else {
            assert!(name.is_none());
            calls[index].2.push_str(arguments);
        }
    }
    assert_eq!(calls.len(), 2);
    for (i, (id, name, args)) in calls.iter().enumerate() {
        assert_eq!(id.as_deref(), Some(format!("toolu_mock_{i}").as_str()));
        assert_eq!(name.as_deref(), Some("get_weather"));
        let parsed: Value = serde_json::from_str(args).unwrap();
        assert!(parsed["city"].is_string(), "{args}");
    }
    assert_eq!(events.last(), Some(&end(FinishReason::ToolCalls)));
}

#[tokio::test]
async fn status_529_is_overloaded() {
    let mock = MockUpstream::start().await.unwrap();
    let err = ANTHROPIC.run_ask(&mock, "status=529").await.unwrap_err();
    assert_eq!((err.class, err.retryable), (ErrorClass::Overloaded, true));
    assert_eq!(err.upstream_status, Some(529));
}

fn build(messages: Value, extra: Value) -> Result<Value, ErrorInfo> {
    build_request(
        &ANTHROPIC.target("http://x"),
        &ANTHROPIC.request(messages, extra),
    )
}

#[test]
fn hoists_system_and_maps_params() {
    let images = ["data:image/png;base64,AAAA", "https://e.com/a.png"];
    let messages = test_support::instructed("What is this?", &images, false);
    let params = json!({"params": {"max_tokens": 50, "temperature": 0.5, "top_p": 0.9,
        "stop": ["END"], "user": "u-1", "seed": 7}});
    let body = build(messages, params).unwrap();
    assert_eq!(body["system"], json!("Be brief.\n\nUse French."));
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://e.com/a.png"}},
        {"type": "text", "text": "Please."}]}])
    );
    let expected = json!({"max_tokens": 50, "temperature": 0.5, "top_p": 0.9,
        "stop_sequences": ["END"], "metadata": {"user_id": "u-1"}, "stream": true});
    for (k, v) in expected.as_object().unwrap() {
        assert_eq!(&body[k], v, "{k}");
    }
    assert!(body.get("seed").is_none());
}

#[test]
fn tool_calls_and_results_merge() {
    let calls = [("t1", "w", r#"{"city":"Paris"}"#), ("t2", "w", "")];
    let results = [("t1", "sunny"), ("t2", "rain")];
    let messages =
        test_support::tool_round("Weather in Paris and Rome?", json!(null), &calls, &results);
    let tools = json!({"tools": [{"type": "function", "function": {"name": "w",
        "description": "weather", "parameters": {"type": "object"}}}]});
    let body = build(messages, tools).unwrap();
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "t2", "name": "w", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "rain"},
                {"type": "text", "text": "Thanks"}]}
        ])
    );
    let expected =
        json!([{"name": "w", "description": "weather", "input_schema": {"type": "object"}}]);
    assert_eq!(body["tools"], expected);
    assert!(body.get("tool_choice").is_none());
}

/// Anthropic-door fields pass through; `reasoning_effort` maps to a thinking budget; thinking
/// blocks are replayed first in their assistant turn.
#[test]
fn passthrough_thinking_and_effort() {
    let messages = json!([
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}},
        {"role": "assistant", "content": "Hello", "thinking_blocks": [
            {"type": "thinking", "thinking": "t", "signature": "sig"},
            {"type": "redacted_thinking", "data": "d"}]},
        {"role": "system", "content": "Later"},
        {"role": "user", "content": "go"}
    ]);
    let system = json!([{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]);
    let extra = json!({"params": {"top_k": 5, "temperature": 0.5},
        "passthrough": {"anthropic": {"body": {"thinking": {"type": "adaptive"},
            "context_management": {"edits": []}, "system": system}}}});
    let body = build(messages.clone(), extra).unwrap();
    assert_eq!(body["thinking"], json!({"type": "adaptive"}));
    assert_eq!(body["context_management"], json!({"edits": []}));
    assert_eq!(body["top_k"], json!(5));
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Later"}])
    );
    assert_eq!(
        body["messages"][0]["content"],
        json!([{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}])
    );
    assert_eq!(
        body["messages"][1]["content"],
        json!([{"type": "thinking", "thinking": "t", "signature": "sig"},
            {"type": "redacted_thinking", "data": "d"}, {"type": "text", "text": "Hello"}])
    );
    let user = json!([{"role": "user", "content": "x"}]);
    let effort = |e: &str, max: Option<u32>| {
        let extra =
            json!({"params": {"reasoning_effort": e, "max_tokens": max, "temperature": 0.2}});
        build(user.clone(), extra).unwrap()
    };
    let b = effort("low", None);
    assert_eq!(
        b["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );
    assert_eq!(b["max_tokens"], json!(1024 + DEFAULT_MAX_TOKENS));
    assert!(b.get("temperature").is_none());
    let b = effort("high", Some(8000));
    assert_eq!(
        b["thinking"],
        json!({"type": "enabled", "budget_tokens": 7999})
    );
    assert_eq!(b["max_tokens"], json!(8000));
    assert!(effort("medium", Some(500)).get("thinking").is_none());
    assert!(effort("minimal", None).get("thinking").is_none());
}

#[test]
fn tool_choice_mapping() {
    let (tools, user, named) = test_support::choice_setup();
    let cases = [
        (json!("auto"), None, json!({"type": "auto"})),
        (json!("none"), Some(false), json!({"type": "none"})),
        (json!("required"), None, json!({"type": "any"})),
        (
            named,
            Some(false),
            json!({"type": "tool", "name": "w", "disable_parallel_tool_use": true}),
        ),
    ];
    for (choice, parallel, expected) in cases {
        let extra = json!({"tools": tools, "tool_choice": choice,
            "params": {"parallel_tool_calls": parallel}});
        assert_eq!(build(user.clone(), extra).unwrap()["tool_choice"], expected);
    }
    let extra = json!({"tools": tools, "params": {"parallel_tool_calls": false}});
    let expected = json!({"type": "auto", "disable_parallel_tool_use": true});
    assert_eq!(build(user.clone(), extra).unwrap()["tool_choice"], expected);
    let err = build(user, json!({"tools": tools, "tool_choice": "sometimes"})).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tool_choice"));
}

/// The `param` of the `invalid_request` error `build` fails with.
fn rejected(messages: Value, extra: Value) -> Option<String> {
    build(messages, extra)
        .err()
        .filter(|e| e.class == ErrorClass::InvalidRequest)?
        .param
}

#[test]
fn rejects_what_anthropic_cannot_do() {
    let user = || json!([{"role": "user", "content": "x"}]);
    assert_eq!(
        rejected(user(), json!({"params": {"n": 2}})).as_deref(),
        Some("n")
    );
    assert!(build(user(), json!({"params": {"n": 1}})).is_ok());
    let rf = |kind: &str| json!({"params": {"response_format": {"type": kind}}});
    // json_object is served (through the synthetic JSON tool); a schema-less json_schema and
    // unknown types are not.
    assert!(build(user(), rf("json_object")).is_ok());
    assert_eq!(
        rejected(user(), rf("json_schema")).as_deref(),
        Some("response_format")
    );
    assert_eq!(
        rejected(user(), rf("xml")).as_deref(),
        Some("response_format")
    );
    assert!(build(user(), rf("text")).is_ok());
    let bad_args = json!([{"role": "assistant", "tool_calls": [
        {"id": "t", "type": "function", "function": {"name": "w", "arguments": "{oops"}}]}]);
    assert_eq!(rejected(bad_args, json!({})).as_deref(), Some("messages"));
    let bad_image = json!([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}]}]);
    assert_eq!(rejected(bad_image, json!({})).as_deref(), Some("messages"));
}

// --- response_format through the synthetic JSON tool (FC-41) ---

const WEATHER: &str = r#"{"city":"Paris","temp_c":21}"#;

fn weather_format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "weather", "strict": true, "schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"},
                       "strict": {"type": "boolean"}},
        "required": ["city", "temp_c"], "additionalProperties": false}}})
}

fn get_weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

/// The `#mock` line for the weather JSON (percent-encoded `tool_args`).
fn weather_directive() -> String {
    format!(
        "tool_args={}",
        WEATHER
            .replace('{', "%7B")
            .replace('}', "%7D")
            .replace('"', "%22")
            .replace(':', "%3A")
            .replace(',', "%2C")
    )
}

fn structured(directives: &str, extra: Value) -> ChatRequest {
    let mut extra = extra;
    extra["params"] = json!({ "response_format": weather_format() });
    ANTHROPIC.request(test_support::directive_messages(directives), extra)
}

#[test]
fn anthropic_schema_strips_non_keywords_only() {
    let out = structured::anthropic_schema(&weather_format()["json_schema"]["schema"]).unwrap();
    assert_eq!(
        out,
        json!({"type": "object",
            "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"},
                           "strict": {"type": "boolean"}},
            "required": ["city", "temp_c"], "additionalProperties": false})
    );
    let untyped = structured::anthropic_schema(&json!({"properties": {}})).unwrap();
    assert_eq!(untyped, json!({"properties": {}, "type": "object"}));
    let e = structured::anthropic_schema(&json!({"type": "array"})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("response_format"));
}

#[test]
fn json_schema_without_tools_forces_the_json_tool() {
    let t = ANTHROPIC.target("http://x");
    let body = build_request(&t, &structured("", json!({}))).unwrap();
    assert_eq!(
        body["tools"],
        json!([{"name": "json_tool_call",
            "description": "Respond with a JSON object matching the `weather` schema.",
            "input_schema": structured::anthropic_schema(&weather_format()["json_schema"]["schema"]).unwrap()}])
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "json_tool_call"})
    );
    assert!(body.get("system").is_none(), "{body}");
    // json_object: an open object schema.
    let mut req = structured("", json!({}));
    req.params.response_format = Some(json!({"type": "json_object"}));
    let body = build_request(&t, &req).unwrap();
    assert_eq!(body["tools"][0]["input_schema"], json!({"type": "object"}));
}

#[test]
fn json_schema_with_user_tools_is_auto_with_an_instruction() {
    let t = ANTHROPIC.target("http://x");
    let body = build_request(&t, &structured("", json!({"tools": get_weather_tool()}))).unwrap();
    let names: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["get_weather", "json_tool_call"]);
    assert_eq!(body["tool_choice"], json!({"type": "auto"}));
    assert_eq!(body["system"], json!(structured::JSON_INSTRUCTION));
    // `required` stays `any`; `none` forces the JSON answer.
    let req = structured(
        "",
        json!({"tools": get_weather_tool(), "tool_choice": "required"}),
    );
    assert_eq!(
        build_request(&t, &req).unwrap()["tool_choice"],
        json!({"type": "any"})
    );
    let req = structured(
        "",
        json!({"tools": get_weather_tool(), "tool_choice": "none"}),
    );
    assert_eq!(
        build_request(&t, &req).unwrap()["tool_choice"],
        json!({"type": "tool", "name": "json_tool_call"})
    );
    // A user tool may not take the reserved name.
    let clash = json!([{"type": "function", "function": {"name": "json_tool_call"}}]);
    let e = build_request(&t, &structured("", json!({"tools": clash}))).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools"));
}

#[tokio::test]
async fn fc41_streamed_json_tool_is_text_content() {
    let mock = MockUpstream::start().await.unwrap();
    let events = ANTHROPIC
        .run(&mock, &structured(&weather_directive(), json!({})))
        .await
        .unwrap();
    let texts = test_support::texts_only(&events);
    assert!(texts.len() >= 2, "streamed as deltas: {texts:?}");
    assert_eq!(texts.concat(), WEATHER);
    assert_eq!(events.last(), Some(&end(FinishReason::Stop)));
    let sent = mock.requests()[0].body.clone();
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "tool", "name": "json_tool_call"})
    );
    assert!(
        sent["tools"][0]["input_schema"].get("$schema").is_none(),
        "{sent}"
    );
}

#[tokio::test]
async fn fc41_non_streamed_json_tool_is_text_content() {
    let mock = MockUpstream::start().await.unwrap();
    let req = structured(&weather_directive(), json!({"stream": false}));
    let events = ANTHROPIC.run(&mock, &req).await.unwrap();
    let texts = test_support::texts_only(&events).concat();
    assert_eq!(texts, WEATHER);
    assert_eq!(events.last(), Some(&end(FinishReason::Stop)));
}

#[tokio::test]
async fn fc41_real_tool_call_instead_of_json() {
    let mock = MockUpstream::start().await.unwrap();
    for stream in [true, false] {
        let directive = "call=get_weather:%7B%22city%22%3A%22Paris%22%7D";
        let req = structured(
            directive,
            json!({"tools": get_weather_tool(), "stream": stream}),
        );
        let events = ANTHROPIC.run(&mock, &req).await.unwrap();
        let mut args = String::new();
        for e in &events {
            match e {
                Ok(FrameBody::ToolCall {
                    index,
                    name,
                    arguments,
                    ..
                }) => {
                    assert_eq!(*index, 0);
                    assert!(
                        name.is_none() || name.as_deref() == Some("get_weather"),
                        "{name:?}"
                    );
                    args.push_str(arguments);
                }
                Ok(FrameBody::Text { text }) => panic!("text {text:?} in {events:?}"),
                _ => {}
            }
        }
        assert_eq!(args, r#"{"city":"Paris"}"#, "stream={stream}");
        assert_eq!(events.last(), Some(&end(FinishReason::ToolCalls)));
    }
}

#[test]
fn structured_preamble_text_is_dropped_for_the_json_tool() {
    let body = sse(r#"
        {"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}
        {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}
        {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Here you go:"}}
        {"type":"content_block_stop","index":0}
        {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"json_tool_call","input":{}}}
        {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}
        {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"1}"}}
        {"type":"content_block_stop","index":1}
        {"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":7}}
        {"type":"message_stop"}
    "#);
    let (mut parser, mut events) = (crate::sse::SseParser::new(), Vec::new());
    parser.push(body.as_bytes(), &mut events).unwrap();
    let mut tr = AnthropicTranslator::new(true);
    let mut out = VecDeque::new();
    for ev in events {
        tr.on_event(ev, &mut out);
    }
    let out: Vec<Item> = out.into_iter().collect();
    assert_eq!(
        out,
        vec![
            usage(5, 0, 0, 1),
            text("{\"a\":"),
            text("1}"),
            usage(5, 0, 0, 7),
            end(FinishReason::Stop)
        ]
    );
}

// --- whole request bodies (pinned before the typed request structs) ---

/// A rich conversation: system and developer instructions, images (data and URL), documents
/// (inline, URL, file id), replayed thinking, tool calls and results (text and parts), cache
/// breakpoints, every sampling parameter, tools and a named `tool_choice`: the exact body.
#[test]
fn whole_body_of_a_rich_request() {
    let eph = json!({"type": "ephemeral"});
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
        {"role": "user", "cache_control": eph, "content": [
            {"type": "text", "text": "Look:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "image_url", "image_url": {"url": "https://e.com/a.png"}},
            {"type": "text", "text": ""},
            {"type": "file", "file": {"filename": "report.pdf",
                "file_data": "data:application/pdf;base64,JVBE"}}]},
        {"role": "assistant", "content": "Let me check.", "cache_control": eph,
            "thinking_blocks": [
                {"type": "thinking", "thinking": "t", "signature": "sig"},
                {"type": "thinking", "thinking": "u"},
                {"type": "redacted_thinking", "data": "d"}],
            "tool_calls": [
                {"id": "c1", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "clock", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "cache_control": eph, "content": [
            {"type": "text", "text": "12:00"},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,BBBB"}}]},
        {"role": "tool", "tool_call_id": "c3", "content": ""},
        {"role": "user", "content": [
            {"type": "text", "text": "And these?"},
            {"type": "file", "file": {"file_url": "https://e.com/b.pdf"}},
            {"type": "file", "file": {"filename": "c.pdf", "file_id": "file_1"}}]},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Thanks"}
    ]);
    let mut extra = test_support::weather_and_clock();
    extra["tool_choice"] = json!({"type": "function", "function": {"name": "weather"}});
    extra["params"] = json!({"max_tokens": 300, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "stop": ["END", "STOP"], "user": "u-1", "seed": 7, "presence_penalty": 0.1,
        "parallel_tool_calls": false});
    let body = build(messages, extra).unwrap();
    assert_eq!(
        body,
        json!({
            "model": "claude-test",
            "max_tokens": 300,
            "system": "Be brief.\n\nUse French.",
            "stream": true,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["END", "STOP"],
            "metadata": {"user_id": "u-1"},
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image", "source":
                        {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "image", "source": {"type": "url", "url": "https://e.com/a.png"}},
                    {"type": "document", "title": "report.pdf", "cache_control": eph, "source":
                        {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "t", "signature": "sig"},
                    {"type": "thinking", "thinking": "u"},
                    {"type": "redacted_thinking", "data": "d"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "c2", "name": "clock", "input": {},
                        "cache_control": eph}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "c2", "cache_control": eph,
                        "content": [
                            {"type": "text", "text": "12:00"},
                            {"type": "image", "source":
                                {"type": "base64", "media_type": "image/jpeg", "data": "BBBB"}}]},
                    {"type": "tool_result", "tool_use_id": "c3"},
                    {"type": "text", "text": "And these?"},
                    {"type": "document", "source": {"type": "url", "url": "https://e.com/b.pdf"}},
                    {"type": "document", "title": "c.pdf",
                        "source": {"type": "file", "file_id": "file_1"}},
                    {"type": "text", "text": "Thanks"}]}
            ],
            "tools": [
                {"name": "weather", "description": "w",
                    "input_schema": {"type": "object", "additionalProperties": false}},
                {"name": "clock", "input_schema": {"type": "object", "properties": {}}}
            ],
            "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": true}
        })
    );
}

/// `reasoning_effort`, `response_format` beside a user tool, and the Anthropic door's raw
/// fields on a non-streamed call: the exact body (the raw `system` wins over the translated
/// one, the JSON instruction included).
#[test]
fn whole_body_with_effort_json_tool_and_passthrough() {
    let messages = json!([
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Later", "cache_control": {"type": "ephemeral"}},
        {"role": "user", "content": "go"}
    ]);
    let raw_system = json!([{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]);
    let extra = json!({"stream": false, "tools": get_weather_tool(),
        "params": {"reasoning_effort": "medium", "max_tokens": 2000, "temperature": 0.3,
            "top_k": 3, "response_format": weather_format()},
        "passthrough": {"anthropic": {"body": {"system": raw_system,
            "context_management": {"edits": []}, "service_tier": "auto"}}}});
    let body = build(messages, extra).unwrap();
    let weather = structured::anthropic_schema(&weather_format()["json_schema"]["schema"]).unwrap();
    let get_weather = &get_weather_tool()[0]["function"];
    assert_eq!(
        body,
        json!({
            "model": "claude-test",
            "max_tokens": 2000,
            "thinking": {"type": "enabled", "budget_tokens": 1999},
            "system": [
                {"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Later", "cache_control": {"type": "ephemeral"}}],
            "context_management": {"edits": []},
            "service_tier": "auto",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"},
                    {"type": "text", "text": "go"}]}],
            "tools": [
                {"name": "get_weather", "input_schema": get_weather["parameters"]},
                {"name": "json_tool_call",
                    "description": "Respond with a JSON object matching the `weather` schema.",
                    "input_schema": weather}],
            "tool_choice": {"type": "auto"}
        })
    );
}
