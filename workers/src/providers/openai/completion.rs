//! The common shape of a `chat.completion` object (OpenAI API reference, "The chat completion
//! object"), read into typed structs instead of a `serde_json::Value`, as [`super::chunk`] does
//! for stream chunks: each `Value` object costs an `IndexMap` with SipHash, most of a
//! non-streamed answer's read.
//!
//! [`parse`] returns `None` for anything else: a body with an `error` key, or an `object` or
//! `type` of `"error"` (an error object, FC-07; read after JSON unescaping, so an escaped key
//! is caught too), `logprobs`, content given as parts, arguments that are not a string, a field
//! of an unexpected type, a duplicate key, no choices. [`super::parse_completion`] then reads
//! the body as a `Value`, as before, so on every well-formed body the typed path only handles
//! what the `Value` path reads the same way (`tests::typed_and_value_completions_agree`).
//! Every object is read as an object only ([`Obj`]). On malformed JSON the typed path is more
//! lenient in one way: values of fields it skips are not validated (a lone surrogate, a number
//! out of range); no upstream sends these.

use super::chunk::{Obj, ToolCall, marks_error, present};
use super::{map_finish, with_tier};
use crate::provider::Answer;
use serde::Deserialize;
use serde::de::IgnoredAny;
use std::borrow::Cow;
use switchyard_schemas::request::ThinkingBlock;
use switchyard_schemas::{FinishReason, Usage};

#[derive(Deserialize)]
struct Completion<'a> {
    /// Present (any value, `null` included): the `Value` path decides.
    #[serde(default, deserialize_with = "present")]
    error: Option<()>,
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    choices: Vec<Obj<Choice<'a>>>,
    #[serde(default)]
    usage: Option<Obj<UsageIn>>,
    #[serde(borrow, default)]
    service_tier: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: Option<u64>,
    /// Only checked for absence (`null` counts as absent): log probabilities take the `Value`
    /// path.
    #[serde(default)]
    logprobs: Option<IgnoredAny>,
    #[serde(borrow, default)]
    message: Option<Obj<Message<'a>>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    /// The stream's tool-call shape; a non-streamed call has no `index` (its position is its
    /// index), so one given is ignored, as the `Value` path does.
    #[serde(borrow, default)]
    tool_calls: Option<Vec<Obj<ToolCall<'a>>>>,
}

/// OpenAI's `usage` object, the fields [`super::parse_usage`] reads.
#[derive(Deserialize)]
struct UsageIn {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<Obj<Details>>,
    #[serde(default)]
    completion_tokens_details: Option<Obj<Details>>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    audio_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// `body` as a plain `chat.completion`, or `None` when the `Value` path must read it (see the
/// module docs).
pub(super) fn parse(body: &[u8]) -> Option<Answer> {
    let c = serde_json::from_slice::<Obj<Completion<'_>>>(body).ok()?.0;
    if marks_error(c.error, &c.object, &c.kind) || c.choices.iter().any(|c| c.logprobs.is_some()) {
        return None;
    }
    let mut choices = c.choices;
    choices.sort_by_key(|c| c.index.unwrap_or(0));
    let mut answers = choices.into_iter().map(|c| answer(c.0));
    let mut first = answers.next()?;
    first.more_choices = answers.collect();
    first.usage = c
        .usage
        .map(|u| with_tier(usage(&u), c.service_tier.as_deref()));
    Some(first)
}

fn answer(choice: Choice<'_>) -> Answer {
    let message = choice.message.map(|m| m.0).unwrap_or(Message {
        content: None,
        reasoning_content: None,
        tool_calls: None,
    });
    let owned = |s: Option<Cow<'_, str>>| s.map(Cow::into_owned);
    let tool_calls = message
        .tool_calls
        .into_iter()
        .flatten()
        .map(|c| {
            let c = c.0;
            let (name, arguments) = c
                .function
                .map_or((None, None), |f| (f.0.name, f.0.arguments));
            (
                owned(c.id),
                owned(name),
                owned(arguments).unwrap_or_default(),
            )
        })
        .collect();
    let thinking = message
        .reasoning_content
        .filter(|t| !t.is_empty())
        .map(|t| ThinkingBlock::Thinking {
            thinking: t.into_owned(),
            signature: None,
        })
        .into_iter()
        .collect();
    Answer {
        text: owned(message.content).unwrap_or_default(),
        tool_calls,
        usage: None,
        finish_reason: choice
            .finish_reason
            .as_deref()
            .map_or(FinishReason::Stop, map_finish),
        thinking,
        logprobs: Vec::new(),
        more_choices: Vec::new(),
    }
}

fn usage(u: &UsageIn) -> Usage {
    let detail = |d: &Option<Obj<Details>>, f: fn(&Details) -> Option<u64>| {
        d.as_deref().and_then(f).unwrap_or(0)
    };
    Usage {
        prompt_tokens: u.prompt_tokens.unwrap_or(0),
        cached_tokens: detail(&u.prompt_tokens_details, |d| d.cached_tokens),
        cache_write_tokens: 0,
        completion_tokens: u.completion_tokens.unwrap_or(0),
        reasoning_tokens: detail(&u.completion_tokens_details, |d| d.reasoning_tokens),
        audio_input_tokens: detail(&u.prompt_tokens_details, |d| d.audio_tokens),
        audio_output_tokens: detail(&u.completion_tokens_details, |d| d.audio_tokens),
        ..Usage::default()
    }
}
