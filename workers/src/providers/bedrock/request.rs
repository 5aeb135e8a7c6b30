//! Normalised request → Bedrock Converse request body: the typed wire shapes (Amazon Bedrock
//! API Reference, "Converse" → Request Syntax and its data types `Message`, `ContentBlock`,
//! `SystemContentBlock`, `InferenceConfiguration`, `ToolConfiguration`,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html>) and
//! [`build_request`].
//!
//! Converse's unions (`ContentBlock`, `ImageSource`, `ToolResultContentBlock`, `Tool`,
//! `ToolInputSchema`, `ToolChoice`, `SystemContentBlock`) are JSON objects with exactly one
//! member, named after the union member (`{"text":…}`, `{"toolUse":{…}}`): serde's externally
//! tagged enums, with no `type` tag. What stays `serde_json::Value` is the client's own JSON:
//! tool input schemas, tool-call input and JSON tool results.

use serde::Serialize;
use serde_json::Value;
use switchyard_schemas::request::{Content, FilePart, Message, Role, ToolCall};
use switchyard_schemas::{ChatRequest, ErrorInfo};

use super::empty_input_schema;
use crate::providers::shared::{
    PartCodec, Turn, bad_message, invalid, one_choice, push_turn, to_json, tool_call_input,
};

/// A Converse request body ("Converse" → Request Syntax; the model id goes in the URL).
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ConverseRequest<'a> {
    messages: Vec<Turn<ContentBlock>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<SystemContentBlock>,
    /// Left out when no parameter is set.
    #[serde(skip_serializing_if = "InferenceConfig::is_empty")]
    inference_config: InferenceConfig<'a>,
    tool_config: Option<ToolConfig>,
}

/// `SystemContentBlock` (union): only its `text` member is sent.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum SystemContentBlock {
    Text(String),
}

/// `InferenceConfiguration`: only the parameters given.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct InferenceConfig<'a> {
    max_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
}

impl InferenceConfig<'_> {
    fn is_empty(&self) -> bool {
        self.max_tokens.is_none()
            && self.temperature.is_none()
            && self.top_p.is_none()
            && self.stop_sequences.is_empty()
    }
}

/// `ContentBlock` (union): the members Switchyard sends.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum ContentBlock {
    /// `{"text"}`: never empty (Bedrock rejects blank text blocks).
    Text(String),
    /// `{"image":{"format","source"}}` (`ImageBlock`).
    Image(ImageBlock),
    /// `{"document":{"format","name","source"}}` (`DocumentBlock`).
    Document(DocumentBlock),
    /// `{"toolUse":{"toolUseId","name","input"}}` (`ToolUseBlock`).
    ToolUse(ToolUseBlock),
    /// `{"toolResult":{"toolUseId","content"}}` (`ToolResultBlock`; `status` is not sent).
    ToolResult(ToolResultBlock),
}

/// `ImageBlock`: `format` is `png | jpeg | gif | webp`.
#[derive(Debug, Serialize)]
struct ImageBlock {
    format: &'static str,
    source: BytesSource,
}

/// `DocumentBlock`: `format` `pdf` here, `name` required (see [`document_block`]).
#[derive(Debug, Serialize)]
struct DocumentBlock {
    format: &'static str,
    name: String,
    source: BytesSource,
}

/// `ImageSource` / `DocumentSource` (unions): the `bytes` member, base64 in the JSON protocol.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum BytesSource {
    Bytes(String),
}

/// `ToolUseBlock`: `input` is the parsed arguments object.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolUseBlock {
    tool_use_id: String,
    name: String,
    input: Value,
}

/// `ToolResultBlock`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolResultBlock {
    tool_use_id: String,
    content: Vec<ToolResultContent>,
}

/// `ToolResultContentBlock` (union): `json` (an object) or `text`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum ToolResultContent {
    Json(Value),
    Text(String),
}

/// `ToolConfiguration`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig {
    tools: Vec<Tool>,
    /// Absent means `auto`, Bedrock's default.
    tool_choice: Option<ToolChoice>,
}

/// `Tool` (union): its `toolSpec` member.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum Tool {
    ToolSpec(ToolSpec),
}

/// `ToolSpecification`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolSpec {
    name: String,
    description: Option<String>,
    input_schema: ToolInputSchema,
}

/// `ToolInputSchema` (union): the `json` member, a JSON Schema as the client gave it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum ToolInputSchema {
    Json(Value),
}

/// `ToolChoice` (union): `{"any":{}}` or `{"tool":{"name"}}` (`auto` is never sent).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum ToolChoice {
    Any(AnyToolChoice),
    Tool(SpecificToolChoice),
}

/// `AnyToolChoice`: no members (`{}`).
#[derive(Debug, Serialize)]
struct AnyToolChoice {}

/// `SpecificToolChoice`.
#[derive(Debug, Serialize)]
struct SpecificToolChoice {
    name: String,
}

/// Translates a normalised request into a Converse request body (the model goes in the URL).
///
/// Mapping (Amazon Bedrock API Reference, "Converse" and its data types):
/// * `system` / `developer` messages → `system: [{text}]`, one block per message.
/// * `user` / `assistant` → `messages[{role, content}]`; text → `{text}` (empty text skipped, as
///   Bedrock rejects blank text blocks); `data:` image URLs → `{image: {format, source: {bytes}}}`
///   with `format` `png` / `jpeg` / `gif` / `webp` from the media type and the base64 data as is
///   (blobs are base64 in the JSON protocol). `http(s)` image URLs are rejected: Converse takes
///   image bytes or an S3 location, never a web URL.
/// * assistant `tool_calls` → `{toolUse: {toolUseId, name, input}}` (`input` = the parsed
///   arguments object).
/// * `tool` messages → `{toolResult: {toolUseId, content: [{json}]}}` when the result is a JSON
///   object, else `[{text}]`, in a `user` message. Consecutive messages of one role are merged
///   (Converse requires alternating roles); `status` is not sent (OpenAI results carry none).
/// * `inferenceConfig` gets `maxTokens`, `temperature`, `topP`, `stopSequences` (only those
///   given; no `inferenceConfig` at all when none is).
/// * `tools` → `toolConfig.tools[{toolSpec: {name, description, inputSchema: {json}}}]` (schema
///   default [`empty_input_schema`]). `tool_choice`: `required` → `{any: {}}`, a named function
///   → `{tool: {name}}`, `auto` or absent → no `toolChoice` (auto is Bedrock's default, and only
///   some models accept the field at all); `none` has no Converse equivalent, so the tools are
///   left out (the model cannot call what it was not given) — unless the history holds tool
///   calls or results, which Bedrock only accepts with a `toolConfig`: then it is a 400 naming
///   `tool_choice`.
/// * `user` and `parallel_tool_calls` have no Converse equivalent and are not sent.
///
/// Errors (class `invalid_request`, with `param`): `n` > 1; a `response_format` other than
/// `text`; `seed`; a non-zero `presence_penalty` / `frequency_penalty` (0 is the no-op default
/// and accepted); an unknown `tool_choice`; http(s) or unsupported images; unparsable or
/// non-object tool arguments; a tool message without `tool_call_id`; no user or assistant message.
pub fn build_request(req: &ChatRequest) -> Result<Value, ErrorInfo> {
    let p = &req.params;
    one_choice(p.n, "Bedrock Converse")?;
    if let Some(rf) = &p.response_format {
        let kind = rf.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "text" {
            return Err(invalid(
                "response_format",
                format!("response_format `{kind}` is not supported by the Bedrock adapter"),
            ));
        }
    }
    if p.seed.is_some() {
        return Err(invalid("seed", "seed is not supported by Bedrock Converse"));
    }
    for (name, value) in [
        ("presence_penalty", p.presence_penalty),
        ("frequency_penalty", p.frequency_penalty),
    ] {
        if value.is_some_and(|v| v != 0.0) {
            return Err(invalid(
                name,
                format!("{name} is not supported by Bedrock Converse"),
            ));
        }
    }
    let mut system: Vec<SystemContentBlock> = Vec::new();
    let mut turns: Vec<Turn<ContentBlock>> = Vec::new();
    let mut tool_history = false;
    for (i, m) in req.messages.iter().enumerate() {
        match m.role {
            Role::System | Role::Developer => {
                let text = m.content.as_ref().map(Content::text).unwrap_or_default();
                if !text.is_empty() {
                    system.push(SystemContentBlock::Text(text));
                }
            }
            Role::User => push_turn(&mut turns, "user", PARTS.blocks(m.content.as_ref(), i)?),
            Role::Assistant => {
                let mut blocks = PARTS.blocks(m.content.as_ref(), i)?;
                for call in &m.tool_calls {
                    blocks.push(tool_use_block(call, i)?);
                    tool_history = true;
                }
                push_turn(&mut turns, "assistant", blocks);
            }
            Role::Tool => {
                push_turn(&mut turns, "user", vec![tool_result_block(m, i)?]);
                tool_history = true;
            }
        }
    }
    if turns.is_empty() {
        return Err(invalid(
            "messages",
            "Bedrock Converse needs at least one user or assistant message",
        ));
    }
    let body = ConverseRequest {
        messages: turns,
        system,
        inference_config: InferenceConfig {
            max_tokens: p.max_tokens,
            temperature: p.temperature,
            top_p: p.top_p,
            stop_sequences: &p.stop,
        },
        tool_config: tool_config(req, tool_history)?,
    };
    to_json(&body)
}

/// `toolConfig` for the request's tools and `tool_choice` (see [`build_request`]).
fn tool_config(req: &ChatRequest, tool_history: bool) -> Result<Option<ToolConfig>, ErrorInfo> {
    if req.tools.is_empty() {
        return Ok(None);
    }
    let bad = || {
        invalid(
            "tool_choice",
            "tool_choice must be auto, none, required or a named function",
        )
    };
    let choice = match &req.tool_choice {
        None => None,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => None,
            "required" => Some(ToolChoice::Any(AnyToolChoice {})),
            "none" if tool_history => {
                return Err(invalid(
                    "tool_choice",
                    "tool_choice `none` cannot be honoured by Bedrock Converse when the \
                     conversation contains tool calls (Converse has no `none` choice and needs \
                     the tools to accept the history); use `auto`",
                ));
            }
            "none" => return Ok(None),
            _ => return Err(bad()),
        },
        Some(v @ Value::Object(_)) => {
            let name = v.pointer("/function/name").and_then(Value::as_str);
            let name = name.ok_or_else(bad)?.to_owned();
            Some(ToolChoice::Tool(SpecificToolChoice { name }))
        }
        Some(_) => return Err(bad()),
    };
    let tools = req
        .tools
        .iter()
        .map(|t| {
            let f = &t.function;
            let schema = f.parameters.clone().unwrap_or_else(empty_input_schema);
            Tool::ToolSpec(ToolSpec {
                name: f.name.clone(),
                description: f.description.clone(),
                input_schema: ToolInputSchema::Json(schema),
            })
        })
        .collect();
    Ok(Some(ToolConfig {
        tools,
        tool_choice: choice,
    }))
}

/// Converse content blocks: `{"text"}`, `image` and `document`.
const PARTS: PartCodec<ContentBlock> = PartCodec {
    text: |t| ContentBlock::Text(t.to_owned()),
    image: image_block,
    file: document_block,
};

/// `data:image/<type>;base64,<data>` → `{"image":{"format","source":{"bytes"}}}` (Amazon Bedrock
/// API Reference, "ImageBlock": formats `png | jpeg | gif | webp`).
/// An inline PDF → `{"document":{"format":"pdf","name","source":{"bytes"}}}` (Bedrock Converse
/// API, `DocumentBlock`: `name` is required and may hold only alphanumerics, whitespace, hyphens,
/// parentheses and square brackets — other characters of the file name become spaces; default
/// `document`).
fn document_block(file: &FilePart, i: usize) -> Result<ContentBlock, ErrorInfo> {
    if file.file_url.is_some() || file.file_id.is_some() {
        return Err(bad_message(
            i,
            "Bedrock Converse takes documents inline (base64 bytes), not by URL or file_id",
        ));
    }
    let d = switchyard_schemas::input::parse_data_url(&file.file_data)
        .ok_or_else(|| bad_message(i, "file data must be data:<media type>;base64,<data>"))?;
    if !d.media_type.eq_ignore_ascii_case("application/pdf") {
        return Err(bad_message(i, "Bedrock documents must be PDFs here"));
    }
    let name: String = file
        .filename
        .as_deref()
        .unwrap_or("document")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " -()[]".contains(c) {
                c
            } else {
                ' '
            }
        })
        .take(200)
        .collect();
    let name = match name.trim() {
        "" => "document".to_owned(),
        n => n.to_owned(),
    };
    Ok(ContentBlock::Document(DocumentBlock {
        format: "pdf",
        name,
        source: BytesSource::Bytes(d.data.to_owned()),
    }))
}

fn image_block(url: &str, i: usize) -> Result<ContentBlock, ErrorInfo> {
    if !switchyard_schemas::input::is_data_url(url) {
        let what = if url.starts_with("http://") || url.starts_with("https://") {
            "image URLs must be data: URLs for Bedrock (Converse takes image bytes, not web URLs)"
        } else {
            "image URLs must be data:<media type>;base64,<data> URLs"
        };
        return Err(bad_message(i, what));
    }
    let Some(switchyard_schemas::input::DataUrl {
        media_type: mime,
        data,
    }) = switchyard_schemas::input::parse_data_url(url)
    else {
        return Err(bad_message(
            i,
            "image data URLs must be data:<media type>;base64,<data>",
        ));
    };
    use switchyard_schemas::input::ImageFormat;
    let format = match ImageFormat::from_media_type(mime) {
        Some(ImageFormat::Png) => "png",
        Some(ImageFormat::Jpeg) => "jpeg",
        Some(ImageFormat::Gif) => "gif",
        Some(ImageFormat::Webp) => "webp",
        None => {
            return Err(bad_message(
                i,
                format!(
                    "image type `{}` is not supported by Bedrock (png, jpeg, gif, webp)",
                    mime.to_ascii_lowercase()
                ),
            ));
        }
    };
    Ok(ContentBlock::Image(ImageBlock {
        format,
        source: BytesSource::Bytes(data.to_owned()),
    }))
}

/// An assistant tool call → `{"toolUse":{"toolUseId","name","input"}}`.
fn tool_use_block(call: &ToolCall, i: usize) -> Result<ContentBlock, ErrorInfo> {
    Ok(ContentBlock::ToolUse(ToolUseBlock {
        tool_use_id: call.id.clone(),
        name: call.function.name.clone(),
        input: tool_call_input(call, i)?,
    }))
}

/// A `role: tool` message → `{"toolResult":{"toolUseId","content":[{json}|{text}]}}`.
fn tool_result_block(m: &Message, i: usize) -> Result<ContentBlock, ErrorInfo> {
    let id = m.tool_call_id.as_deref().filter(|id| !id.is_empty());
    let id = id.ok_or_else(|| bad_message(i, "role `tool` needs tool_call_id"))?;
    let text = m.content.as_ref().map(Content::text).unwrap_or_default();
    let block = match serde_json::from_str::<Value>(&text) {
        Ok(v @ Value::Object(_)) => ToolResultContent::Json(v),
        _ => ToolResultContent::Text(text),
    };
    Ok(ContentBlock::ToolResult(ToolResultBlock {
        tool_use_id: id.to_owned(),
        content: vec![block],
    }))
}
