//! The one prompt token estimator of a process (feature `tokens`): tiktoken's `o200k_base`
//! (GPT-4o's encoding) for every provider, counted by our own count-only encoder ([`o200k`],
//! about 4 MB, tested equal to tiktoken-rs) loaded lazily once per process, shared by context
//! trimming (ingress), budgets (ingress) and TPM limits (workers).
//!
//! A prompt costs the tokens of its texts, [`PER_MESSAGE`] of framing per message (and per tool
//! call), [`PER_IMAGE`] per image, [`REPLY_PRIMING`] for the reply and the tokens of the declared
//! tools' JSON. `PER_MESSAGE` is 3, OpenAI's documented count for its current chat models
//! (`trim` used 4 before, limits 3; one value now). Exact for OpenAI models, close enough
//! elsewhere to decide whether a prompt fits a window or a budget.
//!
//! Tokenizing costs CPU (roughly 1 ms per 10 KB in release builds): on the request path call
//! [`estimate`] (async: runs large prompts, and the first one, which loads the tokenizer, on the
//! blocking pool) rather than [`estimate_blocking`].

mod o200k;

use crate::request::{Content, ContentPart, Message, Tool};
use o200k::Counter;
use std::sync::OnceLock;

/// Framing tokens per message (role and separators), also per tool call.
pub const PER_MESSAGE: u64 = 3;
/// Tokens priming the reply.
pub const REPLY_PRIMING: u64 = 3;
/// Tokens counted per image (a low-detail image on OpenAI).
pub const PER_IMAGE: u64 = 85;

/// The estimate of an inline document (`file_data`, a base64 `data:` URL): one token per four
/// bytes of the decoded file (3/16 of the base64 length), at least [`PER_IMAGE`]. A rough bound
/// for budgets and TPM only: providers count PDF pages as text plus images.
/// A document given by URL (empty `file_data`) counts as [`PER_IMAGE`]: its size is unknown.
pub fn file_cost(file_data: &str) -> u64 {
    let bytes = (file_data.len() as u64).saturating_mul(3) / 4;
    (bytes / 4).max(PER_IMAGE)
}
/// Output tokens a TPM limit charges at admission when the request sets no `max_tokens` (the
/// target limits of the workers and the key/tenant limits of ingress alike).
pub const DEFAULT_MAX_TOKENS: u64 = 256;
/// Prompts with more text than this are tokenized on the blocking pool by [`estimate`], bytes.
pub const BLOCKING_BYTES: usize = 16 * 1024;

static BPE: OnceLock<Option<Counter>> = OnceLock::new();

fn bpe() -> Option<&'static Counter> {
    BPE.get_or_init(|| match Counter::load() {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::error!(error = %e, "o200k tokenizer unavailable; estimating 4 bytes per token");
            None
        }
    })
    .as_ref()
}

/// Loads the tokenizer now if it is not loaded (blocking; call it on the blocking pool), so the
/// first long request does not pay for it.
pub fn warm_up() {
    let _ = bpe();
}

/// Whether the tokenizer has been loaded (or failed to load) already.
pub fn is_loaded() -> bool {
    BPE.get().is_some()
}

/// Tokens of `text` under o200k_base (4 bytes per token if the tokenizer cannot load).
/// Blocking: CPU proportional to the text, and the tokenizer load on first use.
pub fn count(text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    match bpe() {
        Some(b) => b.count(text),
        None => text.len().div_ceil(4) as u64,
    }
}

/// Sums `text_cost` over the message's texts plus its fixed costs, tokens.
pub fn message_cost(m: &Message, text_cost: &dyn Fn(&str) -> u64) -> u64 {
    let mut n = PER_MESSAGE;
    match &m.content {
        Some(Content::Text(t)) => n += text_cost(t),
        Some(Content::Parts(parts)) => {
            for p in parts {
                n += match p {
                    ContentPart::Text { text } => text_cost(text),
                    ContentPart::ImageUrl { .. } => PER_IMAGE,
                    ContentPart::File { file } => file_cost(&file.file_data),
                };
            }
        }
        None => {}
    }
    if let Some(name) = &m.name {
        n += text_cost(name) + 1;
    }
    for call in &m.tool_calls {
        n += PER_MESSAGE
            + text_cost(&call.id)
            + text_cost(&call.function.name)
            + text_cost(&call.function.arguments);
    }
    if let Some(id) = &m.tool_call_id {
        n += text_cost(id);
    }
    n
}

/// The declared tools as the JSON their tokens are counted of (empty without tools). Should
/// encoding fail, their `Debug` form (longer than the JSON) is counted: an over-estimate, never
/// the zero an empty string would make of them.
pub fn tools_json(tools: &[Tool]) -> String {
    if tools.is_empty() {
        return String::new();
    }
    serde_json::to_string(tools).unwrap_or_else(|e| {
        tracing::error!(error = %e, "tools not encodable: counting their Debug form");
        format!("{tools:?}")
    })
}

/// An upper bound of the prompt's tokens from its byte length, without tokenizing (a BPE token
/// is at least one byte). Cheap.
pub fn upper_bound(messages: &[Message], tools: &[Tool]) -> u64 {
    let bytes = |t: &str| t.len() as u64;
    REPLY_PRIMING
        + tools_json(tools).len() as u64
        + messages
            .iter()
            .map(|m| message_cost(m, &bytes))
            .sum::<u64>()
}

/// The estimated tokens of a prompt, per message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// Tokens of each message, in order.
    pub per_message: Vec<u64>,
    /// Tokens outside the messages: tool declarations and the reply priming.
    pub fixed: u64,
}

impl Estimate {
    /// The whole prompt, tokens.
    pub fn total(&self) -> u64 {
        self.fixed + self.per_message.iter().sum::<u64>()
    }
}

/// Tokenizes the prompt. Blocking (see [`count`]); on an async executor use [`estimate`].
pub fn estimate_blocking(messages: &[Message], tools: &[Tool]) -> Estimate {
    Estimate {
        per_message: messages.iter().map(|m| message_cost(m, &count)).collect(),
        fixed: REPLY_PRIMING + count(&tools_json(tools)),
    }
}

/// [`estimate_blocking`] without blocking the async executor: a prompt over [`BLOCKING_BYTES`]
/// of text, or any prompt before the tokenizer is loaded, is tokenized on the blocking pool
/// (on a copy of the messages; copying is far cheaper than tokenizing); a small one inline.
/// Must run inside a tokio runtime.
pub async fn estimate(messages: &[Message], tools: &[Tool]) -> Estimate {
    let bytes = |t: &str| t.len() as u64;
    let text: u64 = messages
        .iter()
        .map(|m| message_cost(m, &bytes))
        .sum::<u64>();
    if is_loaded() && text <= BLOCKING_BYTES as u64 && tools.is_empty() {
        return estimate_blocking(messages, tools);
    }
    let (m, t) = (messages.to_vec(), tools.to_vec());
    match tokio::task::spawn_blocking(move || estimate_blocking(&m, &t)).await {
        Ok(e) => e,
        // The blocking task was cancelled (runtime shutting down): the byte bound, never less.
        Err(_) => Estimate {
            per_message: messages.iter().map(|m| message_cost(m, &bytes)).collect(),
            fixed: REPLY_PRIMING + tools_json(tools).len() as u64,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn user(text: &str) -> Message {
        serde_json::from_value(serde_json::json!({"role": "user", "content": text})).unwrap()
    }

    #[test]
    fn counts_with_o200k() {
        assert_eq!(count("Hello world"), 2);
        assert_eq!(count(""), 0);
        let e = estimate_blocking(&[user("Hello world")], &[]);
        assert_eq!(e.total(), 2 + PER_MESSAGE + REPLY_PRIMING);
        assert!(e.total() <= upper_bound(&[user("Hello world")], &[]));
    }

    #[tokio::test]
    async fn async_estimate_equals_the_blocking_one() {
        let big = "lorem ipsum dolor sit amet ".repeat(2_000);
        for ms in [vec![user("Hello world")], vec![user("hi"), user(&big)]] {
            assert_eq!(estimate(&ms, &[]).await, estimate_blocking(&ms, &[]));
        }
    }
}
