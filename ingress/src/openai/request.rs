//! Parses and validates an OpenAI `POST /v1/chat/completions` body into the normalised request.
//!
//! Reference: OpenAI API reference, "Create chat completion". Lenient where the API is: every
//! parameter the API accepts is accepted, and a `null` value of any optional field means absent.
//! What each one does here:
//! - translated: `messages` (also replayed `model_dump()` history: `tool_calls: null`, tool calls
//!   without `type`, `refusal`/`audio`/`annotations` ignored), `tools`, `tool_choice`,
//!   `temperature`, `top_p`, `max_tokens`/`max_completion_tokens`, `stop`, `n` (1–128; more
//!   than 1 only on targets that answer several choices natively, see docs/routing.md), `seed`,
//!   penalties, `response_format`, `parallel_tool_calls`, `user`, `stream`,
//!   `stream_options.include_usage`, `reasoning_effort`, `logprobs`, `top_logprobs` (see
//!   the OpenAI adapter's `build_object` for which providers get them);
//! - the legacy `functions` / `function_call` become `tools` / `tool_choice`, an assistant
//!   message's `function_call` a tool call (id `call_fn_<message index>`) and a `role: "function"`
//!   message that call's `tool` result; the answer uses the current `tool_calls` shape;
//! - passed unchanged to an OpenAI upstream only ([`Passthrough::OPENAI`]): `service_tier`,
//!   `prediction`, `logit_bias`, `verbosity`, `prompt_cache_key`, `safety_identifier`;
//! - accepted and not forwarded: `store` (Switchyard does not store completions with the
//!   provider), `metadata` (only meaningful with `store`), `modalities: ["text"]`,
//!   `stream_options.include_obfuscation` (Switchyard adds no obfuscation padding);
//! - a 400 saying it is not supported: `audio`, `modalities` with `audio`,
//!   `web_search_options`; any other unknown field is OpenAI's own 400 "Unrecognized request
//!   argument supplied".

use crate::error::ApiError;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use switchyard_schemas::request::{Message, Passthrough, SamplingParams, Tool};

/// The parts of a Chat Completions body Switchyard understands.
#[derive(Debug, Deserialize)]
pub struct ChatCompletionBody {
    /// Standard model id or route tag.
    pub model: String,
    /// The conversation.
    pub messages: Vec<Message>,
    tools: Option<Vec<Tool>>,
    tool_choice: Option<Value>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    stop: Option<Stop>,
    n: Option<u32>,
    seed: Option<i64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    response_format: Option<Value>,
    parallel_tool_calls: Option<bool>,
    user: Option<String>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    reasoning_effort: Option<String>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    modalities: Option<Vec<String>>,
    functions: Option<Vec<switchyard_schemas::request::FunctionDef>>,
    function_call: Option<Value>,
    /// Accepted, not forwarded (see the module docs).
    #[serde(default, rename = "store")]
    _store: Option<bool>,
    /// Accepted, not forwarded (see the module docs).
    #[serde(default, rename = "metadata")]
    _metadata: Option<Map<String, Value>>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
    /// Accepted; Switchyard's chunks carry no obfuscation padding.
    #[serde(default, rename = "include_obfuscation")]
    _include_obfuscation: Option<bool>,
}

/// Parameters OpenAI defines that Switchyard cannot serve: a clear 400, not a silent drop.
const UNSUPPORTED: &[&str] = &["audio", "web_search_options"];

/// Parameters passed unchanged to an OpenAI upstream (and dropped for other providers).
const OPENAI_PASSTHROUGH: &[&str] = &[
    "service_tier",
    "prediction",
    "logit_bias",
    "verbosity",
    "prompt_cache_key",
    "safety_identifier",
];

/// Largest `n` OpenAI accepts ("Create chat completion": `n`, 1 to 128).
pub const MAX_CHOICES: u32 = 128;

/// `reasoning_effort` values OpenAI accepts.
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

/// A validated request, still without routing decisions.
#[derive(Debug)]
pub struct ParsedChat {
    /// `model` as sent.
    pub model: String,
    /// Messages.
    pub messages: Vec<Message>,
    /// Tools.
    pub tools: Vec<Tool>,
    /// `tool_choice` as sent.
    pub tool_choice: Option<Value>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// SSE requested.
    pub stream: bool,
    /// Final usage chunk requested.
    pub include_usage: bool,
    /// Fields for an OpenAI upstream only.
    pub passthrough: BTreeMap<String, Passthrough>,
    /// The tools came as legacy `functions`: the answer uses `function_call`, not `tool_calls`.
    pub legacy_functions: bool,
}

impl ParsedChat {
    /// The request as the router takes it (`legacy_functions` is the front door's to keep).
    pub fn into_inbound(self) -> crate::route::Inbound {
        crate::route::Inbound {
            model: self.model,
            messages: self.messages,
            tools: self.tools,
            tool_choice: self.tool_choice,
            params: self.params,
            stream: self.stream,
            include_usage: self.include_usage,
            passthrough: self.passthrough,
        }
    }
}

/// The body as JSON, or OpenAI's 400 for unparsable JSON.
pub(crate) fn json_body(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::invalid(
            "Invalid request body: expected a JSON object.",
            None,
        )),
        Err(e) => Err(ApiError::invalid(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )),
    }
}

/// Deserialises `obj`; errors name the JSON path of the offending field (e.g. `messages[0].role`).
pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(
    obj: Map<String, Value>,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(obj)).map_err(ApiError::bad_body)
}

/// Parses `body`; errors name the JSON path of the offending field (e.g. `messages[0].role`).
pub fn parse(body: &[u8]) -> Result<ParsedChat, ApiError> {
    let mut obj = json_body(body)?;
    // `null` means absent for every optional top-level field.
    obj.retain(|_, v| !v.is_null());
    if let Some(Value::Array(messages)) = obj.get_mut("messages") {
        legacy_function_messages(messages);
    }
    let mut openai = Passthrough::default();
    for key in OPENAI_PASSTHROUGH {
        if let Some(v) = obj.remove(*key) {
            openai.body.insert((*key).to_owned(), v);
        }
    }
    let b: ChatCompletionBody = deserialize(obj)?;
    if let Some(name) = b.extra.keys().next() {
        return Err(ApiError::extra_field(name, UNSUPPORTED, |n| {
            format!("Unrecognized request argument supplied: {n}")
        }));
    }
    if b.model.trim().is_empty() {
        return Err(ApiError::invalid(
            "`model` must not be empty.",
            Some("model".into()),
        ));
    }
    if b.messages.is_empty() {
        return Err(ApiError::invalid(
            "`messages` must contain at least one message.",
            Some("messages".into()),
        ));
    }
    if let Some(m) = b.modalities.iter().flatten().find(|m| *m != "text") {
        return Err(ApiError::invalid(
            format!("`modalities` `{m}` is not supported by Switchyard yet: only `text`."),
            Some("modalities".into()),
        ));
    }
    if let Some(e) = b.reasoning_effort.as_deref()
        && !EFFORTS.contains(&e)
    {
        return Err(ApiError::invalid(
            format!(
                "Invalid value for `reasoning_effort`: `{e}`. Supported values are: {}.",
                EFFORTS.join(", ")
            ),
            Some("reasoning_effort".into()),
        ));
    }
    if let Some(k) = b.top_logprobs
        && k > 20
    {
        return Err(ApiError::invalid(
            format!("`top_logprobs` = {k} is out of range: expected 0 to 20."),
            Some("top_logprobs".into()),
        ));
    }
    check_range("temperature", b.temperature, 0.0, 2.0)?;
    check_range("top_p", b.top_p, 0.0, 1.0)?;
    check_range("presence_penalty", b.presence_penalty, -2.0, 2.0)?;
    check_range("frequency_penalty", b.frequency_penalty, -2.0, 2.0)?;
    if let Some(n) = b.n
        && !(1..=MAX_CHOICES).contains(&n)
    {
        return Err(ApiError::invalid(
            format!("`n` = {n} is out of range: expected 1 to {MAX_CHOICES}."),
            Some("n".into()),
        ));
    }
    let max_tokens = b.max_completion_tokens.or(b.max_tokens);
    if max_tokens == Some(0) {
        let p = if b.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        return Err(ApiError::invalid(
            format!("`{p}` must be at least 1."),
            Some(p.into()),
        ));
    }
    let stream = b.stream.unwrap_or(false);
    if b.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            Some("stream_options".into()),
        ));
    }
    let stop = match b.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    // Legacy `functions` / `function_call` when the current names are absent.
    let legacy_functions = b.tools.is_none() && b.functions.is_some();
    let tools = match (b.tools, b.functions) {
        (Some(t), _) => t,
        (None, Some(f)) => f
            .into_iter()
            .map(|function| Tool {
                kind: "function".into(),
                function,
            })
            .collect(),
        (None, None) => Vec::new(),
    };
    let tool_choice = b.tool_choice.or_else(|| {
        b.function_call.map(|fc| match fc {
            Value::Object(o) => json!({"type": "function", "function": {"name": o.get("name")}}),
            other => other,
        })
    });
    switchyard_schemas::input::check_conversation(&b.messages, &tools).map_err(|mut e| {
        if legacy_functions {
            // The client sent `functions[i]`, not `tools[i].function`.
            e.param = e
                .param
                .replacen("tools[", "functions[", 1)
                .replacen("].function.", "].", 1);
        }
        ApiError::from(e)
    })?;
    let mut passthrough = BTreeMap::new();
    if !openai.is_empty() {
        passthrough.insert(Passthrough::OPENAI.to_owned(), openai);
    }
    Ok(ParsedChat {
        legacy_functions,
        model: b.model,
        messages: b.messages,
        tools,
        tool_choice,
        params: SamplingParams {
            temperature: b.temperature,
            top_p: b.top_p,
            max_tokens,
            stop,
            n: b.n,
            seed: b.seed,
            presence_penalty: b.presence_penalty,
            frequency_penalty: b.frequency_penalty,
            response_format: b.response_format,
            parallel_tool_calls: b.parallel_tool_calls,
            user: b.user,
            reasoning_effort: b.reasoning_effort,
            logprobs: b.logprobs,
            top_logprobs: b.top_logprobs,
            top_k: None,
        },
        stream,
        include_usage: b
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        passthrough,
    })
}

/// Legacy function calling in history (OpenAI API reference, deprecated `function_call` on
/// assistant messages and the `function` role): an assistant `function_call` becomes a tool call
/// with id `call_fn_<index>`, a `function` message a `tool` message answering the latest such
/// call of the same name (or the latest call).
fn legacy_function_messages(messages: &mut [Value]) {
    let mut calls: Vec<(String, String)> = Vec::new();
    for (i, m) in messages.iter_mut().enumerate() {
        let Some(o) = m.as_object_mut() else { continue };
        match o.get("role").and_then(Value::as_str) {
            Some("assistant") => {
                let Some(fc) = o.remove("function_call").filter(Value::is_object) else {
                    continue;
                };
                let has_calls = o.get("tool_calls").is_some_and(|t| !t.is_null());
                if has_calls {
                    continue;
                }
                let id = format!("call_fn_{i}");
                let name = fc.get("name").and_then(Value::as_str).unwrap_or("");
                calls.push((name.to_owned(), id.clone()));
                o.insert(
                    "tool_calls".into(),
                    json!([{"id": id, "type": "function", "function": fc}]),
                );
            }
            Some("function") => {
                let name = o.get("name").and_then(Value::as_str).unwrap_or("");
                let id = calls
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name)
                    .or(calls.last())
                    .map_or_else(|| format!("call_fn_{name}"), |(_, id)| id.clone());
                o.insert("role".into(), json!("tool"));
                o.insert("tool_call_id".into(), json!(id));
            }
            _ => {}
        }
    }
}

fn check_range(name: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<(), ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::invalid(
            format!("`{name}` = {x} is out of range: expected {lo} to {hi}."),
            Some(name.into()),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn minimal_and_multipart() {
        let p = parse(br#"{"model":"demo/mock","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="}}]}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"stop":"x"}"#).unwrap();
        assert!(p.stream && p.include_usage);
        assert_eq!(p.params.max_tokens, Some(5));
        assert_eq!(p.params.stop, vec!["x".to_string()]);
    }

    /// What the current SDKs send, `null`s and replayed `model_dump()` history included.
    #[test]
    fn lenient_like_the_api() {
        let p = parse(br#"{"model":"m","store":false,"service_tier":"auto","logprobs":false,
            "top_logprobs":null,"reasoning_effort":"low","prediction":{"type":"content","content":"x"},
            "modalities":["text"],"metadata":{"a":"b"},"user":"u","temperature":null,"stop":null,
            "stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false},
            "messages":[{"role":"user","content":"hi"},
              {"role":"assistant","content":null,"refusal":null,"audio":null,"annotations":null,
               "function_call":null,"tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{}"}}]},
              {"role":"tool","tool_call_id":"c1","content":"ok"},
              {"role":"assistant","content":"done","tool_calls":null}]}"#)
        .unwrap();
        assert_eq!(p.params.reasoning_effort.as_deref(), Some("low"));
        assert_eq!(p.params.logprobs, Some(false));
        assert_eq!(p.params.user.as_deref(), Some("u"));
        assert!(p.include_usage);
        assert_eq!(p.messages[1].tool_calls[0].kind, "function");
        assert!(p.messages[3].tool_calls.is_empty());
        assert_eq!(
            serde_json::Value::Object(p.passthrough["openai"].body.clone()),
            json!({"service_tier": "auto", "prediction": {"type": "content", "content": "x"}})
        );
        let e = parse(br#"{"model":"m","reasoning_effort":"max","messages":[{"role":"user","content":"hi"}]}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
        let e = parse(br#"{"model":"m","modalities":["text","audio"],"messages":[{"role":"user","content":"hi"}]}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("modalities"));
    }

    /// Legacy `functions` / `function_call` and the `function` role.
    #[test]
    fn legacy_functions() {
        let p = parse(br#"{"model":"m","functions":[{"name":"w","parameters":{"type":"object"}}],
            "function_call":{"name":"w"},
            "messages":[{"role":"user","content":"hi"},
              {"role":"assistant","content":null,"function_call":{"name":"w","arguments":"{\"c\":1}"}},
              {"role":"function","name":"w","content":"sunny"}]}"#)
        .unwrap();
        assert_eq!(p.tools[0].function.name, "w");
        assert_eq!(
            p.tool_choice,
            Some(json!({"type": "function", "function": {"name": "w"}}))
        );
        let msgs = serde_json::to_value(&p.messages).unwrap();
        assert_eq!(
            msgs.as_array().unwrap()[1..],
            [
                json!({"role": "assistant", "tool_calls": [{"id": "call_fn_1", "type": "function",
                    "function": {"name": "w", "arguments": "{\"c\":1}"}}]}),
                json!({"role": "tool", "content": "sunny", "name": "w", "tool_call_id": "call_fn_1"})
            ]
        );
    }

    #[test]
    fn errors_name_the_parameter() {
        let e =
            parse(br#"{"model":"m","messages":[{"role":"wizard","content":"hi"}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        assert_eq!(e.status.as_u16(), 400);
        let e =
            parse(br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":3}"#)
                .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse(br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"audio":{}}"#)
            .unwrap_err();
        assert_eq!(
            e.message,
            "The parameter `audio` is not supported by Switchyard yet."
        );
        let e = parse(br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"bogus":1}"#)
            .unwrap_err();
        assert_eq!(e.message, "Unrecognized request argument supplied: bogus");
        let e = parse(br#"{"model":"m","messages":[]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = parse(b"{not json").unwrap_err();
        assert_eq!(e.param, None);
        let e = parse(br#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap_err();
        assert!(e.message.contains("model"), "{}", e.message);
    }
}
