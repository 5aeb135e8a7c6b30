//! Test helpers shared by the provider adapters' test modules.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::provider::Provider;
use futures::StreamExt;
use serde_json::{Value, json};
use switchyard_schemas::config::TargetConfig;
use switchyard_schemas::{ChatRequest, ErrorInfo, FrameBody};

/// One normalised event of an upstream stream.
pub(crate) type Item = Result<FrameBody, ErrorInfo>;

/// A streaming request for `model` on target (`id`, `provider`, `upstream_model`), with `extra`
/// top-level fields merged in.
pub(crate) fn request(
    model: &str,
    target: (&str, &str, &str),
    messages: Value,
    extra: Value,
) -> ChatRequest {
    let (id, provider, upstream_model) = target;
    let mut v = json!({"id": "01900000-0000-7000-8000-000000000000", "model": model,
        "target": {"id": id, "provider": provider, "upstream_model": upstream_model},
        "messages": messages, "stream": true, "deadline_ms": 0});
    if let (Some(obj), Value::Object(extra)) = (v.as_object_mut(), extra) {
        obj.extend(extra);
    }
    serde_json::from_value(v).unwrap()
}

/// The last user message text with a `#mock` directive line steering the mock.
pub(crate) fn directive_messages(directives: &str) -> Value {
    json!([{"role": "user", "content": format!("hi\n#mock {directives}")}])
}

/// Runs `req` against `target` through `provider` and collects every event.
pub(crate) async fn collect(
    provider: &dyn Provider,
    target: &TargetConfig,
    req: &ChatRequest,
) -> Result<Vec<Item>, ErrorInfo> {
    let http = reqwest::Client::new();
    Ok(provider
        .stream_chat(&http, target, &target.base_url, req)
        .await?
        .collect()
        .await)
}

/// Feeds `chunks` as separate writes through the SSE parser and a fresh `T`, as `translate_sse`
/// does with a live response.
pub(crate) fn translate_chunks<T: crate::provider::SseTranslator + Default>(
    chunks: &[&str],
) -> Vec<Item> {
    let (mut parser, mut events) = (crate::sse::SseParser::new(), Vec::new());
    for chunk in chunks {
        parser.push(chunk.as_bytes(), &mut events).unwrap();
    }
    events.extend(parser.finish());
    let (mut tr, mut out) = (T::default(), std::collections::VecDeque::new());
    if !events.into_iter().any(|ev| tr.on_event(ev, &mut out)) {
        tr.on_eof(&mut out);
    }
    out.into_iter().collect()
}
