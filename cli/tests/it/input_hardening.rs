//! Input hardening (issue 13, Deliver 5): bad tool definitions, tool results without the id of
//! their call, untrusted image URLs and image data whose bytes are not the declared type are
//! a 400 in each front door's own error shape naming the field, with zero upstream calls (no
//! retry, no fallback: `demo/fallback` would try a second target), and long model names are not
//! echoed whole.

use crate::common::{Gateway, Options, start};
use serde_json::{Value, json};

/// A 1×1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
/// The first bytes of a JPEG (SOI + JFIF APP0).
const JPEG: &str = "/9j/4AAQSkZJRg==";
/// The first bytes of a GIF89a.
const GIF: &str = "R0lGODlhAQABAAAAACw=";
/// `<html>`.
const HTML: &str = "PGh0bWw+";

/// The untrusted image URLs every door refuses.
fn bad_urls() -> Vec<String> {
    vec![
        "file:///etc/passwd".into(),
        "ftp://example.com/cat.png".into(),
        "http://169.254.169.254/latest/meta-data/iam/".into(),
        "http://127.0.0.1:8080/admin".into(),
        "http://2130706433/".into(),
        "http://[::1]/x.png".into(),
        "http://[::ffff:10.0.0.1]/x.png".into(),
        "http://localhost/x.png".into(),
        "http://10.0.0.1/x.png".into(),
        "http://192.168.0.10/x.png".into(),
        "https://user:pass@example.com/x.png".into(),
        "data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=".into(),
        "data:text/html;base64,PGh0bWw+".into(),
        format!("data:image/png;base64,{JPEG}"),
        format!("data:image/jpeg;base64,{HTML}"),
        "data:image/png;base64,@@@@".into(),
        "data:image/png,notbase64".into(),
    ]
}

async fn send(gw: &Gateway, path: &str, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", gw.base))
        .bearer_auth("sk-test")
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// An OpenAI-shaped 400 `invalid_request_error` naming `param`.
async fn openai_400(gw: &Gateway, path: &str, body: Value, param: &str) {
    let (status, b) = send(gw, path, &body).await;
    assert_eq!(status, 400, "{path} {body}: {b}");
    assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
    assert_eq!(b["error"]["param"], param, "{body}: {b}");
    let msg = crate::common::error_message(&b);
    assert!(msg.contains(param), "{msg}");
}

/// Anthropic's 400 `{"type":"error","error":{"type":"invalid_request_error","message":"<param>: …"}}`.
async fn anthropic_400(gw: &Gateway, body: Value, param: &str) {
    let (status, b) = send(gw, "/v1/messages", &body).await;
    assert_eq!(status, 400, "{body}: {b}");
    assert_eq!(b["type"], "error", "{b}");
    assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
    let msg = crate::common::error_message(&b);
    assert!(msg.starts_with(&format!("{param}: ")), "{body}: {msg}");
}

fn chat(messages: Value, tools: Option<Value>) -> Value {
    let mut b = json!({"model": "demo/fallback", "messages": messages});
    if let Some(t) = tools {
        b["tools"] = t;
    }
    b
}

fn hi() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_door_refuses_bad_tools_tool_results_and_images() {
    let gw = start(Options::default()).await;
    let path = "/v1/chat/completions";
    let tool = |t: Value| chat(hi(), Some(json!([t])));
    openai_400(
        &gw,
        path,
        tool(json!({"type": "garbage", "function": {"name": "f"}})),
        "tools[0].type",
    )
    .await;
    for name in ["bad name!", "x.y", "", &"a".repeat(65)] {
        openai_400(
            &gw,
            path,
            tool(json!({"type": "function", "function": {"name": name}})),
            "tools[0].function.name",
        )
        .await;
    }
    for params in [json!("string"), json!([1]), json!({"type": "string"})] {
        openai_400(
            &gw,
            path,
            tool(json!({"type": "function", "function": {"name": "f", "parameters": params}})),
            "tools[0].function.parameters",
        )
        .await;
    }
    // Legacy `functions`: named as sent.
    openai_400(
        &gw,
        path,
        json!({"model": "demo/fallback", "messages": hi(), "functions": [{"name": "no spaces"}]}),
        "functions[0].name",
    )
    .await;
    let call = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
    for result in [
        json!({"role": "tool", "content": "sunny"}),
        json!({"role": "tool", "content": "sunny", "tool_call_id": ""}),
    ] {
        openai_400(
            &gw,
            path,
            chat(
                json!([{"role": "user", "content": "w?"}, call, result]),
                None,
            ),
            "messages[2].tool_call_id",
        )
        .await;
    }
    for url in bad_urls() {
        let m = json!([{"role": "user", "content": [{"type": "text", "text": "what is it"},
            {"type": "image_url", "image_url": {"url": url}}]}]);
        openai_400(
            &gw,
            path,
            chat(m, None),
            "messages[0].content[1].image_url.url",
        )
        .await;
    }
    // A long model name is not echoed whole.
    let long = format!("x/{}", "m".repeat(10_000));
    let (status, b) = send(&gw, path, &json!({"model": long, "messages": hi()})).await;
    assert_eq!(status, 404, "{b}");
    assert_eq!(b["error"]["code"], "model_not_found");
    assert!(crate::common::error_message(&b).len() < 200, "{b}");
    // Nothing went upstream, nothing was retried or failed over.
    assert_eq!(gw.mock.request_count(), 0);

    // Trusted images do go through: a real PNG, a JPEG and GIF of their declared type, a web URL.
    for url in [
        format!("data:image/png;base64,{PNG}"),
        format!("data:image/jpeg;base64,{JPEG}"),
        format!("data:image/gif;base64,{GIF}"),
        "https://example.com/cat.png".into(),
    ] {
        let m = json!([{"role": "user", "content": [{"type": "text", "text": "what is it"},
            {"type": "image_url", "image_url": {"url": url}}]}]);
        let (status, b) = send(&gw, path, &json!({"model": "demo/mock", "messages": m})).await;
        assert_eq!(status, 200, "{url}: {b}");
    }
    assert_eq!(gw.mock.request_count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_door_refuses_bad_tools_tool_results_and_images() {
    let gw = start(Options::default()).await;
    let path = "/v1/responses";
    let with_tool = |t: Value| json!({"model": "demo/fallback", "input": "hi", "tools": [t]});
    for (tool, param) in [
        (json!({"type": "garbage", "name": "f"}), "tools[0].type"),
        (
            json!({"type": "function", "name": "bad name!"}),
            "tools[0].name",
        ),
        (
            json!({"type": "function", "name": "f", "parameters": {"type": "string"}}),
            "tools[0].parameters",
        ),
    ] {
        openai_400(&gw, path, with_tool(tool), param).await;
    }
    let call = json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"});
    for output in [
        json!({"type": "function_call_output", "output": "sunny"}),
        json!({"type": "function_call_output", "call_id": " ", "output": "sunny"}),
    ] {
        openai_400(
            &gw,
            path,
            json!({"model": "demo/fallback", "input": [call, output]}),
            "input[1].call_id",
        )
        .await;
    }
    for url in bad_urls() {
        let input = json!([{"role": "user", "content": [{"type": "input_text", "text": "what"},
            {"type": "input_image", "image_url": url}]}]);
        openai_400(
            &gw,
            path,
            json!({"model": "demo/fallback", "input": input}),
            "input[0].content[1].image_url",
        )
        .await;
    }
    assert_eq!(gw.mock.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_door_refuses_bad_tools_tool_results_and_images() {
    let gw = start(Options::default()).await;
    let msg =
        |messages: Value| json!({"model": "demo/claude", "max_tokens": 16, "messages": messages});
    let user_hi = json!([{"role": "user", "content": "hi"}]);
    let with_tool = |t: Value| json!({"model": "demo/claude", "max_tokens": 16, "messages": user_hi, "tools": [t]});
    anthropic_400(
        &gw,
        with_tool(json!({"name": "bad name!", "input_schema": {"type": "object"}})),
        "tools[0].name",
    )
    .await;
    for schema in [json!("x"), json!({"type": "string"})] {
        anthropic_400(
            &gw,
            with_tool(json!({"name": "f", "input_schema": schema})),
            "tools[0].input_schema",
        )
        .await;
    }
    let call = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]});
    anthropic_400(
        &gw,
        msg(json!([{"role": "user", "content": "w?"}, call,
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "", "content": "x"}]}])),
        "messages[2].content[0].tool_use_id",
    )
    .await;
    // Missing altogether: the deserialiser names the block and the field.
    let (status, b) = send(
        &gw,
        "/v1/messages",
        &msg(json!([{"role": "user", "content": "w?"}, call,
            {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}])),
    )
    .await;
    assert_eq!(status, 400, "{b}");
    assert!(
        crate::common::error_message(&b).contains("tool_use_id"),
        "{b}"
    );
    anthropic_400(
        &gw,
        msg(json!([{"role": "user", "content": "w?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "a b", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}])),
        "messages[1].content[0].name",
    )
    .await;
    let image = |source: Value| {
        msg(
            json!([{"role": "user", "content": [{"type": "text", "text": "what"},
            {"type": "image", "source": source}]}]),
        )
    };
    anthropic_400(
        &gw,
        image(json!({"type": "base64", "media_type": "image/svg+xml", "data": "PHN2Zz4="})),
        "messages[0].content[1].source.media_type",
    )
    .await;
    for (media, data) in [
        ("image/png", GIF),
        ("image/gif", HTML),
        ("image/webp", "!!"),
    ] {
        anthropic_400(
            &gw,
            image(json!({"type": "base64", "media_type": media, "data": data})),
            "messages[0].content[1].source.data",
        )
        .await;
    }
    for url in bad_urls().into_iter().filter(|u| !u.starts_with("data:")) {
        anthropic_400(
            &gw,
            image(json!({"type": "url", "url": url})),
            "messages[0].content[1].source.url",
        )
        .await;
    }
    // Inside a tool result too.
    anthropic_400(
        &gw,
        msg(json!([{"role": "user", "content": "w?"}, call,
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/"}}]}]}])),
        "messages[2].content[0].content[0].source.url",
    )
    .await;
    assert_eq!(gw.mock.request_count(), 0);
    // A PNG that is one goes through.
    let (status, b) = send(
        &gw,
        "/v1/messages",
        &image(json!({"type": "base64", "media_type": "image/png", "data": PNG})),
    )
    .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(gw.mock.request_count(), 1);
}
