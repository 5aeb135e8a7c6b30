//! OpenAI `response_format` (`json_schema`, `json_object`) on the Anthropic Messages API.
//!
//! **Rule.** The schema is sent as a synthetic tool, [`JSON_TOOL`], whose `input_schema` is the
//! schema ([`anthropic_schema`]); the model's `tool_use` of it is turned back into the answer's
//! text content (streamed as text deltas, or whole), with `finish_reason: "stop"`, and is never
//! shown as a tool call. This is the technique LiteLLM uses, and it works on every Claude model
//! and every Anthropic-compatible host. Anthropic's own structured outputs (`output_format`
//! with the `structured-outputs-2025-11-13` beta, now GA as `output_config.format`; Anthropic
//! docs, "Structured outputs") are not used: only the newest models accept them and older models
//! answer 400, while the tool technique serves all of them. A client that wants them uses the
//! Anthropic front door, whose `output_config`/`output_format` pass through unchanged.
//!
//! `tool_choice` (Anthropic API reference, "Messages" → `tool_choice`):
//! - no user tools, or the client's `tool_choice` is `none`: `{"type":"tool","name":JSON_TOOL}`
//!   (the model must answer with the JSON; with `none` the user tools are still declared but
//!   the forced choice keeps the model off them);
//! - user tools and `auto` (or unset): `{"type":"auto"}` plus a system instruction to answer
//!   through [`JSON_TOOL`] whenever no other tool is called; a call of a real tool then comes
//!   back as that tool call only;
//! - `required` or a named function: as the client asked (`any` / that tool).
//!
//! While structured output is on, text blocks the model writes are held back: dropped when it
//! answers through [`JSON_TOOL`] (a preamble, not part of the JSON), sent at the end otherwise.
//! A user tool named [`JSON_TOOL`] is a 400 (`tools`) in such a request.

use serde_json::{Value, json};
use switchyard_schemas::ChatRequest;
use switchyard_schemas::ErrorInfo;
use switchyard_schemas::FinishReason;

use super::tools::{Tool, ToolChoice};
use crate::provider::Answer;
use crate::providers::shared::{invalid, json_tool_unclaimed, walk_schema};

pub use crate::providers::shared::{JSON_INSTRUCTION, JSON_TOOL};

/// The synthetic tool for the request's `response_format`, or `None` when it asks for text (or
/// is absent). Errors (`invalid_request`): an unknown `response_format` type, `json_schema`
/// without `json_schema.schema`, a schema whose top level is not an object, a user tool named
/// [`JSON_TOOL`].
pub(crate) fn json_tool(req: &ChatRequest) -> Result<Option<Tool>, ErrorInfo> {
    let Some(rf) = &req.params.response_format else {
        return Ok(None);
    };
    let (schema, description) = match rf.get("type").and_then(Value::as_str).unwrap_or("") {
        "text" => return Ok(None),
        "json_object" => (
            json!({ "type": "object" }),
            "Respond with a JSON object.".to_owned(),
        ),
        "json_schema" => {
            let js = rf.get("json_schema");
            let schema = js.and_then(|j| j.get("schema")).ok_or_else(|| {
                invalid("response_format", "json_schema needs json_schema.schema")
            })?;
            let name = js
                .and_then(|j| j.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("response");
            let mut description =
                format!("Respond with a JSON object matching the `{name}` schema.");
            if let Some(d) = js
                .and_then(|j| j.get("description"))
                .and_then(Value::as_str)
            {
                description = format!("{description} {d}");
            }
            (anthropic_schema(schema)?, description)
        }
        other => {
            return Err(invalid(
                "response_format",
                format!("response_format `{other}` is not supported by the Anthropic adapter"),
            ));
        }
    };
    json_tool_unclaimed(req, "on Anthropic")?;
    Ok(Some(Tool {
        name: JSON_TOOL.to_owned(),
        description: Some(description),
        input_schema: schema,
    }))
}

/// An OpenAI JSON schema as an Anthropic `input_schema`: `$schema`, `$id` and a `strict` flag
/// some clients put inside the schema are stripped (they are not validation keywords, and
/// `strict` is not JSON Schema); a top level without `type` gets `"type":"object"` (Anthropic
/// requires `input_schema.type` to be `object`); any other top-level type is a 400
/// (`response_format`). `$ref`/`$defs`, `additionalProperties` and the rest stay: Anthropic's
/// tool schemas take full JSON Schema.
pub fn anthropic_schema(schema: &Value) -> Result<Value, ErrorInfo> {
    let mut out = schema.clone();
    let Some(top) = out.as_object_mut() else {
        return Err(invalid(
            "response_format",
            "json_schema.schema must be a JSON object",
        ));
    };
    match top.get("type") {
        None => {
            top.insert("type".into(), json!("object"));
        }
        Some(t) if t == "object" => {}
        Some(t) => {
            return Err(invalid(
                "response_format",
                format!("Anthropic needs a top-level object schema, not type {t}"),
            ));
        }
    }
    walk_schema(&mut out, &mut |o| {
        for k in ["$schema", "$id", "strict"] {
            o.remove(k);
        }
    });
    Ok(out)
}

/// The Anthropic `tool_choice` with [`JSON_TOOL`] declared (see the module rule), given the
/// one translated from the client's choice (`None`: unset) and whether user tools exist.
/// Returns the choice and whether [`JSON_INSTRUCTION`] is needed.
pub(crate) fn tool_choice(user_choice: Option<ToolChoice>, user_tools: bool) -> (ToolChoice, bool) {
    let forced = ToolChoice::Tool {
        name: JSON_TOOL.to_owned(),
        disable_parallel_tool_use: false,
    };
    match user_choice {
        _ if !user_tools => (forced, false),
        Some(ToolChoice::None) => (forced, false),
        Some(choice @ (ToolChoice::Any { .. } | ToolChoice::Tool { .. })) => (choice, false),
        Some(choice @ ToolChoice::Auto { .. }) => (choice, true),
        None => (
            ToolChoice::Auto {
                disable_parallel_tool_use: false,
            },
            true,
        ),
    }
}

/// A non-streamed answer with [`JSON_TOOL`]'s call turned into the text content (other text
/// dropped) and `finish_reason` `stop` when no real tool was called.
pub fn into_content(mut answer: Answer) -> Answer {
    let at = answer
        .tool_calls
        .iter()
        .position(|(_, name, _)| name.as_deref() == Some(JSON_TOOL));
    if let Some(at) = at {
        let (_, _, arguments) = answer.tool_calls.remove(at);
        answer.text = arguments;
        if answer.tool_calls.is_empty() {
            answer.finish_reason = FinishReason::Stop;
        }
    }
    answer
}
