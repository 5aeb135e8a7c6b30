//! Request-building helpers every adapter with its own wire format uses (Anthropic, Gemini,
//! Bedrock): one wording for invalid requests and one reading of tool-call arguments.

use serde_json::{Value, json};
use switchyard_schemas::request::ToolCall;
use switchyard_schemas::{ErrorClass, ErrorInfo};

/// An `invalid_request` error naming `param`.
pub(crate) fn invalid(param: &str, message: impl Into<String>) -> ErrorInfo {
    ErrorInfo::new(ErrorClass::InvalidRequest, message).with_param(param)
}

/// An `invalid_request` error about `messages[i]`.
pub(crate) fn bad_message(i: usize, what: impl std::fmt::Display) -> ErrorInfo {
    invalid("messages", format!("messages[{i}]: {what}"))
}

/// An assistant tool call's `arguments` (a JSON string in the normalised request) as the JSON
/// object the providers with typed tool input want; `{}` when empty. Anything else is a 400
/// naming `messages[i]`.
pub(crate) fn tool_call_input(call: &ToolCall, i: usize) -> Result<Value, ErrorInfo> {
    let raw = call.function.arguments.trim();
    let input: Value = if raw.is_empty() {
        json!({})
    } else {
        serde_json::from_str(raw).map_err(|e| {
            bad_message(
                i,
                format!("tool call `{}` arguments are not JSON: {e}", call.id),
            )
        })?
    };
    if !input.is_object() {
        return Err(bad_message(
            i,
            format!("tool call `{}` arguments must be a JSON object", call.id),
        ));
    }
    Ok(input)
}
