//! Parts the adapters share: request building for those with their own wire format (Anthropic,
//! Gemini, Bedrock: one wording for invalid requests, one reading of tool-call arguments and
//! message content, one turn merging), the target's key as a header, and reading an answer that
//! is either one JSON object or an SSE stream.

use reqwest::header::HeaderValue;
use std::collections::VecDeque;

use serde::Serialize;
use serde_json::{Value, json};
use switchyard_schemas::config::TargetConfig;
use switchyard_schemas::request::{Content, ContentPart, FilePart, ToolCall};
use switchyard_schemas::{ErrorClass, ErrorInfo, FrameBody};

use crate::provider::{
    Answer, EventStream, SseTranslator, TypedParse, is_json_answer, translate_json, translate_sse,
};

/// Name of the synthetic tool that carries a `response_format` JSON answer on providers that
/// get it as a tool call (Anthropic always, Gemini alongside user tools); LiteLLM's name for it.
pub const JSON_TOOL: &str = "json_tool_call";

/// The system instruction added when user tools compete with [`JSON_TOOL`].
pub const JSON_INSTRUCTION: &str = "When you answer without calling one of the other tools, \
     give your final answer by calling the `json_tool_call` tool with it; do not answer in plain \
     text.";

/// `Ok` unless a user tool is named [`JSON_TOOL`], which a request that gets its
/// `response_format` through that synthetic tool cannot have: then an `invalid_request` error
/// naming `tools` ("the tool name `json_tool_call` is reserved for response_format {context}").
pub(crate) fn json_tool_unclaimed(
    req: &switchyard_schemas::ChatRequest,
    context: &str,
) -> Result<(), ErrorInfo> {
    if req.tools.iter().any(|t| t.function.name == JSON_TOOL) {
        return Err(invalid(
            "tools",
            format!("the tool name `{JSON_TOOL}` is reserved for response_format {context}"),
        ));
    }
    Ok(())
}

/// An `invalid_request` error naming `param`.
pub(crate) fn invalid(param: &str, message: impl Into<String>) -> ErrorInfo {
    ErrorInfo::new(ErrorClass::InvalidRequest, message).with_param(param)
}

/// `Ok` unless `n` asks for more than one choice, which the providers with their own wire format
/// cannot give: then an `invalid_request` error naming `n` ("n=N is not supported by {who} (one
/// choice only)").
pub(crate) fn one_choice(n: Option<u32>, who: &str) -> Result<(), ErrorInfo> {
    match n.filter(|n| *n > 1) {
        Some(n) => Err(invalid(
            "n",
            format!("n={n} is not supported by {who} (one choice only)"),
        )),
        None => Ok(()),
    }
}

/// An `invalid_request` error about `messages[i]`.
pub(crate) fn bad_message(i: usize, what: impl std::fmt::Display) -> ErrorInfo {
    invalid("messages", format!("messages[{i}]: {what}"))
}

/// A `protocol` error: the upstream's answer could not be read.
pub(crate) fn protocol(message: impl Into<String>) -> ErrorInfo {
    ErrorInfo::new(ErrorClass::Protocol, message)
}

/// One SSE event's `data` as JSON; when it is not, a `protocol` error ("upstream sent an
/// unparsable stream {what}") goes to `out` instead and the stream ends there.
pub(crate) fn parse_event(
    data: &str,
    what: &str,
    out: &mut VecDeque<Result<FrameBody, ErrorInfo>>,
) -> Option<Value> {
    match serde_json::from_str(data) {
        Ok(v) => Some(v),
        Err(e) => {
            out.push_back(Err(protocol(format!(
                "upstream sent an unparsable stream {what}: {e}"
            ))));
            None
        }
    }
}

/// `value` as a header value marked sensitive (kept out of logs and debug output); an `auth`
/// error when it is not a valid header value.
pub(crate) fn secret_header(value: &str) -> Result<HeaderValue, ErrorInfo> {
    let mut header = HeaderValue::from_str(value)
        .map_err(|_| ErrorInfo::new(ErrorClass::Auth, "api_key is not a valid header value"))?;
    header.set_sensitive(true);
    Ok(header)
}

/// The target's `api_key` as a [`secret_header`]; `None` when the target has no key.
pub(crate) fn api_key_header(target: &TargetConfig) -> Result<Option<HeaderValue>, ErrorInfo> {
    if target.api_key.is_empty() {
        return Ok(None);
    }
    secret_header(target.api_key.expose()).map(Some)
}

/// Reads a successful answer by its `Content-Type`: one JSON object through `typed` (when it
/// reads it) or `parse`, or an SSE
/// stream through `translator`.
pub(crate) fn read_answer<T: SseTranslator>(
    resp: reqwest::Response,
    typed: Option<TypedParse>,
    parse: fn(&Value) -> Result<Answer, ErrorInfo>,
    translator: T,
) -> EventStream {
    if is_json_answer(&resp) {
        translate_json(resp, typed, parse)
    } else {
        translate_sse(resp, translator)
    }
}

/// One turn of a conversation on the providers whose turns are `{"role","content":[blocks]}`
/// (Anthropic "Messages" → `messages`, Bedrock "Converse" → `Message`), `B` being the
/// provider's content block.
#[derive(Debug, Serialize)]
pub(crate) struct Turn<B> {
    /// `user` or `assistant`.
    pub role: &'static str,
    /// The turn's blocks, never empty.
    pub content: Vec<B>,
}

/// Appends `blocks` as a `role` turn, merging into the previous turn when it has the same role
/// (Anthropic and Bedrock Converse require alternating roles). Turns without blocks are dropped
/// (both reject empty content).
pub(crate) fn push_turn<B>(turns: &mut Vec<Turn<B>>, role: &'static str, blocks: Vec<B>) {
    if blocks.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => last.content.extend(blocks),
        _ => turns.push(Turn {
            role,
            content: blocks,
        }),
    }
}

/// A typed request body (or part of one) as JSON, to merge open client JSON into; an
/// `internal` error in the (unexpected) case serde cannot represent it.
pub(crate) fn to_json<T: Serialize>(value: &T) -> Result<Value, ErrorInfo> {
    serde_json::to_value(value).map_err(|e| {
        ErrorInfo::new(
            ErrorClass::Internal,
            format!("cannot encode the upstream request: {e}"),
        )
    })
}

/// [`to_json`] of a body that serialises to a JSON object, as that object.
pub(crate) fn to_json_object<T: Serialize>(
    value: &T,
) -> Result<serde_json::Map<String, Value>, ErrorInfo> {
    match to_json(value)? {
        Value::Object(o) => Ok(o),
        _ => Err(ErrorInfo::new(
            ErrorClass::Internal,
            "the upstream request is not a JSON object",
        )),
    }
}

/// The input schema sent for a tool declared without `parameters` (`{"type":"object",
/// "properties":{}}`): Anthropic ("Messages" → `tools[].input_schema`) and Bedrock
/// ("ToolSpecification" → `inputSchema`) require one on every tool.
pub(crate) fn empty_object_schema() -> Value {
    json!({ "type": "object", "properties": {} })
}

/// How one provider writes the parts of a message's content: the codec [`PartCodec::blocks`]
/// runs over each message.
pub(crate) struct PartCodec<B> {
    /// A non-empty text part.
    pub text: fn(&str) -> B,
    /// An image part's URL (`data:` or `http(s)`) of `messages[i]`.
    pub image: fn(&str, usize) -> Result<B, ErrorInfo>,
    /// A file part of `messages[i]`.
    pub file: fn(&FilePart, usize) -> Result<B, ErrorInfo>,
}

impl<B> PartCodec<B> {
    /// The blocks of `messages[i]`'s content; empty text is skipped (the providers reject it),
    /// and the first image or file that cannot be sent fails the translation.
    pub(crate) fn blocks(&self, content: Option<&Content>, i: usize) -> Result<Vec<B>, ErrorInfo> {
        match content {
            None => Ok(Vec::new()),
            Some(Content::Text(t)) if t.is_empty() => Ok(Vec::new()),
            Some(Content::Text(t)) => Ok(vec![(self.text)(t)]),
            Some(Content::Parts(parts)) => {
                let mut out = Vec::with_capacity(parts.len());
                for part in parts {
                    match part {
                        ContentPart::Text { text } if text.is_empty() => {}
                        ContentPart::Text { text } => out.push((self.text)(text)),
                        ContentPart::ImageUrl { image_url } => {
                            out.push((self.image)(&image_url.url, i)?)
                        }
                        ContentPart::File { file } => out.push((self.file)(file, i)?),
                    }
                }
                Ok(out)
            }
        }
    }
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

/// Keywords whose value is a map of name → sub-schema (JSON Schema 2020-12 "Core" and
/// "Validation"); their keys are names, not keywords.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Keywords whose value is one sub-schema or an array of sub-schemas.
const SCHEMA_CHILDREN: &[&str] = &[
    "items",
    "prefixItems",
    "additionalProperties",
    "unevaluatedProperties",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
];

/// Applies `f` to `schema` and then to every sub-schema below it (depth first), so a
/// provider's keyword translation sees each schema object once and never mistakes a property
/// *name* (a key of `properties`) for a keyword.
pub(crate) fn walk_schema(
    schema: &mut Value,
    f: &mut dyn FnMut(&mut serde_json::Map<String, Value>),
) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    f(obj);
    for (k, v) in obj.iter_mut() {
        if SCHEMA_MAPS.contains(&k.as_str()) {
            if let Some(map) = v.as_object_mut() {
                for sub in map.values_mut() {
                    walk_schema(sub, f);
                }
            }
        } else if SCHEMA_CHILDREN.contains(&k.as_str()) {
            match v {
                Value::Array(items) => items.iter_mut().for_each(|s| walk_schema(s, f)),
                other => walk_schema(other, f),
            }
        }
    }
}

/// Deepest `$ref` chain [`inline_refs`] follows; a recursive schema is cut there.
const MAX_REF_DEPTH: usize = 8;

/// Replaces every local `$ref` (`#/$defs/X` or `#/definitions/X`) by a copy of the referenced
/// schema (its sibling keywords kept, the copy winning), up to [`MAX_REF_DEPTH`] levels; a
/// deeper or unresolvable reference becomes `{}` (any value). The `$defs`/`definitions` stay;
/// the caller strips them.
pub(crate) fn inline_refs(schema: &mut Value) {
    let mut defs = serde_json::Map::new();
    for key in ["definitions", "$defs"] {
        if let Some(map) = schema.get(key).and_then(Value::as_object) {
            defs.extend(map.iter().map(|(k, v)| (format!("#/{key}/{k}"), v.clone())));
        }
    }
    inline_at(schema, &defs, 0);
}

fn inline_at(schema: &mut Value, defs: &serde_json::Map<String, Value>, depth: usize) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::String(r)) = obj.remove("$ref") {
        let target = defs.get(&r).filter(|_| depth < MAX_REF_DEPTH);
        if let Some(Value::Object(t)) = target {
            for (k, v) in t {
                obj.insert(k.clone(), v.clone());
            }
            return inline_at(schema, defs, depth + 1);
        }
    }
    for (k, v) in obj.iter_mut() {
        if k == "$defs" || k == "definitions" {
            continue;
        }
        if SCHEMA_MAPS.contains(&k.as_str()) {
            if let Some(map) = v.as_object_mut() {
                map.values_mut().for_each(|s| inline_at(s, defs, depth));
            }
        } else if SCHEMA_CHILDREN.contains(&k.as_str()) {
            match v {
                Value::Array(items) => items.iter_mut().for_each(|s| inline_at(s, defs, depth)),
                other => inline_at(other, defs, depth),
            }
        }
    }
}
