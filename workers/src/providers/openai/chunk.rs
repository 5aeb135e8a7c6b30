//! The common shape of a Chat Completions stream chunk (OpenAI API reference, "The chat
//! completion chunk object"), read into typed structs instead of a `serde_json::Value`. A
//! `Value` costs an `IndexMap` with SipHash per object, because the workspace's `serde_json`
//! keeps key order; on a chunk of a few hundred bytes that was most of the translator's time.
//!
//! [`parse`] returns `None` for anything else: a chunk with an `error` key or an `object` or
//! `type` of `"error"` (an error object inside the stream, FC-07; read after JSON unescaping, so
//! an escaped key is caught too), `logprobs`, a field of an unexpected type, a duplicate key.
//! The translator then reads the chunk as a `Value`, as before. So on every well-formed chunk the
//! typed path only handles what the `Value` path reads the same way
//! (`tests::typed_and_value_paths_agree`); on malformed ones it is more lenient, like serde
//! derive (an array where an object belongs is read by position; skipped values are not
//! validated).

use serde::Deserialize;
use serde::de::IgnoredAny;
use std::borrow::Cow;

/// A chunk: its choices, and the usage of the final `choices: []` chunk.
#[derive(Deserialize)]
pub(super) struct Chunk<'a> {
    /// Present (any value, `null` included): the `Value` path decides.
    #[serde(default, deserialize_with = "present")]
    error: Option<()>,
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    pub(super) usage: Option<serde_json::Value>,
    #[serde(borrow, default)]
    pub(super) service_tier: Option<Cow<'a, str>>,
}

/// One choice's delta and finish reason.
#[derive(Deserialize)]
pub(super) struct Choice<'a> {
    #[serde(default)]
    pub(super) index: Option<u64>,
    /// Only checked for absence (`null` counts as absent): log probabilities take the `Value`
    /// path.
    #[serde(default)]
    logprobs: Option<IgnoredAny>,
    #[serde(borrow, default)]
    pub(super) delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    pub(super) finish_reason: Option<Cow<'a, str>>,
}

/// The pieces of text a delta carries.
#[derive(Deserialize)]
pub(super) struct Delta<'a> {
    #[serde(borrow, default)]
    pub(super) reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) tool_calls: Option<Vec<ToolCall<'a>>>,
}

/// A piece of a tool call.
#[derive(Deserialize)]
pub(super) struct ToolCall<'a> {
    #[serde(default)]
    pub(super) index: Option<u64>,
    #[serde(borrow, default)]
    pub(super) id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) function: Option<Function<'a>>,
}

/// A tool call's name and a piece of its arguments.
#[derive(Deserialize)]
pub(super) struct Function<'a> {
    #[serde(borrow, default)]
    pub(super) name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) arguments: Option<Cow<'a, str>>,
}

/// `data` as a plain chunk, or `None` when the `Value` path must read it (see the module docs).
pub(super) fn parse(data: &str) -> Option<Chunk<'_>> {
    let chunk: Chunk<'_> = serde_json::from_str(data).ok()?;
    let named_error = [&chunk.object, &chunk.kind]
        .into_iter()
        .any(|k| k.as_deref() == Some("error"));
    let plain = chunk.choices.iter().flatten().all(|c| c.logprobs.is_none());
    (chunk.error.is_none() && !named_error && plain).then_some(chunk)
}

/// `Some(())` whenever the field is present, whatever its value (`null` included; a plain
/// `Option` reads `null` as absent).
pub(super) fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<()>, D::Error> {
    IgnoredAny::deserialize(d).map(|_| Some(()))
}
