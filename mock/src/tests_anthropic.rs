//! Tests of the mock upstream: Anthropic Messages side.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

use super::tests::{parse_sse, post, post_json};
use super::{DEFAULT_TEXT, MockUpstream};

const MESSAGES: &str = "/v1/messages";
const VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");

fn request(stream: bool) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": 1024,
        "stream": stream,
        "system": "You are terse",
        "messages": [{ "role": "user", "content": "Say hi please" }],
    })
}

#[tokio::test]
async fn anthropic_stream_event_sequence() {
    let mock = MockUpstream::start().await.unwrap();
    let resp = post(&mock, MESSAGES, &[VERSION], &request(true)).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("request-id"));
    let bytes = resp.bytes().await.unwrap();
    assert!(bytes.starts_with(b"event: message_start\ndata: {"));
    let events = parse_sse(&bytes);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", 13));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);

    let data: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    for ((name, _), value) in events.iter().zip(&data) {
        assert_eq!(value["type"], name.as_deref().unwrap());
    }
    let message = &data[0]["message"];
    assert!(message["id"].as_str().unwrap().starts_with("msg_mock_"));
    assert_eq!(message["model"], "claude-test");
    assert_eq!(message["content"], json!([]));
    assert_eq!(message["usage"]["input_tokens"], 6);
    assert_eq!(
        data[1]["content_block"],
        json!({ "type": "text", "text": "" })
    );
    let text: String = data
        .iter()
        .filter(|d| d["type"] == "content_block_delta")
        .map(|d| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, DEFAULT_TEXT);
    let delta = &data[data.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 13);
    assert_eq!(
        mock.requests()[0].header("anthropic-version"),
        Some("2023-06-01")
    );
}

#[tokio::test]
async fn anthropic_non_stream_message_and_cache_usage() {
    let mock = MockUpstream::start().await.unwrap();
    let headers = [
        ("x-mock-prompt-tokens", "10"),
        ("x-mock-cached-tokens", "4"),
    ];
    let v = post_json(&mock, MESSAGES, &headers, &request(false)).await;
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-test");
    assert_eq!(
        v["content"],
        json!([{ "type": "text", "text": DEFAULT_TEXT }])
    );
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(
        v["usage"],
        json!({
            "input_tokens": 6,
            "output_tokens": 13,
            "cache_read_input_tokens": 4,
            "cache_creation_input_tokens": 0,
        })
    );

    let mut body = request(false);
    body["max_tokens"] = json!(2);
    let v = post_json(&mock, MESSAGES, &[], &body).await;
    assert_eq!(v["content"][0]["text"], "Hello from");
    assert_eq!(v["stop_reason"], "max_tokens");
}

#[tokio::test]
async fn anthropic_errors() {
    let mock = MockUpstream::start().await.unwrap();
    let mut body = request(false);
    body.as_object_mut().unwrap().remove("max_tokens");
    let resp = post(&mock, MESSAGES, &[], &body).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");

    let resp = post(&mock, MESSAGES, &[("x-mock-status", "529")], &request(true)).await;
    assert_eq!(resp.status(), 529);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "overloaded_error");

    let resp = post(&mock, MESSAGES, &[("x-mock-status", "401")], &request(true)).await;
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");

    let headers = [("x-mock-error-after", "1"), ("x-mock-compact", "1")];
    let resp = post(&mock, MESSAGES, &headers, &request(true)).await;
    let bytes = resp.bytes().await.unwrap();
    assert!(bytes.starts_with(b"event:message_start\ndata:{"));
    let events = parse_sse(&bytes);
    let (name, data) = events.last().unwrap();
    assert_eq!(name.as_deref(), Some("error"));
    let v: Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["error"]["type"], "overloaded_error");
    let deltas = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_delta"))
        .count();
    assert_eq!(deltas, 1);
}

#[tokio::test]
async fn anthropic_tool_use_stream_and_hang() {
    let mock = MockUpstream::start().await.unwrap();
    let mut body = request(true);
    body["tools"] = json!([{ "name": "lookup", "input_schema": { "type": "object" } }]);
    let resp = post(&mock, MESSAGES, &[("x-mock-tool-calls", "2")], &body).await;
    let events = parse_sse(&resp.bytes().await.unwrap());
    let data: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let starts: Vec<&Value> = data
        .iter()
        .filter(|d| d["type"] == "content_block_start")
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[1]["index"], 1);
    assert_eq!(starts[1]["content_block"]["type"], "tool_use");
    assert_eq!(starts[1]["content_block"]["id"], "toolu_mock_1");
    assert_eq!(starts[1]["content_block"]["name"], "lookup");
    for index in 0..2 {
        let pieces: Vec<&str> = data
            .iter()
            .filter(|d| d["type"] == "content_block_delta" && d["index"] == index)
            .map(|d| {
                assert_eq!(d["delta"]["type"], "input_json_delta");
                d["delta"]["partial_json"].as_str().unwrap()
            })
            .collect();
        assert!(pieces.len() >= 2);
        let input: Value = serde_json::from_str(&pieces.concat()).unwrap();
        assert!(input["city"].is_string());
    }
    let delta = data.iter().find(|d| d["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], 20);

    // hang: message_start arrives, then nothing.
    use futures::StreamExt;
    let resp = post(&mock, MESSAGES, &[("x-mock-hang", "1")], &request(true)).await;
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"event: message_start"));
    let next = tokio::time::timeout(std::time::Duration::from_millis(200), stream.next()).await;
    assert!(next.is_err());
    drop(mock);
    // After the mock is dropped the hanging stream fails instead of blocking forever.
    let after = tokio::time::timeout(std::time::Duration::from_secs(5), stream.next()).await;
    assert!(matches!(after, Ok(Some(Err(_)) | None)));
}

/// `call=<tool>:<json>` is read from the latest input only: the prompt calls the tool, a tool
/// result holding the next `#mock call=` line calls again (with a new id), one without ends.
#[tokio::test]
async fn call_directive_drives_an_agent_loop() {
    let mock = MockUpstream::start().await.unwrap();
    let tools = json!([{"name": "Bash", "input_schema": {"type": "object"}}]);
    let prompt = "go\n#mock call=Bash:%7B%22command%22%3A%22ls%22%7D";
    let body = |messages: Value| json!({"model": "m", "max_tokens": 100, "tools": tools, "messages": messages});
    let first = post(
        &mock,
        MESSAGES,
        &[VERSION],
        &body(json!([{"role": "user", "content": prompt}])),
    )
    .await;
    let first: Value = first.json().await.unwrap();
    assert_eq!(
        first["content"],
        json!([{"type": "tool_use", "id": "toolu_mock_bash_0", "name": "Bash", "input": {"command": "ls"}}])
    );
    let turn = |result: &str| {
        json!([{"role": "user", "content": prompt}, {"role": "assistant", "content": first["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_mock_bash_0", "content": result}]}])
    };
    let again = post(
        &mock,
        MESSAGES,
        &[VERSION],
        &body(turn("#mock call=Bash:%7B%7D")),
    )
    .await;
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["content"][0]["id"], "toolu_mock_bash_1");
    assert_eq!(again["content"][0]["input"], json!({}));
    let done = post(&mock, MESSAGES, &[VERSION], &body(turn("file.txt"))).await;
    let done: Value = done.json().await.unwrap();
    assert_eq!(
        done["content"],
        json!([{"type": "text", "text": DEFAULT_TEXT}])
    );
}

/// `POST /v1/messages/count_tokens`: `prompt_tokens=` or the words; `status=` errors.
#[tokio::test]
async fn count_tokens_endpoint() {
    let mock = MockUpstream::start().await.unwrap();
    let path = "/v1/messages/count_tokens";
    let body = |text: &str| json!({"model": "m", "system": "Be brief", "messages": [{"role": "user", "content": text}]});
    let r = post_json(&mock, path, &[VERSION], &body("one two three")).await;
    assert_eq!(r, json!({"input_tokens": 5}));
    let r = post_json(&mock, path, &[VERSION], &body("x\n#mock prompt_tokens=728")).await;
    assert_eq!(r, json!({"input_tokens": 728}));
    let resp = post(&mock, path, &[VERSION], &body("x\n#mock status=401")).await;
    assert_eq!(resp.status(), 401);
    let r: Value = resp.json().await.unwrap();
    assert_eq!(r["error"]["type"], "authentication_error");
}

/// A forced `tool_choice` is answered with one `tool_use` of that tool, its input from
/// `tool_args` (else `{}`); `call=` of another declared tool still wins.
#[tokio::test]
async fn forced_tool_choice_answers_with_that_tool() {
    let mock = MockUpstream::start().await.unwrap();
    let body = |prompt: &str| {
        json!({
            "model": "claude-test", "max_tokens": 64,
            "messages": [{ "role": "user", "content": prompt }],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}},
                      {"name": "json_tool_call", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "json_tool_call"},
        })
    };
    let v = post_json(
        &mock,
        MESSAGES,
        &[VERSION],
        &body("x\n#mock tool_args=%7B%22a%22%3A1%7D"),
    )
    .await;
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["content"].as_array().unwrap().len(), 1);
    assert_eq!(v["content"][0]["name"], "json_tool_call");
    assert_eq!(v["content"][0]["input"], json!({"a": 1}));
    let v = post_json(&mock, MESSAGES, &[VERSION], &body("x")).await;
    assert_eq!(v["content"][0]["input"], json!({}));
    let v = post_json(
        &mock,
        MESSAGES,
        &[VERSION],
        &body("x\n#mock call=get_weather:%7B%7D"),
    )
    .await;
    assert_eq!(v["content"][0]["name"], "get_weather");
}
