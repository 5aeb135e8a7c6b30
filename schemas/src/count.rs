//! Token counting (`POST /v1/messages/count_tokens`): ingress sends the normalised
//! [`ChatRequest`](crate::ChatRequest) as a NATS request on `<prefix>.req.count.<provider>` to a
//! provider whose API counts exactly ([`ProviderKind::counts_tokens`]); the worker answers one
//! [`CountReply`]. No frames, no usage event, no spend.
//!
//! [`ProviderKind::counts_tokens`]: crate::config::ProviderKind::counts_tokens

use crate::error::ErrorInfo;
use serde::{Deserialize, Serialize};

/// The worker's answer to a count request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CountReply {
    /// The upstream's exact count.
    Ok {
        /// Input tokens of the request (system, messages, tools), as the provider counts them.
        input_tokens: u64,
        /// Worker that served.
        worker: String,
    },
    /// The call failed.
    Error {
        /// What happened.
        error: ErrorInfo,
    },
}
