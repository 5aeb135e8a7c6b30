//! Embeddings: the normalised request and its single reply (NATS request/reply, no stream).
//!
//! Reference: OpenAI API reference, "Create embeddings" (`input` is a string, an array of strings,
//! an array of token ids, or an array of token-id arrays).

use crate::error::ErrorInfo;
use crate::request::TargetRef;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What to embed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbedInput {
    /// One or more texts.
    Texts(Vec<String>),
    /// One or more pre-tokenised inputs (token ids of the target model's tokenizer).
    Tokens(Vec<Vec<u32>>),
}

impl EmbedInput {
    /// Number of inputs.
    pub fn len(&self) -> usize {
        match self {
            Self::Texts(t) => t.len(),
            Self::Tokens(t) => t.len(),
        }
    }

    /// True when there is nothing to embed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One embeddings request after validation and routing.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedRequest {
    /// Request id (UUIDv7).
    pub id: Uuid,
    /// Tenant, when auth is on.
    pub tenant: Option<String>,
    /// Calling key id, when auth is on.
    pub key_id: Option<String>,
    /// Standard model id the client asked for.
    pub model: String,
    /// The chosen target.
    pub target: TargetRef,
    /// Inputs.
    pub input: EmbedInput,
    /// Output dimensions, for models that can shorten their vectors.
    pub dimensions: Option<u32>,
    /// End-user id.
    pub user: Option<String>,
    /// Absolute deadline, ms since the Unix epoch.
    pub deadline_ms: u64,
    /// Zero-based attempt number across fallbacks.
    #[serde(default)]
    pub attempt: u32,
    /// The batch job this request is an item of (`None` for live traffic; priced at the batch rate).
    pub batch_id: Option<String>,
}

/// The worker's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EmbedReply {
    /// One vector per input, in input order.
    Ok {
        /// The vectors.
        vectors: Vec<Vec<f32>>,
        /// Token usage (`prompt_tokens` only).
        usage: Usage,
        /// Worker that served.
        worker: String,
    },
    /// The call failed.
    Error {
        /// What happened.
        error: ErrorInfo,
    },
}
