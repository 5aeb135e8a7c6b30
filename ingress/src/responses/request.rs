//! Parses a `POST /v1/responses` body (OpenAI API reference, "Create a model response") into the
//! normalised request, the input items to store, and the request parameters the response object
//! echoes.
//!
//! Mapping onto the normalised (Chat Completions vocabulary) request:
//!
//! | Responses | normalised |
//! |---|---|
//! | `instructions` | a leading `system` message (not carried over by `previous_response_id`, as OpenAI) |
//! | `input` string | one `user` message |
//! | `message` item (`role` user/assistant/system/developer, string or `input_text`/`input_image`/`output_text`/`refusal` parts) | a message of that role |
//! | `function_call` item | a tool call on the assistant message before it (consecutive calls form one turn) |
//! | `function_call_output` item | a `tool` message |
//! | `reasoning` item | with `encrypted_content`: kept on the next assistant turn, sent unchanged to Responses-API targets only, and the conversation is pinned to the target that accepted it (see [`super`]); otherwise dropped (listed in `input_items`) |
//! | `tools` (`{"type":"function","name",…}`) | function tools; hosted tools → 400 naming the type |
//! | `namespace` tool (a named group of function tools, Codex CLI) | its function tools, flattened; calls come back with `namespace` |
//! | `tool_choice` `{"type":"function","name"}` | `{"type":"function","function":{"name"}}` |
//! | `max_output_tokens` | `max_tokens` |
//! | `text.format` `json_schema` / `json_object` / `text` | `response_format` `json_schema` / `json_object` / none |
//! | `user` (or `safety_identifier`) | `user` |
//!
//! Accepted and echoed but not sent upstream: `reasoning` (effort/summary), `metadata`, `store`,
//! `truncation`, `include`, `service_tier`, `prompt_cache_key`, `max_tool_calls`, `text.verbosity`,
//! `stream_options`, `client_metadata`, `prompt_cache_retention`, `top_logprobs` (no logprobs are
//! returned). Rejected with a 400 naming the parameter: `background: true`,
//! `conversation`, `prompt`, `input_file` parts, `item_reference` and hosted-tool items.

use crate::error::ApiError;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use switchyard_schemas::input;
use switchyard_schemas::request::{
    Content, ContentPart, FilePart, FunctionCall, FunctionDef, ImageUrl, Message, Role,
    SamplingParams, ThinkingBlock, Tool, ToolCall,
};

/// The parts of a Responses body Switchyard understands; every field may be `null`.
#[derive(Debug, Deserialize)]
struct ResponsesBody {
    model: String,
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    text: Option<TextConfig>,
    reasoning: Option<Value>,
    metadata: Option<Map<String, Value>>,
    parallel_tool_calls: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    stream: Option<bool>,
    #[allow(dead_code)]
    stream_options: Option<Value>,
    user: Option<String>,
    safety_identifier: Option<String>,
    truncation: Option<String>,
    #[allow(dead_code)]
    include: Option<Vec<String>>,
    service_tier: Option<String>,
    prompt_cache_key: Option<String>,
    max_tool_calls: Option<u32>,
    background: Option<bool>,
    top_logprobs: Option<u32>,
    /// Accepted and ignored (Codex CLI sends its session ids here).
    #[allow(dead_code)]
    client_metadata: Option<Value>,
    /// Accepted and ignored: prompt caching is the upstream's own business.
    #[allow(dead_code)]
    prompt_cache_retention: Option<String>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct TextConfig {
    format: Option<Value>,
    verbosity: Option<String>,
}

/// Parameters OpenAI defines that Switchyard does not serve: a clear 400, not a silent drop.
const UNSUPPORTED: &[&str] = &["conversation", "prompt"];

/// Hosted (OpenAI-side) tool types: only OpenAI can run them.
const HOSTED_TOOLS: &[&str] = &[
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
    "file_search",
    "computer_use",
    "computer_use_preview",
    "computer",
    "code_interpreter",
    "mcp",
    "image_generation",
    "local_shell",
    "shell",
    "apply_patch",
    "custom",
    "tool_search",
];

/// A validated Responses request.
#[derive(Debug, Clone)]
pub struct ParsedResponses {
    /// `model` as sent.
    pub model: String,
    /// This request's conversation: `instructions` as a system message, then the input items.
    /// A stored predecessor's history goes between the two ([`Self::with_history`]).
    pub instructions: Option<String>,
    /// The input items as messages (without instructions or a predecessor's history).
    pub input_messages: Vec<Message>,
    /// The input items in the stored `input_items` shape, each with an `id`.
    pub input_items: Vec<Value>,
    /// Function tools.
    pub tools: Vec<Tool>,
    /// Normalised (Chat Completions shaped) `tool_choice`.
    pub tool_choice: Option<Value>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// SSE requested.
    pub stream: bool,
    /// Keep the response (default true, as OpenAI).
    pub store: bool,
    /// The response this one continues.
    pub previous_response_id: Option<String>,
    /// The request parameters a `response` object echoes (`tools`, `tool_choice`, `text`, …).
    pub echo: Map<String, Value>,
    /// Function name → its `namespace` tool, for tools sent inside one.
    pub namespaces: HashMap<String, String>,
}

impl ParsedResponses {
    /// The full conversation: instructions, then `history` (a stored predecessor's input and
    /// output), then this request's input.
    pub fn conversation(&self, history: &[Message]) -> Vec<Message> {
        let mut out = Vec::with_capacity(history.len() + self.input_messages.len() + 1);
        if let Some(i) = &self.instructions {
            out.push(text_message(Role::System, i.clone()));
        }
        out.extend(history.iter().cloned());
        out.extend(self.input_messages.iter().cloned());
        out
    }
}

/// Parses `body`; errors name the JSON path of the offending field (e.g. `input[1].role`).
pub fn parse(body: &[u8], item_prefix: &str) -> Result<ParsedResponses, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let b: ResponsesBody = serde_path_to_error::deserialize(de).map_err(ApiError::bad_body)?;
    if let Some((name, _)) = b.extra.iter().find(|(_, v)| !v.is_null()) {
        return Err(ApiError::extra_field(name, UNSUPPORTED, |n| {
            format!("Unknown parameter: '{n}'.")
        }));
    }
    if b.model.trim().is_empty() {
        return Err(invalid("`model` must not be empty.", "model"));
    }
    if b.background == Some(true) {
        return Err(invalid(
            "`background` responses are not supported by Switchyard yet.",
            "background",
        ));
    }
    check_range("temperature", b.temperature, 0.0, 2.0)?;
    check_range("top_p", b.top_p, 0.0, 1.0)?;
    if b.max_output_tokens == Some(0) {
        return Err(invalid(
            "`max_output_tokens` must be at least 1.",
            "max_output_tokens",
        ));
    }
    let mut ids = IdGen {
        prefix: item_prefix.to_owned(),
        next: 0,
    };
    let (input_messages, input_items) = match b.input {
        None | Some(Value::Null) => {
            if b.previous_response_id.is_none() {
                return Err(invalid("Missing required parameter: 'input'.", "input"));
            }
            (Vec::new(), Vec::new())
        }
        Some(Value::String(s)) => {
            let item = json!({"id": ids.next("msg"), "type": "message", "role": "user",
                "status": "completed", "content": [{"type": "input_text", "text": s}]});
            (vec![text_message(Role::User, s)], vec![item])
        }
        Some(Value::Array(items)) => input_items(items, &mut ids)?,
        Some(_) => {
            return Err(invalid(
                "Invalid type for 'input': expected a string or an array of input items.",
                "input",
            ));
        }
    };
    let raw_tools = b.tools.unwrap_or_default();
    let mut tools = Vec::with_capacity(raw_tools.len());
    let mut echo_tools = Vec::with_capacity(raw_tools.len());
    let mut namespaces = HashMap::new();
    for (i, t) in raw_tools.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) == Some("namespace") {
            // A group of function tools (Codex sends them): flattened, each call marked with
            // its `namespace` on the way out.
            let ns = str_field(t, "name", &format!("tools[{i}]"))?.to_owned();
            let inner = t
                .get("tools")
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            for (j, f) in inner.iter().enumerate() {
                let f = tool(&format!("tools[{i}].tools[{j}]"), f)?;
                namespaces.insert(f.function.name.clone(), ns.clone());
                tools.push(f);
            }
            echo_tools.push(t.clone());
            continue;
        }
        let f = tool(&format!("tools[{i}]"), t)?;
        echo_tools.push(json!({"type": "function", "name": f.function.name,
            "description": f.function.description, "parameters": f.function.parameters,
            "strict": f.function.strict.unwrap_or(true)}));
        tools.push(f);
    }
    let tool_choice = b.tool_choice.as_ref().map(tool_choice).transpose()?;
    let (response_format, format_echo) =
        text_format(b.text.as_ref().and_then(|t| t.format.as_ref()))?;
    let stream = b.stream.unwrap_or(false);
    let store = b.store.unwrap_or(true);
    let user = b.user.clone().or_else(|| b.safety_identifier.clone());

    let reasoning = b
        .reasoning
        .clone()
        .filter(|r| !r.is_null())
        .unwrap_or(json!({}));
    let mut echo = Map::new();
    let mut put = |k: &str, v: Value| {
        echo.insert(k.to_owned(), v);
    };
    put("instructions", json!(b.instructions));
    put("max_output_tokens", json!(b.max_output_tokens));
    put("max_tool_calls", json!(b.max_tool_calls));
    put(
        "metadata",
        Value::Object(b.metadata.clone().unwrap_or_default()),
    );
    put(
        "parallel_tool_calls",
        json!(b.parallel_tool_calls.unwrap_or(true)),
    );
    put("previous_response_id", json!(b.previous_response_id));
    put("prompt_cache_key", json!(b.prompt_cache_key));
    put(
        "reasoning",
        json!({"effort": reasoning.get("effort").cloned().unwrap_or(Value::Null),
            "summary": reasoning.get("summary").cloned().unwrap_or(Value::Null)}),
    );
    put("safety_identifier", json!(b.safety_identifier));
    put(
        "service_tier",
        json!(b.service_tier.as_ref().map(|_| "default")),
    );
    put("store", json!(store));
    put("temperature", json!(b.temperature.unwrap_or(1.0)));
    put(
        "text",
        json!({"format": format_echo, "verbosity": b.text.as_ref().and_then(|t| t.verbosity.clone()).unwrap_or_else(|| "medium".into())}),
    );
    put(
        "tool_choice",
        b.tool_choice.clone().unwrap_or_else(|| json!("auto")),
    );
    put("tools", Value::Array(echo_tools));
    put("top_logprobs", json!(b.top_logprobs.unwrap_or(0)));
    put("top_p", json!(b.top_p.unwrap_or(1.0)));
    put(
        "truncation",
        json!(b.truncation.clone().unwrap_or_else(|| "disabled".into())),
    );
    put("user", json!(b.user));
    put("background", json!(false));

    Ok(ParsedResponses {
        model: b.model,
        instructions: b.instructions,
        input_messages,
        input_items,
        tools,
        tool_choice,
        params: SamplingParams {
            temperature: b.temperature,
            top_p: b.top_p,
            max_tokens: b.max_output_tokens,
            response_format,
            parallel_tool_calls: b.parallel_tool_calls,
            user,
            ..SamplingParams::default()
        },
        stream,
        store,
        previous_response_id: b.previous_response_id,
        echo,
        namespaces,
    })
}

/// Item ids: `<kind>_<response id hex><n>`, unique per response.
struct IdGen {
    prefix: String,
    next: u32,
}

impl IdGen {
    fn next(&mut self, kind: &str) -> String {
        self.next += 1;
        format!("{kind}_{}{:04}", self.prefix, self.next)
    }
}

fn invalid(message: &str, param: &str) -> ApiError {
    ApiError::invalid(message, Some(param.to_owned()))
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

/// A message with plain text content.
pub fn text_message(role: Role, text: String) -> Message {
    Message {
        role,
        content: Some(Content::Text(text)),
        name: None,
        tool_calls: Vec::new(),
        tool_call_id: None,
        cache_control: None,
        thinking_blocks: Vec::new(),
    }
}

fn str_field<'a>(v: &'a Value, key: &str, path: &str) -> Result<&'a str, ApiError> {
    v.get(key).and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            format!("Missing required parameter: '{path}.{key}'."),
            Some(format!("{path}.{key}")),
        )
    })
}

/// The input items as messages and in the stored shape.
fn input_items(items: Vec<Value>, ids: &mut IdGen) -> Result<(Vec<Message>, Vec<Value>), ApiError> {
    let mut messages: Vec<Message> = Vec::new();
    let mut stored = Vec::with_capacity(items.len());
    // Encrypted reasoning items waiting for the assistant turn they led to.
    let mut reasoning: Vec<ThinkingBlock> = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("input[{i}]");
        let kind = match item.get("type") {
            None | Some(Value::Null) if item.get("role").is_some() => "message",
            Some(Value::String(s)) => s.as_str(),
            _ => {
                return Err(ApiError::invalid(
                    format!("Missing required parameter: '{path}.type'."),
                    Some(format!("{path}.type")),
                ));
            }
        };
        match kind {
            "message" => {
                let (mut m, s) = message_item(&item, &path, ids)?;
                if m.role == Role::Assistant {
                    m.thinking_blocks.append(&mut reasoning);
                }
                messages.push(m);
                stored.push(s);
            }
            "function_call" => {
                let call_id = str_field(&item, "call_id", &path)?.to_owned();
                input::tool_call_id(Some(&call_id))
                    .map_err(|e| ApiError::invalid_field(format!("{path}.call_id"), e))?;
                let name = str_field(&item, "name", &path)?.to_owned();
                input::tool_name(&name)
                    .map_err(|e| ApiError::invalid_field(format!("{path}.name"), e))?;
                let arguments = str_field(&item, "arguments", &path)?.to_owned();
                let id = item
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| ids.next("fc"));
                let call = ToolCall {
                    id: call_id.clone(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: name.clone(),
                        arguments: arguments.clone(),
                    },
                };
                // Consecutive calls (and a text message just before them) are one assistant turn.
                match messages.last_mut() {
                    Some(m) if m.role == Role::Assistant && reasoning.is_empty() => {
                        m.tool_calls.push(call)
                    }
                    _ => messages.push(Message {
                        role: Role::Assistant,
                        content: None,
                        name: None,
                        tool_calls: vec![call],
                        tool_call_id: None,
                        cache_control: None,
                        thinking_blocks: std::mem::take(&mut reasoning),
                    }),
                }
                stored.push(
                    json!({"id": id, "type": "function_call", "status": "completed",
                    "call_id": call_id, "name": name, "arguments": arguments}),
                );
            }
            "function_call_output" => {
                let call_id = str_field(&item, "call_id", &path)?.to_owned();
                input::tool_call_id(Some(&call_id))
                    .map_err(|e| ApiError::invalid_field(format!("{path}.call_id"), e))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    _ => {
                        return Err(ApiError::invalid(
                            format!("Missing required parameter: '{path}.output'."),
                            Some(format!("{path}.output")),
                        ));
                    }
                };
                let id = item
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| ids.next("fco"));
                messages.push(Message {
                    role: Role::Tool,
                    content: Some(Content::Text(output)),
                    name: None,
                    tool_calls: Vec::new(),
                    tool_call_id: Some(call_id.clone()),
                    cache_control: None,
                    thinking_blocks: Vec::new(),
                });
                stored.push(json!({"id": id, "type": "function_call_output",
                    "status": "completed", "call_id": call_id, "output": item["output"]}));
            }
            // Reasoning is model- and provider-specific: kept in the stored input items; an
            // encrypted one also rides on the next assistant turn (for Responses-API targets).
            "reasoning" => {
                if let Some(enc) = item.get("encrypted_content").and_then(Value::as_str)
                    && !enc.is_empty()
                {
                    reasoning.push(ThinkingBlock::Reasoning {
                        id: item.get("id").and_then(Value::as_str).map(str::to_owned),
                        encrypted_content: enc.to_owned(),
                        summary: item
                            .get("summary")
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default(),
                    });
                }
                let mut r = item.clone();
                if r.get("id").and_then(Value::as_str).is_none() {
                    r["id"] = json!(ids.next("rs"));
                }
                if r.get("summary").is_none() {
                    r["summary"] = json!([]);
                }
                stored.push(r);
            }
            other => {
                return Err(ApiError::invalid(
                    format!(
                        "Input items of type '{other}' are not supported by Switchyard: use \
                         message, function_call, function_call_output or reasoning items."
                    ),
                    Some(format!("{path}.type")),
                ));
            }
        }
    }
    Ok((messages, stored))
}

fn message_item(item: &Value, path: &str, ids: &mut IdGen) -> Result<(Message, Value), ApiError> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("system") => Role::System,
        Some("developer") => Role::Developer,
        _ => {
            return Err(ApiError::invalid(
                format!(
                    "Invalid value for '{path}.role': expected one of 'user', 'assistant', \
                     'system' or 'developer'."
                ),
                Some(format!("{path}.role")),
            ));
        }
    };
    let id = item
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| ids.next("msg"));
    let text_type = if role == Role::Assistant {
        "output_text"
    } else {
        "input_text"
    };
    let (content, stored_parts) = match item.get("content") {
        Some(Value::String(s)) => {
            let part = if role == Role::Assistant {
                json!({"type": "output_text", "text": s, "annotations": []})
            } else {
                json!({"type": text_type, "text": s})
            };
            (Content::Text(s.clone()), vec![part])
        }
        Some(Value::Array(parts)) => {
            let mut out = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let ppath = format!("{path}.content[{j}]");
                let kind = p.get("type").and_then(Value::as_str).unwrap_or_default();
                match kind {
                    "input_text" | "output_text" | "text" => {
                        let text = str_field(p, "text", &ppath)?;
                        out.push(ContentPart::Text { text: text.into() });
                    }
                    "refusal" => {
                        let text = str_field(p, "refusal", &ppath)?;
                        out.push(ContentPart::Text { text: text.into() });
                    }
                    "input_image" => {
                        let Some(url) = p.get("image_url").and_then(Value::as_str) else {
                            return Err(ApiError::invalid(
                                "Only `image_url` images are supported by Switchyard \
                                 (no `file_id`).",
                                Some(format!("{ppath}.image_url")),
                            ));
                        };
                        input::image_url(url).map_err(|e| {
                            ApiError::invalid_field(format!("{ppath}.image_url"), e)
                        })?;
                        out.push(ContentPart::ImageUrl {
                            image_url: ImageUrl {
                                url: url.into(),
                                detail: p.get("detail").and_then(Value::as_str).map(str::to_owned),
                            },
                        });
                    }
                    "input_file" => {
                        let filename = p.get("filename").and_then(Value::as_str).map(str::to_owned);
                        let file = if let Some(id) = p
                            .get("file_id")
                            .and_then(Value::as_str)
                            .filter(|id| !id.trim().is_empty())
                        {
                            FilePart {
                                file_id: Some(id.into()),
                                filename,
                                file_data: String::new(),
                                file_url: None,
                            }
                        } else if let Some(url) = p.get("file_url").and_then(Value::as_str) {
                            input::image_url(url).map_err(|e| {
                                ApiError::invalid_field(format!("{ppath}.file_url"), e)
                            })?;
                            FilePart {
                                file_id: None,
                                filename,
                                file_data: String::new(),
                                file_url: Some(url.into()),
                            }
                        } else {
                            let Some(data) = p.get("file_data").and_then(Value::as_str) else {
                                return Err(ApiError::invalid(
                                    "An `input_file` needs `file_data`, `file_url` or `file_id`.",
                                    Some(format!("{ppath}.file_data")),
                                ));
                            };
                            input::file_data(data).map_err(|e| {
                                ApiError::invalid_field(format!("{ppath}.file_data"), e)
                            })?;
                            FilePart {
                                file_id: None,
                                filename,
                                file_data: data.into(),
                                file_url: None,
                            }
                        };
                        out.push(ContentPart::File { file });
                    }
                    other => {
                        return Err(ApiError::invalid(
                            format!(
                                "Content parts of type '{other}' are not supported by \
                                 Switchyard: use input_text, input_image, input_file or output_text."
                            ),
                            Some(format!("{ppath}.type")),
                        ));
                    }
                }
            }
            // One text part travels as a plain string: every provider takes that.
            let content = match out.as_slice() {
                [ContentPart::Text { text }] => Content::Text(text.clone()),
                _ if out.iter().all(|p| matches!(p, ContentPart::Text { .. })) => {
                    Content::Text(Content::Parts(out).text())
                }
                _ => Content::Parts(out),
            };
            (content, parts.clone())
        }
        _ => {
            return Err(ApiError::invalid(
                format!("Missing required parameter: '{path}.content'."),
                Some(format!("{path}.content")),
            ));
        }
    };
    let stored = json!({"id": id, "type": "message", "role": item["role"],
        "status": "completed", "content": stored_parts});
    Ok((
        Message {
            role,
            content: Some(content),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            cache_control: None,
            thinking_blocks: Vec::new(),
        },
        stored,
    ))
}

fn tool(path: &str, t: &Value) -> Result<Tool, ApiError> {
    let kind = t.get("type").and_then(Value::as_str).unwrap_or_default();
    if kind != "function" {
        let base = HOSTED_TOOLS
            .iter()
            .any(|h| kind == *h || kind.starts_with(&format!("{h}_")));
        let msg = if base {
            format!(
                "The hosted tool type '{kind}' is not supported by Switchyard: only function \
                 tools (\"type\": \"function\") can be served by every provider."
            )
        } else {
            format!("Invalid value for '{path}.type': '{kind}'. Switchyard serves function tools.")
        };
        return Err(ApiError::invalid(msg, Some(format!("{path}.type"))));
    }
    let name = str_field(t, "name", path)?.to_owned();
    input::tool_name(&name).map_err(|e| ApiError::invalid_field(format!("{path}.name"), e))?;
    let parameters = t.get("parameters").filter(|p| !p.is_null()).cloned();
    input::tool_parameters(parameters.as_ref())
        .map_err(|e| ApiError::invalid_field(format!("{path}.parameters"), e))?;
    Ok(Tool {
        kind: "function".into(),
        function: FunctionDef {
            name,
            description: t
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned),
            parameters,
            strict: t.get("strict").and_then(Value::as_bool),
        },
    })
}

fn tool_choice(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => Ok(c.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o.get("name").and_then(Value::as_str) {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(invalid(
                    "Missing required parameter: 'tool_choice.name'.",
                    "tool_choice.name",
                )),
            }
        }
        _ => Err(invalid(
            "Switchyard supports `tool_choice` \"auto\", \"none\", \"required\" or \
             {\"type\": \"function\", \"name\": …}.",
            "tool_choice",
        )),
    }
}

/// `text.format` → (normalised `response_format`, the echoed format).
fn text_format(f: Option<&Value>) -> Result<(Option<Value>, Value), ApiError> {
    let Some(f) = f.filter(|f| !f.is_null()) else {
        return Ok((None, json!({"type": "text"})));
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok((None, json!({"type": "text"}))),
        Some("json_object") => Ok((Some(json!({"type": "json_object"})), f.clone())),
        Some("json_schema") => {
            let name = str_field(f, "name", "text.format")?;
            let Some(schema) = f.get("schema").filter(|s| s.is_object()) else {
                return Err(invalid(
                    "Missing required parameter: 'text.format.schema'.",
                    "text.format.schema",
                ));
            };
            let mut js = json!({"name": name, "schema": schema});
            for k in ["description", "strict"] {
                if let Some(v) = f.get(k).filter(|v| !v.is_null()) {
                    js[k] = v.clone();
                }
            }
            Ok((
                Some(json!({"type": "json_schema", "json_schema": js})),
                f.clone(),
            ))
        }
        _ => Err(invalid(
            "Invalid value for 'text.format.type': expected 'text', 'json_object' or \
             'json_schema'.",
            "text.format.type",
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse_json(v: Value) -> Result<ParsedResponses, ApiError> {
        parse(v.to_string().as_bytes(), "abc")
    }

    #[test]
    fn items_become_one_turn_per_role() {
        let p = parse_json(json!({"model": "m", "instructions": "Be brief.", "input": [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Look"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
            {"type": "message", "role": "assistant", "id": "msg_9", "status": "completed",
                "content": [{"type": "output_text", "text": "Calling", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"a\":1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]}
        ], "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": false}],
            "tool_choice": {"type": "function", "name": "w"},
            "text": {"format": {"type": "json_object"}}, "max_output_tokens": 9}))
        .unwrap();
        let msgs = serde_json::to_value(p.conversation(&[])).unwrap();
        assert_eq!(
            msgs,
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": "Use tools."},
                {"role": "user", "content": [{"type": "text", "text": "Look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}]},
                {"role": "assistant", "content": "Calling", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "w", "arguments": "{\"a\":1}"}}],
                    // The encrypted reasoning item rides on the turn it led to.
                    "thinking_blocks": [{"type": "reasoning", "id": "rs_1", "encrypted_content": "xyz", "summary": []}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
                {"role": "tool", "content": "rain", "tool_call_id": "c2"}
            ])
        );
        let ids: Vec<&str> = p
            .input_items
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            [
                "msg_abc0001",
                "msg_abc0002",
                "rs_1",
                "msg_9",
                "fc_1",
                "fc_abc0003",
                "fco_abc0004",
                "fco_abc0005"
            ]
        );
        assert_eq!(
            p.tool_choice,
            Some(json!({"type": "function", "function": {"name": "w"}}))
        );
        assert_eq!(
            p.params.response_format,
            Some(json!({"type": "json_object"}))
        );
        assert_eq!(p.params.max_tokens, Some(9));
        assert_eq!(p.tools[0].function.strict, Some(false));
        assert_eq!(p.echo["tools"][0]["strict"], json!(false));
        assert!(p.store && !p.stream);
    }

    #[test]
    fn namespace_tools_are_flattened_and_codex_fields_accepted() {
        let p = parse_json(
            json!({"model": "m", "input": "x", "client_metadata": {"turn_id": "t"},
            "include": ["reasoning.encrypted_content"], "store": false,
            "tools": [{"type": "function", "name": "exec_command", "parameters": {}},
                {"type": "namespace", "name": "multi_agent_v1", "description": "d",
                    "tools": [{"type": "function", "name": "close_agent", "strict": false}]}]}),
        )
        .unwrap();
        let names: Vec<&str> = p.tools.iter().map(|t| t.function.name.as_str()).collect();
        assert_eq!(names, ["exec_command", "close_agent"]);
        assert_eq!(
            p.namespaces.get("close_agent").map(String::as_str),
            Some("multi_agent_v1")
        );
        assert_eq!(p.echo["tools"][1]["type"], "namespace");
        let e = parse_json(
            json!({"model": "m", "input": "x", "tools": [{"type": "namespace",
            "name": "n", "tools": [{"type": "web_search"}]}]}),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].tools[0].type"));
    }

    #[test]
    fn continuation_goes_between_instructions_and_input() {
        let p = parse_json(json!({"model": "m", "instructions": "New rules.",
            "previous_response_id": "resp_1"}))
        .unwrap();
        let history = [
            text_message(Role::User, "a".into()),
            text_message(Role::Assistant, "b".into()),
        ];
        let roles: Vec<Role> = p.conversation(&history).iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant]);
        assert_eq!(p.previous_response_id.as_deref(), Some("resp_1"));
    }

    #[test]
    fn rejections_name_the_parameter() {
        let param = |v: Value| parse_json(v).unwrap_err().param.unwrap_or_default();
        assert_eq!(param(json!({"model": "m"})), "input");
        assert_eq!(param(json!({"model": "m", "input": 3})), "input");
        assert_eq!(
            param(json!({"model": "m", "input": "x", "tools": [{"type": "file_search"}]})),
            "tools[0].type"
        );
        assert_eq!(
            param(
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "filename": "a.pdf"}]}]})
            ),
            "input[0].content[0].file_data"
        );
        assert_eq!(
            param(json!({"model": "m", "input": "x", "tool_choice": {"type": "web_search"}})),
            "tool_choice"
        );
        assert_eq!(
            param(
                json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}})
            ),
            "text.format.schema"
        );
        assert_eq!(
            param(json!({"model": "m", "input": "x", "background": true})),
            "background"
        );
        let e = parse_json(json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}))
            .unwrap_err();
        assert!(e.message.contains("'web_search'"), "{}", e.message);
    }
}
