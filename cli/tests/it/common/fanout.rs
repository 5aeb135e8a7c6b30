//! Many concurrent requests at once (the load tests' 1,000 through two ingress processes): one
//! pooled client, one deadline, and the count of admitted against refused answers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::time::Duration;

/// Runs `call(client, i)` for every `i` in `0..n` concurrently on one client pooling `n`
/// connections; the results in order of `i`, or a panic when they take over 120 s.
pub(crate) async fn fan_out<T, F, Fut>(n: usize, call: F) -> Vec<T>
where
    F: Fn(reqwest::Client, usize) -> Fut,
    Fut: Future<Output = T>,
{
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(n)
        .build()
        .unwrap();
    let calls = (0..n).map(|i| call(client.clone(), i));
    tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(calls))
        .await
        .unwrap_or_else(|_| panic!("{n} requests within 120 s"))
}

/// One answer of [`chat_fan_out`].
#[derive(Debug)]
pub(crate) struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body as JSON.
    pub body: serde_json::Value,
}

/// `n` concurrent `POST /v1/chat/completions`, the i-th to `bases[i % bases.len()]` with bearer
/// `key(i)` and JSON `body`: their answers in order.
pub(crate) async fn chat_fan_out(
    bases: &[String],
    n: usize,
    key: impl Fn(usize) -> String,
    body: &serde_json::Value,
) -> Vec<Answer> {
    fan_out(n, |client, i| {
        let (base, key) = (bases[i % bases.len()].clone(), key(i));
        async move {
            let resp = super::chat_request(&client, &base, &key, body)
                .send()
                .await
                .unwrap();
            Answer {
                status: resp.status().as_u16(),
                headers: resp.headers().clone(),
                body: resp.json().await.unwrap(),
            }
        }
    })
    .await
}

/// Asserts that of `results` (statuses read by `status`) exactly `admitted` are 200 and all the
/// others 429 (so none 503); the message shows the first three that are neither.
pub(crate) fn assert_admitted<T: std::fmt::Debug>(
    results: &[T],
    status: impl Fn(&T) -> u16,
    admitted: usize,
) {
    let count = |s: u16| results.iter().filter(|r| status(r) == s).count();
    assert_eq!(
        (count(200), count(429)),
        (admitted, results.len() - admitted),
        "statuses: {:?}",
        results
            .iter()
            .filter(|r| !matches!(status(r), 200 | 429))
            .take(3)
            .collect::<Vec<_>>()
    );
}

/// The admission estimate of one user message `text` (its o200k tokens), as ingress reserves it.
pub(crate) fn prompt_tokens(text: &str) -> u64 {
    use switchyard_schemas::request::{Content, Message, Role};
    let messages = vec![Message {
        role: Role::User,
        content: Some(Content::Text(text.into())),
        name: None,
        tool_calls: vec![],
        tool_call_id: None,
        thinking_blocks: Vec::new(),
        cache_control: None,
    }];
    switchyard_ingress::trim::Estimate::of(&messages, &[]).total()
}
