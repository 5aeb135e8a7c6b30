//! Prompt token estimates and context-window trimming.
//!
//! **Estimates** come from the process-wide estimator [`switchyard_schemas::tokens`] (o200k_base,
//! loaded once, shared with budgets and the workers' TPM limits): each message adds
//! [`PER_MESSAGE`] tokens of framing, each image [`PER_IMAGE`], the reply priming
//! [`REPLY_PRIMING`], and declared tools the tokens of their JSON. Encoding costs CPU, so routing
//! first checks the byte [`upper_bound`] (a BPE token is at least one byte): a prompt whose bytes
//! fit every window is never tokenized.
//!
//! **Trimming** (policy `trim_context`): when the estimate exceeds the target's `context_window`
//! minus `max_tokens`, [`trim`] drops the oldest turns. System and developer messages are always
//! kept, wherever they are; an assistant message with `tool_calls` and the tool results that
//! follow it are one unit, dropped together; the latest unit is never dropped; and the kept
//! conversation starts at a user message (several providers reject one that starts otherwise).

use switchyard_schemas::request::{Message, Role, Tool};
use switchyard_schemas::tokens;

pub use switchyard_schemas::tokens::{PER_IMAGE, PER_MESSAGE, REPLY_PRIMING, count, upper_bound};

/// Loads the tokenizer now (it takes a moment), so the first long request does not pay for it.
/// Blocking. The tokenizer is the process-wide one of [`switchyard_schemas::tokens`].
pub fn warm_up() {
    tokens::warm_up();
}

/// The estimated tokens of a prompt, per message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// Tokens of each message, in order.
    pub per_message: Vec<u64>,
    /// Tokens outside the messages: tool declarations and the reply priming.
    pub fixed: u64,
}

impl From<tokens::Estimate> for Estimate {
    fn from(e: tokens::Estimate) -> Self {
        Self {
            per_message: e.per_message,
            fixed: e.fixed,
        }
    }
}

impl Estimate {
    /// Tokenizes the prompt (blocking; [`Self::of_async`] on the request path).
    pub fn of(messages: &[Message], tools: &[Tool]) -> Self {
        tokens::estimate_blocking(messages, tools).into()
    }

    /// [`Self::of`] off the async executor for large prompts ([`tokens::estimate`]).
    pub async fn of_async(messages: &[Message], tools: &[Tool]) -> Self {
        tokens::estimate(messages, tools).await.into()
    }

    /// The whole prompt.
    pub fn total(&self) -> u64 {
        self.fixed + self.per_message.iter().sum::<u64>()
    }

    /// What trimming can never drop: system/developer messages and the latest unit.
    pub fn floor(&self, messages: &[Message]) -> u64 {
        let pinned: u64 = messages
            .iter()
            .zip(&self.per_message)
            .filter(|(m, _)| is_pinned(m))
            .map(|(_, n)| n)
            .sum();
        let last: u64 = units(messages)
            .last()
            .map(|u| u.iter().map(|&i| self.per_message[i]).sum())
            .unwrap_or(0);
        self.fixed + pinned + last
    }
}

fn is_pinned(m: &Message) -> bool {
    matches!(m.role, Role::System | Role::Developer)
}

/// The droppable units, oldest first: each a list of message indices. An assistant message with
/// tool calls takes the tool messages right after it.
fn units(messages: &[Message]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut open_tool_group = false;
    for (i, m) in messages.iter().enumerate() {
        if is_pinned(m) {
            open_tool_group = false;
            continue;
        }
        if m.role == Role::Tool
            && open_tool_group
            && let Some(last) = out.last_mut()
        {
            last.push(i);
            continue;
        }
        open_tool_group = m.role == Role::Assistant && !m.tool_calls.is_empty();
        out.push(vec![i]);
    }
    out
}

/// A trimmed conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Trimmed {
    /// The messages kept, in their original order.
    pub messages: Vec<Message>,
    /// How many were dropped.
    pub dropped: usize,
    /// The estimate of what is kept.
    pub tokens: u64,
}

/// Drops the oldest units until the estimate is at most `budget` tokens (see the module docs).
/// `None` when nothing needs to or can be dropped.
pub fn trim(messages: &[Message], est: &Estimate, budget: u64) -> Option<Trimmed> {
    let mut total = est.total();
    if total <= budget {
        return None;
    }
    let units = units(messages);
    let cost = |u: &Vec<usize>| u.iter().map(|&i| est.per_message[i]).sum::<u64>();
    let mut cut = 0;
    while total > budget && cut + 1 < units.len() {
        total -= cost(&units[cut]);
        cut += 1;
    }
    // Start the kept conversation at a user message.
    while cut > 0 && cut + 1 < units.len() && messages[units[cut][0]].role != Role::User {
        total -= cost(&units[cut]);
        cut += 1;
    }
    if cut == 0 {
        return None;
    }
    let mut keep = vec![true; messages.len()];
    let mut dropped = 0;
    for u in &units[..cut] {
        for &i in u {
            keep[i] = false;
            dropped += 1;
        }
    }
    let kept = messages
        .iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(m, _)| m.clone())
        .collect();
    Some(Trimmed {
        messages: kept,
        dropped,
        tokens: total,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn conversation() -> Vec<Message> {
        serde_json::from_value(json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "u2"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},
            {"role": "developer", "content": "d"},
            {"role": "assistant", "content": "a2"},
            {"role": "user", "content": "u3"}
        ]))
        .unwrap()
    }

    fn texts(ms: &[Message]) -> Vec<String> {
        ms.iter()
            .map(|m| match &m.content {
                Some(c) => c.text(),
                None => "<calls>".into(),
            })
            .collect()
    }

    /// Every message 10 tokens, fixed 3.
    fn flat(n: usize) -> Estimate {
        Estimate {
            per_message: vec![10; n],
            fixed: 3,
        }
    }

    #[test]
    fn tokens_are_counted_with_o200k() {
        assert_eq!(count("Hello world"), 2);
        assert_eq!(count(""), 0);
        let ms = conversation();
        let est = Estimate::of(&ms, &[]);
        assert_eq!(est.per_message[1], PER_MESSAGE + count("u1"));
        assert!(est.total() <= upper_bound(&ms, &[]));
        let image: Vec<Message> = serde_json::from_value(json!([{"role": "user", "content": [
            {"type": "text", "text": "Hello world"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]))
        .unwrap();
        assert_eq!(
            Estimate::of(&image, &[]).total(),
            REPLY_PRIMING + PER_MESSAGE + 2 + PER_IMAGE
        );
    }

    #[test]
    fn units_keep_tool_calls_with_their_results() {
        assert_eq!(
            units(&conversation()),
            vec![vec![1], vec![2], vec![3], vec![4, 5], vec![7], vec![8]]
        );
    }

    #[test]
    fn drops_the_oldest_turns_and_keeps_system_prompts() {
        let ms = conversation();
        let est = flat(ms.len());
        assert_eq!(est.total(), 93);
        assert_eq!(est.floor(&ms), 3 + 20 + 10);
        assert_eq!(trim(&ms, &est, 93), None);
        // 92: one unit (u1) must go; a1 then leads, so it goes too (start at a user turn).
        let t = trim(&ms, &est, 92).unwrap();
        assert_eq!(t.dropped, 2);
        assert_eq!(
            texts(&t.messages),
            ["s", "u2", "<calls>", "r1", "d", "a2", "u3"]
        );
        assert_eq!(t.tokens, 73);
        // 60: u1, a1, u2 and the tool-call unit (two messages) go, then a2 (not a user turn).
        let t = trim(&ms, &est, 60).unwrap();
        assert_eq!(texts(&t.messages), ["s", "d", "u3"]);
        assert_eq!((t.dropped, t.tokens), (6, 33));
        // Below the floor: the latest unit stays all the same.
        let t = trim(&ms, &est, 10).unwrap();
        assert_eq!(texts(&t.messages), ["s", "d", "u3"]);
    }

    #[test]
    fn a_tool_call_is_never_split_from_its_result() {
        let ms = conversation();
        let est = flat(ms.len());
        // After u1, a1 and u2 the tool-call unit leads: it goes whole, its result with it.
        let t = trim(&ms, &est, 72).unwrap();
        assert!(!t.messages.iter().any(|m| m.role == Role::Tool));
        assert!(!t.messages.iter().any(|m| !m.tool_calls.is_empty()));
    }
}
