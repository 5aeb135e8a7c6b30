//! Anthropic Messages API adapter: `POST {base_url}/messages`, with `"stream": true` for streaming
//! clients; a non-streaming client's call is not streamed and its `message` object is read whole
//! (any `application/json` answer is, see [`parse_message`]).
//!
//! Request translation follows the Anthropic API reference, "Messages": instructions go in the
//! top-level `system` field, turns strictly alternate `user`/`assistant`, tool calls and results are
//! `tool_use` / `tool_result` content blocks, `tool_choice` is `auto|any|tool|none`, `max_tokens` is
//! required. Stream translation follows "Streaming Messages": `message_start`, then per content block
//! `content_block_start` / `content_block_delta`* / `content_block_stop`, then `message_delta`
//! (stop reason, cumulative usage) and `message_stop`; `ping` may appear anywhere; an `error` event
//! (e.g. `overloaded_error`) may end the stream; unknown event types must be ignored.

use serde_json::Value;
use switchyard_schemas::config::ProviderKind;
use switchyard_schemas::request::Passthrough;
use switchyard_schemas::{ChatRequest, ErrorInfo};

use crate::provider::{Call, EventStream, Provider, Upstream, send_checked};

/// Value of the `anthropic-version` header (Anthropic API reference, "Versions").
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `max_tokens` sent when the client gave none; Anthropic requires the field ("Messages").
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// Adapter for the Anthropic Messages API (`{base_url}/messages`, `x-api-key` auth,
/// `anthropic-version: 2023-06-01`). Stateless; streams upstream for streaming clients only.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnthropicProvider;

impl Provider for AnthropicProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Anthropic
    }

    fn stream_chat(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<EventStream> {
        let body = build_request(up.target, req).map(|body| body.to_string());
        // The synthetic JSON tool is in the request exactly when response_format asks for JSON.
        let structured = matches!(structured::json_tool(req), Ok(Some(_)));
        let builder = post(up, req, "/messages");
        Box::pin(async move {
            let resp = send_checked(builder?.body(body?)).await?;
            let parse = if structured {
                parse_structured_message
            } else {
                parse_message
            };
            let translator = AnthropicTranslator::new(structured);
            Ok(read_answer(resp, None, parse, translator))
        })
    }

    /// `POST {base_url}/messages/count_tokens` (Anthropic API reference, "Count Message tokens"):
    /// the request's body reduced to the fields that endpoint takes ([`COUNT_FIELDS`]), with the
    /// same headers; the answer's `input_tokens`.
    fn count_tokens(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<u64> {
        let body = build_request(up.target, req).map(|mut body| {
            if let Some(o) = body.as_object_mut() {
                o.retain(|k, _| COUNT_FIELDS.contains(&k.as_str()));
            }
            body.to_string()
        });
        let builder = post(up, req, "/messages/count_tokens");
        Box::pin(async move {
            let resp = send_checked(builder?.body(body?)).await?;
            let v: Value = resp
                .json()
                .await
                .map_err(|e| protocol(format!("unreadable count_tokens answer: {e}")))?;
            v.get("input_tokens")
                .and_then(Value::as_u64)
                .ok_or_else(|| protocol("count_tokens answer without `input_tokens`"))
        })
    }
}

/// Top-level fields `POST /v1/messages/count_tokens` accepts (Anthropic API reference, "Count
/// Message tokens"); the rest of a Messages body (`max_tokens`, sampling, `stream`, …) is not
/// sent there.
pub const COUNT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "mcp_servers",
    "context_management",
    "output_config",
    "output_format",
];

/// A JSON `POST` to the target's `path` with Anthropic's headers: `anthropic-version`,
/// `x-api-key` when the target has a key, and the passthrough headers (`anthropic-beta`).
fn post(
    up: Upstream<'_>,
    req: &ChatRequest,
    path: &str,
) -> Result<reqwest::RequestBuilder, ErrorInfo> {
    let mut builder = up
        .post_json(&up.url(path))
        .header("anthropic-version", ANTHROPIC_VERSION);
    if let Some(extra) = req.passthrough.get(Passthrough::ANTHROPIC) {
        for (name, value) in &extra.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
    }
    if let Some(key) = api_key_header(up.target)? {
        builder = builder.header("x-api-key", key);
    }
    Ok(builder)
}

use crate::providers::shared::{api_key_header, protocol, read_answer};

mod request;
mod stream;
pub mod structured;
mod tools;

pub use request::build_request;
#[cfg(test)]
use stream::Item;
pub use stream::{AnthropicTranslator, parse_message, parse_structured_message};

#[cfg(test)]
mod tests;
