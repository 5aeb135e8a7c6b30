//! The Anthropic Messages tool types the request encoder and structured output both build
//! (Anthropic API docs, "Messages" → `tools`, `tool_choice`): a leaf under both.

use serde::Serialize;
use serde_json::Value;

/// A tool declaration ("Messages" → `tools[]`, a client tool: `name`, `description`?,
/// `input_schema`, a JSON Schema passed as given).
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
pub(crate) struct Tool {
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    pub(crate) input_schema: Value,
}

/// `tool_choice` ("Messages" → `tool_choice`), by its `type`; `disable_parallel_tool_use` is
/// sent only when `true` (never on `none`, which has no such field).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ToolChoice {
    /// The model decides.
    Auto {
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        disable_parallel_tool_use: bool,
    },
    /// The model must call one of the tools.
    Any {
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        disable_parallel_tool_use: bool,
    },
    /// The model must call the tool `name`.
    Tool {
        name: String,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        disable_parallel_tool_use: bool,
    },
    /// The model must not call tools.
    None,
}
