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
//! (`tests::typed_and_value_paths_agree`). Every object is read as an object only ([`Obj`]:
//! serde derive would also take an array, by position). On malformed JSON the typed path is
//! more lenient in one way: values of fields it skips are not validated (a lone surrogate, a
//! number out of range); no upstream sends these.

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
    pub(super) choices: Option<Vec<Obj<Choice<'a>>>>,
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
    pub(super) delta: Option<Obj<Delta<'a>>>,
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
    pub(super) tool_calls: Option<Vec<Obj<ToolCall<'a>>>>,
}

/// A piece of a tool call.
#[derive(Deserialize)]
pub(super) struct ToolCall<'a> {
    #[serde(default)]
    pub(super) index: Option<u64>,
    #[serde(borrow, default)]
    pub(super) id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) function: Option<Obj<Function<'a>>>,
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
    let chunk = serde_json::from_str::<Obj<Chunk<'_>>>(data).ok()?.0;
    let error = marks_error(chunk.error, &chunk.object, &chunk.kind);
    let plain = chunk.choices.iter().flatten().all(|c| c.logprobs.is_none());
    (!error && plain).then_some(chunk)
}

/// Whether a typed body carries an error marker: an `error` key (any value), or an `object` or
/// `type` of `"error"`. A superset of what the `Value` paths classify as an error body, so such
/// a body always goes to them.
pub(super) fn marks_error(
    error: Option<()>,
    object: &Option<Cow<'_, str>>,
    kind: &Option<Cow<'_, str>>,
) -> bool {
    error.is_some()
        || [object, kind]
            .into_iter()
            .any(|k| k.as_deref() == Some("error"))
}

/// `Some(())` whenever the field is present, whatever its value (`null` included; a plain
/// `Option` reads `null` as absent).
pub(super) fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<()>, D::Error> {
    IgnoredAny::deserialize(d).map(|_| Some(()))
}

/// A struct read from a JSON object only. serde derive also reads a struct from an array, field
/// by field in order (`[0,null,"x"]`), which the `Value` path never does; this wrapper asks the
/// deserializer for a map, so an array is an error and the `Value` path decides.
pub(super) struct Obj<T>(pub(super) T);

impl<T> std::ops::Deref for Obj<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(MapOnly(d)).map(Obj)
    }
}

/// A deserializer that reads a struct as a map (`deserialize_map`, which takes `{` only).
struct MapOnly<D>(D);

impl<'de, D: serde::Deserializer<'de>> serde::Deserializer<'de> for MapOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(v)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(v)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}
