//! The Anthropic front door, `POST /v1/messages` (Anthropic API reference, "Messages" and
//! "Streaming Messages"): the official `anthropic` SDKs and Claude-Code-style clients reach any
//! provider. The body becomes the normalised request ([`request::parse`]), is routed exactly like
//! the OpenAI front door's ([`crate::route::route`], fallback included), and the frames are written
//! back as a `Message` object or Anthropic SSE events ([`response`]). Errors use Anthropic's shape
//! ([`ApiError::into_anthropic_response`]). Responses carry `request-id` (Anthropic's header name)
//! besides the `x-request-id` / `x-switchyard-*` headers of [`crate::route::Served`].

pub mod count;
pub mod request;
pub mod response;

use crate::AppState;
use crate::error::ApiError;
use crate::front_door::{self, FrontDoor, ReplyMeta};
use crate::route::{Aggregate, Inbound};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use response::{MessageMeta, StreamEncoder};
use std::sync::Arc;

/// The `POST /v1/messages` handler (Anthropic API reference, "Messages").
/// `?beta=true` (the SDKs' `client.beta.messages`) is accepted and changes nothing; the
/// `anthropic-beta` header is carried to an Anthropic upstream.
pub async fn messages(
    State(app): State<Arc<AppState>>,
    ctx: crate::context::Ctx,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let door = AnthropicMessages {
        beta: beta_header(&headers),
    };
    front_door::serve(door, app, &ctx, &headers, &body).await
}

/// The `anthropic-beta` header's values (all of its lines, comma-joined).
pub fn beta_header(headers: &HeaderMap) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// 404 in Anthropic's shape for any other path under `/v1/messages/`.
pub async fn unknown_path(uri: axum::http::Uri) -> Response {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found_error",
        "unknown_url",
        format!("Not found: {}", uri.path()),
    )
    .into_anthropic_response()
}

/// The Anthropic Messages protocol.
#[derive(Debug, Clone, Default)]
pub struct AnthropicMessages {
    /// The request's `anthropic-beta` header.
    pub beta: Option<String>,
}

fn meta(m: &ReplyMeta) -> MessageMeta {
    MessageMeta {
        id: format!("msg_{}", m.request_id.simple()),
        model: m.model.clone(),
    }
}

impl FrontDoor for AnthropicMessages {
    type Stream = StreamEncoder;

    fn parse(&self, body: &[u8]) -> Result<Inbound, ApiError> {
        request::parse_with(body, self.beta.as_deref())
    }

    fn stream(&self, m: &ReplyMeta) -> StreamEncoder {
        StreamEncoder::new(meta(m))
    }

    fn aggregate(&self, m: &ReplyMeta, agg: &Aggregate) -> Result<serde_json::Value, ApiError> {
        response::message(&meta(m), agg)
    }

    fn error(&self, e: ApiError) -> Response {
        e.into_anthropic_response()
    }

    /// Anthropic's own `request-id` header.
    fn headers(&self, m: &ReplyMeta, resp: &mut Response) {
        if let Ok(v) = HeaderValue::from_str(&m.request_id.to_string()) {
            resp.headers_mut().insert("request-id", v);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::request::parse;
    use serde_json::{Value, json};

    fn body(extra: Value) -> Vec<u8> {
        let mut v = json!({"model": "demo/mock", "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        v.to_string().into_bytes()
    }

    fn rejected(extra: Value) -> (String, String) {
        let e = parse(&body(extra)).unwrap_err();
        assert_eq!(e.status.as_u16(), 400, "{}", e.message);
        (e.param.unwrap_or_default(), e.message)
    }

    #[test]
    fn translates_a_tool_round_trip() {
        let p = parse(&body(json!({
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Look"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Calling"},
                    {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"},
                        "caller": {"type": "direct"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "c", "is_error": true},
                    {"type": "text", "text": "Thanks"}]},
                {"role": "assistant", "content": "Sure"}],
            "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object"},
                "eager_input_streaming": true, "cache_control": {"type": "ephemeral"}}],
            "cache_control": {"type": "ephemeral"},
            "tool_choice": {"type": "tool", "name": "w", "disable_parallel_tool_use": true},
            "metadata": {"user_id": "u1"}, "stop_sequences": ["END"], "stream": true,
            "temperature": 0.5, "thinking": {"type": "disabled"},
        })))
        .unwrap();
        let msgs = serde_json::to_value(&p.messages).unwrap();
        assert_eq!(
            msgs,
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
                {"role": "assistant", "content": "Calling", "tool_calls": [{"id": "t1", "type": "function",
                    "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "content": "a\nb", "tool_call_id": "t1"},
                {"role": "tool", "content": "c", "tool_call_id": "t2"},
                {"role": "user", "content": "Thanks"},
                {"role": "assistant", "content": "Sure"}
            ])
        );
        assert_eq!(
            p.tool_choice,
            Some(json!({"type": "function", "function": {"name": "w"}}))
        );
        assert_eq!(p.params.parallel_tool_calls, Some(false));
        assert_eq!(p.params.user.as_deref(), Some("u1"));
        assert_eq!(p.params.stop, vec!["END".to_owned()]);
        assert_eq!(p.params.max_tokens, Some(64));
        assert!(p.stream);
        assert_eq!(
            p.tools[0].function.parameters,
            Some(json!({"type": "object"}))
        );
    }

    /// Everything Claude Code and the current SDK send is accepted; Anthropic-only fields ride in
    /// the Anthropic passthrough, with the beta header.
    #[test]
    fn accepts_the_full_surface() {
        let system = json!([{"type": "text", "text": "You are Claude Code.",
            "cache_control": {"type": "ephemeral"}}]);
        let tools = json!([{"name": "Bash", "description": "run", "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"}, "defer_loading": false}]);
        let raw = body(json!({
            "system": system,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Let me think.", "signature": "EqQBCkYIBRgCKkA1"},
                    {"type": "redacted_thinking", "data": "abc"},
                    {"type": "text", "text": "Hello"}]},
                {"role": "system", "content": "Mid-conversation reminder."},
                {"role": "user", "content": "go"}],
            "tools": tools,
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"},
            "service_tier": "auto", "top_k": 5, "metadata": {"user_id": "u1"},
            "temperature": null, "stop_sequences": null,
        }));
        let p = super::request::parse_with(&raw, Some("interleaved-thinking-2025-05-14")).unwrap();
        let msgs = serde_json::to_value(&p.messages).unwrap();
        assert_eq!(
            msgs,
            json!([
                {"role": "system", "content": "You are Claude Code."},
                {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}},
                {"role": "assistant", "content": "Hello", "thinking_blocks": [
                    {"type": "thinking", "thinking": "Let me think.", "signature": "EqQBCkYIBRgCKkA1"},
                    {"type": "redacted_thinking", "data": "abc"}]},
                {"role": "system", "content": "Mid-conversation reminder."},
                {"role": "user", "content": "go"}
            ])
        );
        assert_eq!(p.params.top_k, Some(5));
        let extra = &p.passthrough["anthropic"];
        assert_eq!(
            extra.headers["anthropic-beta"],
            "interleaved-thinking-2025-05-14"
        );
        assert_eq!(
            Value::Object(extra.body.clone()),
            json!({"thinking": {"type": "adaptive"},
                "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                "output_config": {"effort": "high"}, "service_tier": "auto",
                "metadata": {"user_id": "u1"}, "tools": tools, "system": system})
        );
        for thinking in [
            json!({"type": "enabled", "budget_tokens": 1024}),
            json!({"type": "disabled"}),
        ] {
            assert!(parse(&body(json!({"thinking": thinking}))).is_ok());
        }
    }

    /// A real Claude Code request (2.1.332, third turn of `tests/e2e/test_claude_code.py`, long
    /// texts shortened): every field it sends is accepted and the Anthropic-only ones pass through.
    #[test]
    fn claude_code_request_parses() {
        let captured: Value =
            serde_json::from_str(include_str!("claude_code_request.json")).unwrap();
        let raw = captured["body"].to_string();
        let beta = captured["anthropic-beta"].as_str();
        let p = super::request::parse_with(raw.as_bytes(), beta).unwrap();
        assert!(p.stream);
        assert_eq!(
            p.tools.len(),
            captured["body"]["tools"].as_array().unwrap().len()
        );
        let extra = &p.passthrough["anthropic"];
        for k in [
            "thinking",
            "context_management",
            "output_config",
            "metadata",
            "tools",
            "system",
        ] {
            assert_eq!(extra.body[k], captured["body"][k], "{k}");
        }
        assert_eq!(extra.headers["anthropic-beta"], beta.unwrap());
        let roles: Vec<_> = p.messages.iter().map(|m| m.role).collect();
        use switchyard_schemas::request::Role::*;
        assert_eq!(roles, [System, User, Assistant, Tool, Assistant, Tool]);
        assert!(p.messages[1].cache_control.is_none());
        assert_eq!(
            p.messages[5].cache_control,
            Some(json!({"type": "ephemeral"}))
        );
    }

    /// Server tools go to an Anthropic upstream only (raw `tools`), not into the normalised list.
    #[test]
    fn server_tools_ride_in_the_passthrough() {
        let tools = json!([{"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
            {"name": "w", "input_schema": {"type": "object"}}]);
        let p = parse(&body(
            json!({"tools": tools, "tool_choice": {"type": "any"}}),
        ))
        .unwrap();
        assert_eq!(p.tools.len(), 1);
        assert_eq!(p.tools[0].function.name, "w");
        assert_eq!(p.tool_choice, Some(json!("required")));
        assert_eq!(p.passthrough["anthropic"].body["tools"], tools);
        let only = json!({"tools": [tools[0].clone()], "tool_choice": {"type": "any"}});
        let p = parse(&body(only)).unwrap();
        assert!(p.tools.is_empty() && p.tool_choice.is_none());
    }

    #[test]
    fn tool_choice_kinds() {
        let tools = json!([{"name": "w", "input_schema": {}}]);
        for (choice, expected) in [
            (json!({"type": "auto"}), json!("auto")),
            (json!({"type": "any"}), json!("required")),
            (json!({"type": "none"}), json!("none")),
        ] {
            let p = parse(&body(json!({"tools": tools, "tool_choice": choice}))).unwrap();
            assert_eq!(p.tool_choice, Some(expected));
            assert_eq!(p.params.parallel_tool_calls, None);
        }
    }

    #[test]
    fn errors_name_the_field() {
        let mut v: Value = serde_json::from_slice(&body(json!({}))).unwrap();
        v.as_object_mut().unwrap().remove("max_tokens");
        let e = parse(v.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.message, "max_tokens: Field required");
        assert_eq!(
            rejected(json!({"thinking": {"type": "enabled", "budget_tokens": 100}})).0,
            "thinking.enabled.budget_tokens"
        );
        assert_eq!(
            rejected(json!({"thinking": {"type": "sometimes"}})).0,
            "thinking.type"
        );
        let (param, msg) = rejected(json!({"bogus": 1}));
        assert_eq!(
            (param.as_str(), msg.as_str()),
            ("bogus", "bogus: Extra inputs are not permitted")
        );
        assert_eq!(rejected(json!({"temperature": 1.5})).0, "temperature");
        let m = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
        let (param, msg) = rejected(m(json!([{"type": "text", "text": "x", "extra": 1}])));
        assert_eq!(param, "messages[0].content[0]");
        assert!(msg.contains("extra"), "{msg}");
        assert_eq!(
            rejected(m(json!([{"type": "thinking", "thinking": "x"}]))).0,
            "messages[0].content[0]"
        );
        assert_eq!(
            rejected(m(json!([{"type": "document_x", "x": 1}]))).0,
            "messages[0].content[0].type"
        );
        assert_eq!(rejected(m(json!([]))).0, "messages[0].content");
        let role = json!({"messages": [{"role": "wizard", "content": "x"}]});
        assert_eq!(rejected(role).0, "messages[0].role");
        let server = json!({"tools": [{"type": 5, "name": "web_search"}]});
        assert_eq!(rejected(server).0, "tools[0].type");
        assert_eq!(
            rejected(json!({"tool_choice": {"type": "any"}})).0,
            "tool_choice"
        );
        assert!(parse(b"{nope").unwrap_err().param.is_none());
    }
}
