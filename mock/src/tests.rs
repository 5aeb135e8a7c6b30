//! Tests of the mock upstream: OpenAI side, shared behaviour and helpers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use super::behaviour::{chunk_words, lorem, parse_directives, percent_decode, split_even};
use super::{DEFAULT_TEXT, MockUpstream};

/// A parsed SSE event: (event name, data).
pub(super) type Event = (Option<String>, String);

/// Minimal SSE parser for the tests (handles `\r\n`, compact and spaced fields).
pub(super) fn parse_sse(bytes: &[u8]) -> Vec<Event> {
    let text = String::from_utf8_lossy(bytes).replace("\r\n", "\n");
    let mut events = Vec::new();
    for block in text.split("\n\n") {
        let mut name = None;
        let mut data = Vec::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.strip_prefix(' ').unwrap_or(v).to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
            }
        }
        if !data.is_empty() {
            events.push((name, data.join("\n")));
        }
    }
    events
}

pub(super) async fn post(
    mock: &MockUpstream,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(format!("{}{path}", mock.base_url()))
        .json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

/// [`post`], the answer read as JSON.
pub(super) async fn post_json(
    mock: &MockUpstream,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Value {
    post(mock, path, headers, body).await.json().await.unwrap()
}

fn chat(stream: bool) -> Value {
    json!({
        "model": "gpt-test",
        "stream": stream,
        "messages": [
            { "role": "system", "content": "Be brief" },
            { "role": "user", "content": "Say hi please" },
        ],
    })
}

const CHAT: &str = "/v1/chat/completions";

/// `GET {path}` on the mock, the answer read as JSON.
async fn get_json(mock: &MockUpstream, path: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{}{path}", mock.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The non-empty `delta.content` texts of Chat Completions stream chunks, in order.
fn delta_contents(chunks: &[Value]) -> Vec<&str> {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|s| !s.is_empty())
        .collect()
}

fn data_json(events: &[Event]) -> Vec<Value> {
    events
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test]
async fn openai_non_stream_text_and_usage() {
    let mock = MockUpstream::start().await.unwrap();
    let resp = post(&mock, CHAT, &[], &chat(false)).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("x-request-id"));
    let v: Value = resp.json().await.unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-mock-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gpt-test");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], DEFAULT_TEXT);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let usage = &v["usage"];
    assert_eq!(usage["prompt_tokens"], 5);
    assert_eq!(usage["completion_tokens"], 13);
    assert_eq!(usage["total_tokens"], 18);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn openai_stream_one_chunk_per_word_and_usage_chunk() {
    let mock = MockUpstream::start().await.unwrap();
    for include_usage in [false, true] {
        let mut body = chat(true);
        body["stream_options"] = json!({ "include_usage": include_usage });
        let resp = post(&mock, CHAT, &[], &body).await;
        assert_eq!(resp.status(), 200);
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/event-stream"));
        let bytes = resp.bytes().await.unwrap();
        assert!(bytes.starts_with(b"data: {"));
        let events = parse_sse(&bytes);
        assert_eq!(events.last().unwrap().1, "[DONE]");
        let chunks = data_json(&events);
        assert_eq!(
            chunks[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        let contents = delta_contents(&chunks);
        assert_eq!(contents.len(), 13);
        assert_eq!(contents.concat(), DEFAULT_TEXT);
        assert_eq!(contents[0], "Hello ");
        let usage_chunks: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"].as_array().unwrap().is_empty())
            .collect();
        if include_usage {
            assert_eq!(usage_chunks.len(), 1);
            let last = chunks.last().unwrap();
            assert_eq!(last["choices"], json!([]));
            assert_eq!(last["usage"]["completion_tokens"], 13);
            for c in &chunks[..chunks.len() - 1] {
                assert_eq!(c.get("usage"), Some(&Value::Null));
            }
        } else {
            assert!(usage_chunks.is_empty());
            assert!(chunks.iter().all(|c| c.get("usage").is_none()));
        }
        let finish = &chunks[chunks.len() - 1 - usize::from(include_usage)];
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        assert_eq!(finish["choices"][0]["delta"], json!({}));
        assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
        assert!(chunks.iter().all(|c| c["model"] == "gpt-test"));
    }
}

#[tokio::test]
async fn compact_and_crlf_framing() {
    let mock = MockUpstream::start().await.unwrap();
    let resp = post(&mock, CHAT, &[("x-mock-compact", "1")], &chat(true)).await;
    let bytes = resp.bytes().await.unwrap();
    assert!(bytes.starts_with(b"data:{"));
    assert!(bytes.ends_with(b"data:[DONE]\n\n"));

    let resp = post(&mock, CHAT, &[("x-mock-crlf", "1")], &chat(true)).await;
    let bytes = resp.bytes().await.unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.ends_with("data: [DONE]\r\n\r\n"));
    assert_eq!(text.matches('\n').count(), text.matches("\r\n").count());
}

#[tokio::test]
async fn openai_tool_calls_stream() {
    let mock = MockUpstream::start().await.unwrap();
    let mut body = chat(true);
    body["tools"] = json!([
        { "type": "function", "function": { "name": "lookup", "parameters": {} } },
        { "type": "function", "function": { "name": "search", "parameters": {} } },
    ]);
    let resp = post(&mock, CHAT, &[("x-mock-tool-calls", "2")], &body).await;
    let chunks = data_json(&parse_sse(&resp.bytes().await.unwrap()));
    let mut ids = vec![String::new(); 2];
    let mut names = vec![String::new(); 2];
    let mut args = vec![String::new(); 2];
    let mut pieces = [0usize; 2];
    for chunk in &chunks {
        let Some(calls) = chunk["choices"][0]["delta"]["tool_calls"].as_array() else {
            continue;
        };
        for call in calls {
            let i = call["index"].as_u64().unwrap() as usize;
            if let Some(id) = call["id"].as_str() {
                ids[i] = id.to_string();
                assert_eq!(call["type"], "function");
            }
            if let Some(name) = call["function"]["name"].as_str() {
                names[i].push_str(name);
            }
            let piece = call["function"]["arguments"].as_str().unwrap();
            if !piece.is_empty() {
                pieces[i] += 1;
            }
            args[i].push_str(piece);
        }
    }
    assert_eq!(ids, ["call_mock_0", "call_mock_1"]);
    assert_eq!(names, ["lookup", "search"]);
    assert!(pieces.iter().all(|p| *p >= 2));
    for a in &args {
        let parsed: Value = serde_json::from_str(a).unwrap();
        assert!(parsed["city"].is_string());
    }
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));

    // Non-stream: content null, tool_calls array.
    let mut body = chat(false);
    body["tools"] = json!([{ "type": "function", "function": { "name": "lookup" } }]);
    let v = post_json(&mock, CHAT, &[("x-mock-tool-calls", "3")], &body).await;
    let message = &v["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null);
    assert_eq!(message["tool_calls"].as_array().unwrap().len(), 3);
    assert_eq!(message["tool_calls"][2]["function"]["name"], "lookup");
    assert_eq!(message["tool_calls"][2]["id"], "call_mock_2");
    assert_eq!(v["usage"]["completion_tokens"], 30);
}

#[tokio::test]
async fn status_and_retry_after() {
    let mock = MockUpstream::start().await.unwrap();
    let headers = [("x-mock-status", "429"), ("x-mock-retry-after", "7")];
    let resp = post(&mock, CHAT, &headers, &chat(true)).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(v["error"]["message"].is_string());
    assert!(v["error"].get("param").is_some());
    assert!(v["error"].get("code").is_some());

    let resp = post(&mock, CHAT, &[("x-mock-status", "500")], &chat(false)).await;
    assert_eq!(resp.status(), 500);
    assert!(resp.headers().get("retry-after").is_none());
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "server_error");
}

#[tokio::test]
async fn invalid_json_and_bad_values_are_400() {
    let mock = MockUpstream::start().await.unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}{CHAT}", mock.base_url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(mock.requests()[0].body, json!("{not json"));

    let resp = post(&mock, CHAT, &[("x-mock-ttft-ms", "soon")], &chat(false)).await;
    assert_eq!(resp.status(), 400);
}

#[tokio::test]
async fn split_yields_identical_bytes_in_several_frames() {
    let mock = MockUpstream::start().await.unwrap();
    let mut body = chat(true);
    body["stream_options"] = json!({ "include_usage": true });
    let fixed = [
        ("x-mock-id", "chatcmpl-fixed"),
        ("x-mock-created", "1700000000"),
    ];
    let reference = post(&mock, CHAT, &fixed, &body)
        .await
        .bytes()
        .await
        .unwrap();
    assert!(reference.windows(14).any(|w| w == b"chatcmpl-fixed"));

    for (key, value) in [
        ("x-mock-split", "3,17,100,5000000"),
        ("x-mock-split-every", "7"),
    ] {
        let mut headers = fixed.to_vec();
        headers.push((key, value));
        let resp = post(&mock, CHAT, &headers, &body).await;
        let mut stream = resp.bytes_stream();
        let mut frames = 0;
        let mut all = Vec::new();
        while let Some(frame) = stream.next().await {
            all.extend_from_slice(&frame.unwrap());
            frames += 1;
        }
        assert_eq!(all, reference.to_vec(), "{key}={value}");
        assert!(frames >= 2, "{key}: only {frames} frames");
    }

    // Non-stream bodies can be split too.
    let headers = [("x-mock-split-every", "10")];
    let v = post_json(&mock, CHAT, &headers, &chat(false)).await;
    assert_eq!(v["choices"][0]["message"]["content"], DEFAULT_TEXT);
}

#[tokio::test]
async fn directive_in_last_user_message() {
    let mock = MockUpstream::start().await.unwrap();
    let body = json!({
        "model": "m",
        "messages": [
            { "role": "user", "content": "#mock text=ignored" },
            { "role": "assistant", "content": "ok" },
            { "role": "user", "content": [
                { "type": "text", "text": "Question?\n#mock text=Hi+there%21 chunks=5 prompt_tokens=42" },
            ]},
        ],
    });
    let v = post_json(&mock, CHAT, &[], &body).await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hi there!");
    assert_eq!(v["usage"]["prompt_tokens"], 42);

    // Header wins over directive.
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let resp = post(&mock, CHAT, &[("x-mock-chunks", "2")], &stream_body).await;
    let chunks = data_json(&parse_sse(&resp.bytes().await.unwrap()));
    assert_eq!(delta_contents(&chunks), ["Hi th", "ere!"]);
}

#[tokio::test]
async fn max_tokens_truncates_with_length() {
    let mock = MockUpstream::start().await.unwrap();
    let mut body = chat(false);
    body["max_tokens"] = json!(3);
    let v = post_json(&mock, CHAT, &[], &body).await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hello from the");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn error_after_garbage_and_text_len() {
    let mock = MockUpstream::start().await.unwrap();
    let resp = post(&mock, CHAT, &[("x-mock-error-after", "2")], &chat(true)).await;
    assert_eq!(resp.status(), 200);
    let events = parse_sse(&resp.bytes().await.unwrap());
    let chunks = data_json(&events);
    assert!(events.iter().all(|(_, d)| d != "[DONE]"));
    let last = chunks.last().unwrap();
    assert_eq!(last["error"]["type"], "server_error");
    assert_eq!(chunks.len(), 4); // role, 2 content, error

    let resp = post(&mock, CHAT, &[("x-mock-error-after", "2")], &chat(false)).await;
    assert_eq!(resp.status(), 500);

    let resp = post(&mock, CHAT, &[("x-mock-garbage", "1")], &chat(true)).await;
    let bytes = resp.bytes().await.unwrap();
    assert!(std::str::from_utf8(&bytes).is_err());
    assert!(bytes.ends_with(b"data: [DONE]\n\n"));

    let headers = [("x-mock-text-len", "1000"), ("x-mock-chunks", "7")];
    let v = post_json(&mock, CHAT, &headers, &chat(false)).await;
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text.len(), 1000);
    assert!(text.starts_with("lorem ipsum dolor sit amet lorem"));
}

#[tokio::test]
async fn ttft_and_hang() {
    let mock = MockUpstream::start().await.unwrap();
    let started = Instant::now();
    let resp = post(&mock, CHAT, &[("x-mock-ttft-ms", "400")], &chat(true)).await;
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "headers were delayed"
    );
    resp.bytes().await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400));

    let resp = post(&mock, CHAT, &[("x-mock-hang", "1")], &chat(true)).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let next = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
    assert!(next.is_err(), "hanging stream produced data");

    let pending = reqwest::Client::new()
        .post(format!("{}{CHAT}", mock.base_url()))
        .header("x-mock-hang", "1")
        .json(&chat(false))
        .send();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), pending)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn recording_models_and_health() {
    let mock = MockUpstream::start().await.unwrap();
    let health = get_json(&mock, "/health").await;
    assert_eq!(health, json!({ "status": "ok" }));
    let models = get_json(&mock, "/v1/models").await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "mock");

    post(
        &mock,
        CHAT,
        &[("authorization", "Bearer sk-test")],
        &chat(false),
    )
    .await;
    let requests = mock.requests();
    assert_eq!(mock.request_count(), 2);
    assert_eq!(requests[0].path, "/v1/models");
    assert_eq!(requests[1].path, CHAT);
    assert_eq!(requests[1].header("Authorization"), Some("Bearer sk-test"));
    assert_eq!(requests[1].body["model"], "gpt-test");

    let listed = get_json(&mock, "/_mock/requests").await;
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(listed[1]["path"], CHAT);
}

#[test]
fn text_helpers() {
    let chunks = chunk_words(DEFAULT_TEXT);
    assert_eq!(chunks.len(), 13);
    assert_eq!(chunks.concat(), DEFAULT_TEXT);
    assert_eq!(chunk_words("  a  b"), ["  a  ", "b"]);
    assert_eq!(split_even("héllo", 2), ["hél", "lo"]);
    assert_eq!(split_even("ab", 5), ["a", "b"]);
    assert!(split_even("", 3).is_empty());
    assert_eq!(lorem(8), "lorem ip");
    assert_eq!(percent_decode("a+b%20c%zz%").unwrap(), "a b c%zz%");
    let d = parse_directives("hello\n  #mock ttft-ms=5 hang\n#mockery x=1\n#mock text=a");
    assert_eq!(d.get("ttft_ms").map(String::as_str), Some("5"));
    assert_eq!(d.get("hang").map(String::as_str), Some("1"));
    assert_eq!(d.get("text").map(String::as_str), Some("a"));
    assert!(!d.contains_key("x"));
}
