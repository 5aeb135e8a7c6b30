//! Parses and validates an OpenAI `POST /v1/chat/completions` body into the normalised request.
//!
//! Reference: OpenAI API reference, "Create chat completion". Unknown or unsupported parameters are
//! rejected with a 400 naming the parameter (as OpenAI itself does), never silently dropped.

use crate::error::ApiError;
use serde::Deserialize;
use serde_json::Value;
use switchyard_schemas::request::{Message, SamplingParams, Tool};

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
    /// Accepted for SDK compatibility; stored with the request log later.
    #[allow(dead_code)]
    metadata: Option<Value>,
    #[serde(flatten)]
    extra: serde_json::Map<String, Value>,
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
}

/// Parameters OpenAI defines that Switchyard does not translate yet: a clear 400, not a silent drop.
const UNSUPPORTED: &[&str] = &[
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "audio",
    "modalities",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "functions",
    "function_call",
    "store",
    "service_tier",
];

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
}

/// Parses `body`; errors name the JSON path of the offending field (e.g. `messages[0].role`).
pub fn parse(body: &[u8]) -> Result<ParsedChat, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let b: ChatCompletionBody = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::invalid(
                format!("We could not parse the JSON body of your request: {inner}"),
                None,
            )
        } else if path == "." {
            ApiError::invalid(format!("Invalid request body: {inner}"), None)
        } else {
            ApiError::invalid(format!("Invalid value for `{path}`: {inner}"), Some(path))
        }
    })?;
    if let Some(name) = b.extra.keys().next() {
        let msg = if UNSUPPORTED.contains(&name.as_str()) {
            format!("The parameter `{name}` is not supported by Switchyard yet.")
        } else {
            format!("Unrecognized request argument supplied: {name}")
        };
        return Err(ApiError::invalid(msg, Some(name.clone())));
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
    check_range("temperature", b.temperature, 0.0, 2.0)?;
    check_range("top_p", b.top_p, 0.0, 1.0)?;
    check_range("presence_penalty", b.presence_penalty, -2.0, 2.0)?;
    check_range("frequency_penalty", b.frequency_penalty, -2.0, 2.0)?;
    if let Some(n) = b.n
        && n != 1
    {
        return Err(ApiError::invalid(
            format!("`n` = {n} is not supported yet: only one choice per request."),
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
    Ok(ParsedChat {
        model: b.model,
        messages: b.messages,
        tools: b.tools.unwrap_or_default(),
        tool_choice: b.tool_choice,
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
        },
        stream,
        include_usage: b
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
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
        let p = parse(br#"{"model":"demo/mock","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"stop":"x"}"#).unwrap();
        assert!(p.stream && p.include_usage);
        assert_eq!(p.params.max_tokens, Some(5));
        assert_eq!(p.params.stop, vec!["x".to_string()]);
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
        let e =
            parse(br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"logit_bias":{}}"#)
                .unwrap_err();
        assert_eq!(
            e.message,
            "The parameter `logit_bias` is not supported by Switchyard yet."
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
