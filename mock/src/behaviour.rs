//! Per-request behaviour of the mock upstream.
//!
//! Behaviour comes from `x-mock-<key>: value` headers, from `#mock key=value ...`
//! directive lines inside the last user message (its `tool_calls` ignored once the conversation
//! ends with a tool result) and from the `/x/<key=value,...>/` path prefix;
//! headers win over directives, directives over the path prefix.
//! Keys are case-insensitive and `-` is accepted in place of `_`
//! (`x-mock-ttft-ms` == `x-mock-ttft_ms`).

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use serde_json::Value;

use super::DEFAULT_TEXT;

/// Words repeated to build `text_len=N` texts.
const LOREM: &str = "lorem ipsum dolor sit amet ";

/// Cities used for the generated tool call arguments.
const CITIES: [&str; 6] = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome"];

/// Completion tokens reported per tool call.
const TOKENS_PER_TOOL_CALL: u64 = 10;

/// Everything the request asked the mock to do.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Behaviour {
    pub(crate) text: Option<String>,
    pub(crate) text_len: Option<usize>,
    pub(crate) chunks: Option<usize>,
    pub(crate) ttft_ms: u64,
    pub(crate) chunk_delay_ms: u64,
    pub(crate) status: Option<u16>,
    pub(crate) retry_after: Option<String>,
    pub(crate) error_after: Option<usize>,
    pub(crate) hang: bool,
    pub(crate) garbage: bool,
    pub(crate) split: Option<Vec<usize>>,
    pub(crate) split_every: Option<usize>,
    pub(crate) compact: bool,
    pub(crate) crlf: bool,
    pub(crate) tool_calls: usize,
    /// `tool_args=<urlencoded JSON>`: the arguments of every generated tool call (default
    /// `{"city": <a city>}`), of a forced tool choice's call (default `{}`), and the text of
    /// a JSON-mode answer.
    pub(crate) tool_args: Option<String>,
    pub(crate) prompt_tokens: Option<u64>,
    pub(crate) completion_tokens: Option<u64>,
    pub(crate) cached_tokens: Option<u64>,
    pub(crate) id: Option<String>,
    pub(crate) created: Option<u64>,
    pub(crate) fixture: Option<String>,
    /// `hold=1`: after the last event keep the connection open (no close, keep-alives if set).
    pub(crate) hold: bool,
    /// `keepalive_ms=N`: an SSE comment `: keepalive` every N ms while the stream is otherwise silent.
    pub(crate) keepalive_ms: Option<u64>,
    /// `fail_times=N`: `status` applies only to the first N requests with this `idempotency-key`.
    pub(crate) fail_times: Option<usize>,
    /// `error_message=<urlencoded>`: the message of a `status` error body.
    pub(crate) error_message: Option<String>,
    /// `json_for_stream=1`: answer a stream request with the complete JSON answer
    /// (`application/json`), as some OpenAI-compatible servers do.
    pub(crate) json_for_stream: bool,
    /// `reject_stream_options=1`: a request carrying `stream_options` gets 400 "Unrecognized
    /// request argument supplied: stream_options" (older Azure api-versions; FC-12 variant).
    pub(crate) reject_stream_options: bool,
    /// `call=<tool>:<percent-encoded JSON input>`: one call of that tool with that input, when
    /// the request declares the tool. Read only from the conversation's latest input (the
    /// messages after the last assistant turn: the prompt, or the tool results), so an agent
    /// loop goes on while each tool result asks for the next call (a result holding a
    /// `#mock call=…` line) and ends with a text answer when it does not.
    pub(crate) call: Option<(String, String)>,
    /// `rate_headers=1`: successful answers carry the provider's rate-limit headers.
    pub(crate) rate_headers: bool,
    /// `texts=<urlencoded>|<urlencoded>|…`: the text of each choice of an `n > 1` OpenAI
    /// request (choice `k` takes entry `k` modulo their number); without it every choice
    /// answers what one choice would.
    pub(crate) texts: Option<Vec<String>>,
    /// `accept_encrypted=<prefix>`: Responses requests whose input `reasoning` item has an
    /// `encrypted_content` not starting with `<prefix>` get OpenAI's 400
    /// `invalid_encrypted_content` (another deployment's encrypted reasoning).
    pub(crate) accept_encrypted: Option<String>,
    /// `usage=<urlencoded JSON object>`: the provider-native usage object to report verbatim
    /// (Anthropic `usage`, Gemini `usageMetadata`, Bedrock `usage`, OpenAI `usage`), replacing
    /// the generated counts; streams report it where the provider does (see each provider).
    pub(crate) usage: Option<Value>,
    /// `service_tier=<name>`: OpenAI's top-level `service_tier` on the answer (non-stream body
    /// and usage chunk).
    pub(crate) service_tier: Option<String>,
    /// `finish=<provider-native reason>`: the answer's stop reason written verbatim where the
    /// provider puts it (OpenAI `finish_reason`, Anthropic `stop_reason`, Gemini
    /// `finishReason`, Bedrock `stopReason`), e.g. `content_filter`, `refusal`, `SAFETY`,
    /// `guardrail_intervened`: a safety-blocked answer.
    pub(crate) finish: Option<String>,
}

impl Behaviour {
    /// Merges the path-prefix keys (`path_spec`, lowest precedence), the directives of the last
    /// user message and the `x-mock-*` headers (highest).
    pub(crate) fn from_request(
        path_spec: Option<&str>,
        headers: &HeaderMap,
        body: &Value,
    ) -> Result<Self, String> {
        let mut raw = path_spec.map(parse_path_spec).unwrap_or_default();
        if let Some(text) = last_user_text(body) {
            raw.extend(parse_directives(&text));
            // The directive asked for calls; once their results are the last message the model
            // answers in text (so an agent loop over the same user message terminates).
            if ends_with_tool_result(body) {
                raw.remove("tool_calls");
            }
        }
        raw.remove("call");
        if let Some(call) = parse_directives(&latest_input_text(body)).remove("call") {
            raw.insert("call".into(), call);
        }
        for (name, value) in headers {
            if let Some(key) = name.as_str().strip_prefix("x-mock-") {
                let value = value
                    .to_str()
                    .map_err(|_| format!("header {name} is not valid ASCII"))?;
                raw.insert(normalise_key(key), value.trim().to_string());
            }
        }
        Self::from_pairs(&raw)
    }

    /// Parses normalised `key -> value` pairs. Unknown keys are ignored.
    pub(crate) fn from_pairs(raw: &BTreeMap<String, String>) -> Result<Self, String> {
        let mut b = Behaviour::default();
        for (key, value) in raw {
            let v = value.as_str();
            match key.as_str() {
                "text" => b.text = Some(percent_decode(v)?),
                "text_len" => b.text_len = Some(num(key, v)?),
                "chunks" => b.chunks = Some(num(key, v)?),
                "ttft_ms" => b.ttft_ms = num(key, v)?,
                "chunk_delay_ms" => b.chunk_delay_ms = num(key, v)?,
                "status" => {
                    let status: u16 = num(key, v)?;
                    match status {
                        200..=299 => b.status = None,
                        400..=599 => b.status = Some(status),
                        _ => return Err(format!("mock status must be 2xx, 4xx or 5xx, got {v}")),
                    }
                }
                "retry_after" => b.retry_after = Some(v.to_string()),
                "error_after" => b.error_after = Some(num(key, v)?),
                "hang" => b.hang = flag(key, v)?,
                "garbage" => b.garbage = flag(key, v)?,
                "split" => b.split = Some(num_list(key, v)?),
                "split_every" => {
                    let every: usize = num(key, v)?;
                    if every == 0 {
                        return Err("mock split_every must be at least 1".to_string());
                    }
                    b.split_every = Some(every);
                }
                "compact" => b.compact = flag(key, v)?,
                "crlf" => b.crlf = flag(key, v)?,
                "tool_calls" => b.tool_calls = num(key, v)?,
                "tool_args" => b.tool_args = Some(percent_decode(v)?),
                "prompt_tokens" => b.prompt_tokens = Some(num(key, v)?),
                "completion_tokens" => b.completion_tokens = Some(num(key, v)?),
                "cached_tokens" => b.cached_tokens = Some(num(key, v)?),
                "id" => b.id = Some(percent_decode(v)?),
                "created" => b.created = Some(num(key, v)?),
                "fixture" => b.fixture = Some(v.to_owned()),
                "usage" => {
                    let text = percent_decode(v)?;
                    let usage: Value = serde_json::from_str(&text)
                        .map_err(|e| format!("mock usage is not JSON: {e}"))?;
                    if !usage.is_object() {
                        return Err("mock usage must be a JSON object".to_string());
                    }
                    b.usage = Some(usage);
                }
                "service_tier" => b.service_tier = Some(v.to_owned()),
                "finish" => b.finish = Some(v.to_owned()),
                "hold" => b.hold = v == "1" || v == "true",
                "keepalive_ms" => {
                    let ms: u64 = num(key, v)?;
                    b.keepalive_ms = (ms > 0).then_some(ms);
                }
                "fail_times" => b.fail_times = Some(num(key, v)?),
                "error_message" => b.error_message = Some(percent_decode(v)?),
                "json_for_stream" => b.json_for_stream = flag(key, v)?,
                "reject_stream_options" => b.reject_stream_options = flag(key, v)?,
                "rate_headers" => b.rate_headers = flag(key, v)?,
                "accept_encrypted" => b.accept_encrypted = Some(percent_decode(v)?),
                "texts" => {
                    let texts = v
                        .split('|')
                        .map(percent_decode)
                        .collect::<Result<Vec<_>, _>>()?;
                    b.texts = Some(texts);
                }
                "call" => {
                    let (name, input) = v
                        .split_once(':')
                        .ok_or_else(|| format!("mock call must be <tool>:<json>, got {v}"))?;
                    let input = percent_decode(input)?;
                    serde_json::from_str::<Value>(&input)
                        .map_err(|e| format!("mock call input is not JSON: {e}"))?;
                    b.call = Some((name.to_owned(), input));
                }
                other => tracing::debug!(key = other, "ignoring unknown mock key"),
            }
        }
        Ok(b)
    }

    /// Byte offsets at which a serialised body is cut into frames, if splitting was requested.
    pub(crate) fn split_offsets(&self, len: usize) -> Option<Vec<usize>> {
        let mut offsets = if let Some(every) = self.split_every {
            (1..).map(|i| i * every).take_while(|o| *o < len).collect()
        } else {
            self.split.clone()?
        };
        offsets.retain(|o| *o > 0 && *o < len);
        offsets.sort_unstable();
        offsets.dedup();
        Some(offsets)
    }
}

/// What the request body says, independent of the provider's wire format.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestInfo {
    pub(crate) model: String,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) tool_names: Vec<String>,
    pub(crate) prompt_words: u64,
    /// Assistant messages in the conversation (tags `call=` tool ids).
    pub(crate) assistant_turns: usize,
    /// OpenAI `logprobs: true`: text chunks carry `logprobs.content` (one entry per chunk, the
    /// chunk as its token, `logprob` −0.5, no alternatives).
    pub(crate) logprobs: bool,
    /// The tool a forced tool choice names (Anthropic `tool_choice: {"type":"tool","name"}`),
    /// when the request declares it: answered with one call of it (see [`generate`]).
    pub(crate) forced_tool: Option<String>,
    /// The request asks for JSON text (Gemini `generationConfig.responseMimeType:
    /// application/json`): the text is JSON (see [`generate`]).
    pub(crate) json_text: bool,
    /// OpenAI `n`: choices to answer with (see [`generate_choices`]); 0 or 1 is one.
    pub(crate) n: usize,
    /// OpenAI `top_logprobs`: alternatives per logprobs entry (the token itself at −0.5, then
    /// `alt1`, `alt2`, … at −1.5, −2.5, …).
    pub(crate) top_logprobs: usize,
}

/// One generated tool call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    pub(crate) name: String,
    pub(crate) arguments: String,
    /// `arguments` cut into at least two pieces for streaming.
    pub(crate) pieces: Vec<String>,
    /// The call id's suffix instead of its index (ids must differ between the turns of an agent
    /// loop: `call=` calls are `<tool>_<assistant turns so far>`).
    pub(crate) tag: Option<String>,
}

impl ToolCall {
    /// The id suffix of the `i`-th call: its tag, or `i`.
    pub(crate) fn key(&self, i: usize) -> String {
        self.tag.clone().unwrap_or_else(|| i.to_string())
    }
}

/// The generated assistant output.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Output {
    /// Plain text, already cut into stream chunks.
    Text {
        chunks: Vec<String>,
        truncated: bool,
    },
    /// Parallel tool calls.
    Tools(Vec<ToolCall>),
}

/// Token accounting in provider-neutral form (`prompt` includes `cached`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) prompt: u64,
    pub(crate) completion: u64,
    pub(crate) cached: u64,
}

/// A complete generated answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Generation {
    pub(crate) output: Output,
    pub(crate) usage: Usage,
    /// [`Behaviour::usage`]: the provider-native usage object to report instead of `usage`.
    pub(crate) raw_usage: Option<Value>,
    /// [`Behaviour::service_tier`].
    pub(crate) service_tier: Option<String>,
    /// [`Behaviour::finish`].
    pub(crate) finish: Option<String>,
}

impl Generation {
    /// The stop reason in a provider's words: the forced [`Behaviour::finish`] if any, else
    /// `truncated` for text cut at `max_tokens`, `done` for whole text, `tools` for tool calls.
    pub(crate) fn finish_word<'a>(
        &'a self,
        truncated: &'a str,
        done: &'a str,
        tools: &'a str,
    ) -> &'a str {
        if let Some(f) = &self.finish {
            return f;
        }
        match &self.output {
            Output::Text {
                truncated: true, ..
            } => truncated,
            Output::Text { .. } => done,
            Output::Tools(_) => tools,
        }
    }

    /// Number of streamed content pieces (text chunks or tool argument pieces).
    pub(crate) fn content_pieces(&self) -> usize {
        match &self.output {
            Output::Text { chunks, .. } => chunks.len(),
            Output::Tools(calls) => calls.iter().map(|c| c.pieces.len()).sum(),
        }
    }
}

/// Produces the answer for a request.
pub(crate) fn generate(b: &Behaviour, info: &RequestInfo) -> Generation {
    let call = b
        .call
        .as_ref()
        .filter(|(name, _)| info.tool_names.contains(name));
    let (output, default_completion) = if let Some((name, arguments)) = call {
        let pieces = split_even(arguments, b.chunks.unwrap_or(2).max(2));
        let call = ToolCall {
            name: name.clone(),
            arguments: arguments.clone(),
            pieces,
            tag: Some(format!("{}_{}", name.to_lowercase(), info.assistant_turns)),
        };
        (Output::Tools(vec![call]), TOKENS_PER_TOOL_CALL)
    } else if b.tool_calls > 0 {
        let calls: Vec<ToolCall> = (0..b.tool_calls)
            .map(|i| {
                let name = if info.tool_names.is_empty() {
                    "get_weather".to_string()
                } else {
                    info.tool_names[i % info.tool_names.len()].clone()
                };
                let arguments = b.tool_args.clone().unwrap_or_else(|| {
                    serde_json::json!({ "city": CITIES[i % CITIES.len()] }).to_string()
                });
                let pieces = split_even(&arguments, b.chunks.unwrap_or(2).max(2));
                ToolCall {
                    name,
                    arguments,
                    pieces,
                    tag: None,
                }
            })
            .collect();
        let tokens = TOKENS_PER_TOOL_CALL * calls.len() as u64;
        (Output::Tools(calls), tokens)
    } else if let Some(name) = &info.forced_tool {
        // The model's JSON: `tool_args`, else a `text` that is a JSON object, else `{}`.
        let text_json = b
            .text
            .clone()
            .filter(|t| serde_json::from_str::<Value>(t).is_ok_and(|v| v.is_object()));
        let arguments = b
            .tool_args
            .clone()
            .or(text_json)
            .unwrap_or_else(|| "{}".into());
        let pieces = split_even(&arguments, b.chunks.unwrap_or(2).max(2));
        let call = ToolCall {
            name: name.clone(),
            arguments,
            pieces,
            tag: None,
        };
        (Output::Tools(vec![call]), TOKENS_PER_TOOL_CALL)
    } else {
        let text = match (&b.text, b.text_len) {
            (Some(text), _) => text.clone(),
            (None, Some(len)) => lorem(len),
            // JSON mode: `tool_args` is the JSON the model writes.
            (None, None) if info.json_text => b
                .tool_args
                .clone()
                .unwrap_or_else(|| serde_json::json!({ "text": DEFAULT_TEXT }).to_string()),
            (None, None) => DEFAULT_TEXT.to_string(),
        };
        let (text, truncated) = match info.max_tokens {
            Some(max) => truncate_words(&text, max),
            None => (text, false),
        };
        let words = word_count(&text);
        let chunks = match b.chunks {
            Some(n) => split_even(&text, n),
            None => chunk_words(&text),
        };
        (Output::Text { chunks, truncated }, words)
    };
    let usage = Usage {
        prompt: b.prompt_tokens.unwrap_or(info.prompt_words),
        completion: b.completion_tokens.unwrap_or(default_completion),
        cached: b.cached_tokens.unwrap_or(0),
    };
    Generation {
        output,
        usage,
        raw_usage: b.usage.clone(),
        service_tier: b.service_tier.clone(),
        finish: b.finish.clone(),
    }
}

/// The choices of an OpenAI request (`n`, at least one): choice `k` answers `texts[k]` when
/// `texts` is set, else what [`generate`] answers. Each has its own finish reason (`max_tokens`
/// applies per choice); usage is reported once by the caller, with the completions summed.
pub(crate) fn generate_choices(b: &Behaviour, info: &RequestInfo) -> Vec<Generation> {
    (0..info.n.max(1))
        .map(|k| match &b.texts {
            Some(texts) if !texts.is_empty() => {
                let mut one = b.clone();
                one.text = texts.get(k % texts.len()).cloned();
                generate(&one, info)
            }
            _ => generate(b, info),
        })
        .collect()
}

/// Number of whitespace-separated words.
pub(crate) fn word_count(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// Words over all text found in a message `content` (string or array of parts, recursively).
pub(crate) fn content_words(content: &Value) -> u64 {
    match content {
        Value::String(s) => word_count(s),
        Value::Array(parts) => parts.iter().map(content_words).sum(),
        Value::Object(part) => {
            let text = part.get("text").map_or(0, content_words);
            let nested = part.get("content").map_or(0, content_words);
            text + nested
        }
        _ => 0,
    }
}

/// The string at `pointer` in each element of the array `list` (the names of declared tools), in
/// order; elements without one are skipped, and an absent list has none.
pub(crate) fn names_at(list: Option<&Value>, pointer: &str) -> Vec<String> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.pointer(pointer).and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// A request body's `model` (`mock` when absent) and `stream` flag (off when absent).
pub(crate) fn model_and_stream(body: &Value) -> (String, bool) {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("mock");
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    (model.to_string(), stream)
}

/// Words over the `content` of every message in `messages`.
pub(crate) fn messages_words(body: &Value) -> u64 {
    body.get("messages")
        .and_then(Value::as_array)
        .map_or(0, |messages| {
            messages
                .iter()
                .filter_map(|m| m.get("content"))
                .map(content_words)
                .sum()
        })
}

/// The conversation's last message is a tool result: OpenAI `role: tool`, or an Anthropic user
/// message whose content ends with a `tool_result` block.
fn ends_with_tool_result(body: &Value) -> bool {
    let Some(last) = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
    else {
        return false;
    };
    last.get("role").and_then(Value::as_str) == Some("tool")
        || last
            .get("content")
            .and_then(Value::as_array)
            .and_then(|c| c.last())
            .and_then(|b| b.get("type"))
            .and_then(Value::as_str)
            == Some("tool_result")
}

/// The text of the last message with role `user` (text parts joined by newlines).
fn last_user_text(body: &Value) -> Option<String> {
    let messages = body.get("messages")?.as_array()?;
    let last = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    match last.get("content")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

/// All text of the messages after the last assistant turn (OpenAI `user`/`tool` messages,
/// Anthropic `user` turns with text and `tool_result` blocks), joined by newlines.
fn latest_input_text(body: &Value) -> String {
    fn text_of(content: &Value, out: &mut Vec<String>) {
        match content {
            Value::String(s) => out.push(s.clone()),
            Value::Array(parts) => parts.iter().for_each(|p| text_of(p, out)),
            Value::Object(part) => {
                if let Some(t) = part.get("text").and_then(Value::as_str) {
                    out.push(t.to_owned());
                }
                if let Some(c) = part.get("content") {
                    text_of(c, out);
                }
            }
            _ => {}
        }
    }
    let messages = body.get("messages").and_then(Value::as_array);
    let all = messages.map(Vec::as_slice).unwrap_or_default();
    let from = all
        .iter()
        .rposition(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .map_or(0, |i| i + 1);
    let mut out = Vec::new();
    for c in all[from..].iter().filter_map(|m| m.get("content")) {
        text_of(c, &mut out);
    }
    out.join("\n")
}

/// Extracts `key=value` pairs from every `#mock ...` line; later lines win.
/// A bare `key` means `key=1`.
pub(crate) fn parse_directives(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix("#mock") else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
            continue;
        }
        for token in rest.split_whitespace() {
            let (key, value) = token.split_once('=').unwrap_or((token, "1"));
            out.insert(normalise_key(key), value.to_string());
        }
    }
    out
}

/// Parses the `k=v,k=v` segment of a `/x/<spec>/…` path. A piece without `=` continues the
/// previous value (so `split=5,9` keeps its list); `%XX` escapes are decoded by the keys that
/// take text (`text`, `id`, `error_message`).
pub(crate) fn parse_path_spec(spec: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut last: Option<String> = None;
    for piece in spec.split(',').filter(|p| !p.is_empty()) {
        match piece.split_once('=') {
            Some((key, value)) => {
                let key = normalise_key(key);
                out.insert(key.clone(), value.to_string());
                last = Some(key);
            }
            None => match last.as_ref().and_then(|k| out.get_mut(k)) {
                Some(value) => {
                    value.push(',');
                    value.push_str(piece);
                }
                None => {
                    out.insert(normalise_key(piece), "1".to_string());
                }
            },
        }
    }
    out
}

fn normalise_key(key: &str) -> String {
    key.trim().to_ascii_lowercase().replace('-', "_")
}

fn num<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("mock key {key}: {value:?} is not a valid non-negative number"))
}

fn num_list(key: &str, value: &str) -> Result<Vec<usize>, String> {
    value
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| num(key, s))
        .collect()
}

fn flag(key: &str, value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" | "" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("mock key {key}: {value:?} is not a boolean")),
    }
}

/// Decodes `%XX` escapes and `+` (as a space), like `application/x-www-form-urlencoded`.
/// Malformed escapes are kept literally.
pub(crate) fn percent_decode(value: &str) -> Result<String, String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("mock text {value:?} does not decode to UTF-8"))
}

/// A deterministic ASCII text of exactly `len` bytes made of lorem-ipsum words.
pub(crate) fn lorem(len: usize) -> String {
    LOREM.chars().cycle().take(len).collect()
}

/// Keeps the first `max` words (and the whitespace between them).
/// Returns whether anything was cut off.
pub(crate) fn truncate_words(text: &str, max: u64) -> (String, bool) {
    if word_count(text) <= max {
        return (text.to_string(), false);
    }
    let mut words = 0;
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if in_word {
                words += 1;
                if words == max {
                    return (text[..i].to_string(), true);
                }
            }
            in_word = false;
        } else {
            if !in_word && max == 0 {
                return (String::new(), true);
            }
            in_word = true;
        }
    }
    (text.to_string(), false)
}

/// One chunk per word; each word keeps its following whitespace (leading whitespace goes
/// to the first chunk), so the chunks concatenate to `text` exactly.
pub(crate) fn chunk_words(text: &str) -> Vec<String> {
    let mut chunks: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut seen_space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            seen_space = true;
        } else if seen_space && current.chars().any(|c| !c.is_whitespace()) {
            chunks.push(std::mem::take(&mut current));
            seen_space = false;
        } else {
            seen_space = false;
        }
        current.push(c);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

/// Splits `text` into `n` nearly-equal pieces at char boundaries (fewer if it has
/// fewer than `n` chars; none for an empty text).
pub(crate) fn split_even(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let n = n.max(1).min(chars.len());
    if n == 0 {
        return Vec::new();
    }
    let base = chars.len() / n;
    let rem = chars.len() % n;
    let mut out = Vec::with_capacity(n);
    let mut start = 0;
    for i in 0..n {
        let len = base + usize::from(i < rem);
        out.push(chars[start..start + len].iter().collect());
        start += len;
    }
    out
}

#[cfg(test)]
mod path_spec_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn path_spec_pairs_lists_and_precedence() {
        let raw = parse_path_spec("status=503,retry_after=2,split=5,9,Keepalive-MS=50");
        assert_eq!(raw["status"], "503");
        assert_eq!(raw["split"], "5,9");
        assert_eq!(raw["keepalive_ms"], "50");
        // Directives beat the path prefix, headers beat both.
        let body =
            serde_json::json!({"messages": [{"role": "user", "content": "#mock status=429"}]});
        let b = Behaviour::from_request(Some("status=503,ttft_ms=7"), &HeaderMap::new(), &body)
            .unwrap();
        assert_eq!((b.status, b.ttft_ms), (Some(429), 7));
        let mut h = HeaderMap::new();
        h.insert("x-mock-status", "500".parse().unwrap());
        let b = Behaviour::from_request(Some("status=503"), &h, &body).unwrap();
        assert_eq!(b.status, Some(500));
        let b = Behaviour::from_request(
            Some("error_message=messages.0.content%3A+invalid,fail_times=1"),
            &HeaderMap::new(),
            &serde_json::json!({}),
        )
        .unwrap();
        assert_eq!(
            b.error_message.as_deref(),
            Some("messages.0.content: invalid")
        );
        assert_eq!(b.fail_times, Some(1));
    }
}
