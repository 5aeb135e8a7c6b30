//! Request-building helpers every adapter with its own wire format uses (Anthropic, Gemini,
//! Bedrock): one wording for invalid requests and one reading of tool-call arguments.

use serde_json::{Value, json};
use switchyard_schemas::request::ToolCall;
use switchyard_schemas::{ErrorClass, ErrorInfo};

/// Name of the synthetic tool that carries a `response_format` JSON answer on providers that
/// get it as a tool call (Anthropic always, Gemini alongside user tools); LiteLLM's name for it.
pub const JSON_TOOL: &str = "json_tool_call";

/// The system instruction added when user tools compete with [`JSON_TOOL`].
pub const JSON_INSTRUCTION: &str = "When you answer without calling one of the other tools, \
     give your final answer by calling the `json_tool_call` tool with it; do not answer in plain \
     text.";

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
