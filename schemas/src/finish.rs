//! Why generation stopped: the one vocabulary of frames, usage events and cached answers.

use serde::{Deserialize, Serialize};

/// Why generation stopped, in OpenAI's `finish_reason` vocabulary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// Natural end or a stop sequence.
    #[default]
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The model called tools.
    ToolCalls,
    /// Output withheld by a content filter.
    ContentFilter,
}

impl FinishReason {
    /// The OpenAI wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::ContentFilter => "content_filter",
        }
    }
}
