//! One way for a test to call the gateway's HTTP API and to run the `switchyard` CLI, so each
//! test says what it sends and what it expects, not how a request is built.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;

/// One request to `url`, with bearer `key` and JSON `body` when given: the status and the body as
/// JSON (a body that is not JSON comes back as a JSON string).
pub(crate) async fn call(
    method: reqwest::Method,
    url: String,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut rb = reqwest::Client::new().request(method, url);
    if let Some(k) = key {
        rb = rb.bearer_auth(k);
    }
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let resp = rb.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `GET url` with bearer `key`: [`call`] without a body.
pub(crate) async fn get_as(url: String, key: &str) -> (u16, Value) {
    call(reqwest::Method::GET, url, Some(key), None).await
}

/// `POST url` with bearer `key` and JSON `body`: [`call`].
pub(crate) async fn post_as(url: String, key: &str, body: Value) -> (u16, Value) {
    call(reqwest::Method::POST, url, Some(key), Some(body)).await
}

/// `PATCH url` with bearer `key` and JSON `body`: [`call`].
pub(crate) async fn patch_as(url: String, key: &str, body: Value) -> (u16, Value) {
    call(reqwest::Method::PATCH, url, Some(key), Some(body)).await
}

/// `POST url` with bearer `key` and no body: [`call`].
pub(crate) async fn post_empty(url: String, key: &str) -> (u16, Value) {
    call(reqwest::Method::POST, url, Some(key), None).await
}

/// Runs `switchyard ARGS…` with `SWITCHYARD_ADMIN_KEY=admin_key`; asserts it exits 0 (its stderr
/// is the message otherwise) and returns its stdout.
pub(crate) async fn cli_ok(args: &[&str], admin_key: &str) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .env("SWITCHYARD_ADMIN_KEY", admin_key)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
