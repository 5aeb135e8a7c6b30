//! Normalised request → Gemini `GenerateContentRequest` body: the typed wire shapes (Gemini API
//! reference, "Generating content" → request body, and "Caching"/"Content" → `Content`, `Part`,
//! `Blob`, `FileData`, `FunctionCall`, `FunctionResponse`, `Tool`, `ToolConfig`,
//! `GenerationConfig`, <https://ai.google.dev/api/generate-content>) and [`build_request`].
//!
//! A `Part` holds exactly one `data` member named after its kind (`{"text":…}`,
//! `{"inlineData":{…}}`), beside optional fields such as `thoughtSignature`: a flattened,
//! externally tagged enum. What stays `serde_json::Value` is the client's JSON: parameter
//! schemas, call arguments and function responses.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;
use switchyard_schemas::request::{Content, FilePart, Message, Role, ToolCall};
use switchyard_schemas::{ChatRequest, ErrorInfo};

use super::{DEFAULT_IMAGE_MIME, THOUGHT_SIGNATURE_SKIP};
use crate::providers::shared::{
    JSON_INSTRUCTION, JSON_TOOL, PartCodec, bad_message, invalid, json_tool_unclaimed, one_choice,
    to_json, tool_call_input,
};

/// A `GenerateContentRequest` body (the model goes in the URL); unset parts are left out.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateContentRequest<'a> {
    contents: Vec<Turn>,
    system_instruction: Option<SystemInstruction>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool>,
    tool_config: Option<ToolConfig>,
    #[serde(skip_serializing_if = "GenerationConfig::is_empty")]
    generation_config: GenerationConfig<'a>,
}

/// One `Content` of `contents[]`: role (`user` or `model`) and parts; `tool_results` (not sent)
/// marks a turn of function responses, which is never merged with ordinary user text.
#[derive(Debug, Serialize)]
struct Turn {
    role: &'static str,
    #[serde(skip)]
    tool_results: bool,
    parts: Vec<Part>,
}

/// `systemInstruction`: a `Content` without a role.
#[derive(Debug, Serialize)]
struct SystemInstruction {
    parts: Vec<Part>,
}

/// A `Part`: one `data` member, and `thoughtSignature` on a replayed function call.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    #[serde(flatten)]
    data: PartData,
    thought_signature: Option<&'static str>,
}

/// `Part.data` (union): the members Switchyard sends.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum PartData {
    /// `{"text"}`, never empty.
    Text(String),
    /// `{"inlineData":{"mimeType","data"}}` (`Blob`, base64 data).
    InlineData(Blob),
    /// `{"fileData":{"mimeType","fileUri"}}` (`FileData`).
    FileData(FileData),
    /// `{"functionCall":{"name","args"}}`.
    FunctionCall(FunctionCall),
    /// `{"functionResponse":{"name","response"}}`.
    FunctionResponse(FunctionResponse),
}

/// `Blob`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Blob {
    mime_type: String,
    data: String,
}

/// `FileData`: `mimeType` is required.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct FileData {
    mime_type: &'static str,
    file_uri: String,
}

/// `FunctionCall`: `args` is the parsed arguments object.
#[derive(Debug, Serialize)]
struct FunctionCall {
    name: String,
    args: Value,
}

/// `FunctionResponse`: `response` is a JSON object.
#[derive(Debug, Serialize)]
struct FunctionResponse {
    name: String,
    response: Value,
}

impl From<PartData> for Part {
    fn from(data: PartData) -> Self {
        Part {
            data,
            thought_signature: None,
        }
    }
}

impl Part {
    fn text(text: &str) -> Self {
        PartData::Text(text.to_owned()).into()
    }
}

/// A `Tool`: only `functionDeclarations` is sent.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Tool {
    function_declarations: Vec<FunctionDeclaration>,
}

/// `FunctionDeclaration`: `parametersJsonSchema` takes plain JSON Schema (where `parameters`
/// takes only Google's OpenAPI subset).
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct FunctionDeclaration {
    name: String,
    description: Option<String>,
    parameters_json_schema: Option<Value>,
}

/// `ToolConfig`: only `functionCallingConfig` is sent.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig {
    function_calling_config: FunctionCallingConfig,
}

/// `FunctionCallingConfig`: `allowedFunctionNames` only with `ANY`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct FunctionCallingConfig {
    mode: Mode,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allowed_function_names: Vec<String>,
}

/// `FunctionCallingConfig.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Mode {
    Auto,
    Any,
    None,
}

impl ToolConfig {
    fn new(mode: Mode, allowed_function_names: Vec<String>) -> Self {
        ToolConfig {
            function_calling_config: FunctionCallingConfig {
                mode,
                allowed_function_names,
            },
        }
    }
}

/// `GenerationConfig`: only the parameters given.
#[serde_with::skip_serializing_none]
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig<'a> {
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u32>,
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
    candidate_count: Option<u32>,
    seed: Option<i64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    /// `application/json` for a JSON `response_format` (without user tools).
    response_mime_type: Option<&'static str>,
    /// [`gemini_schema`] of a `json_schema` `response_format`.
    response_json_schema: Option<Value>,
}

impl GenerationConfig<'_> {
    fn is_empty(&self) -> bool {
        self.temperature.is_none()
            && self.top_p.is_none()
            && self.top_k.is_none()
            && self.max_output_tokens.is_none()
            && self.stop_sequences.is_empty()
            && self.candidate_count.is_none()
            && self.seed.is_none()
            && self.presence_penalty.is_none()
            && self.frequency_penalty.is_none()
            && self.response_mime_type.is_none()
            && self.response_json_schema.is_none()
    }
}

/// Translates a normalised request into a Gemini `GenerateContentRequest` body (the model goes in
/// the URL).
///
/// Mapping (Gemini API reference, "Generating content" and the "Function calling" guide):
/// `system`/`developer` → `systemInstruction.parts[]`; `user` → role `user`, `assistant` → role
/// `model`; text parts → `{text}`, `data:` image URLs → `inlineData{mimeType,data}`, `http(s)` image
/// URLs → `fileData{mimeType (from the extension, default [`DEFAULT_IMAGE_MIME`]),fileUri}`;
/// assistant `tool_calls` → `functionCall{name,args}` parts (the first with
/// [`THOUGHT_SIGNATURE_SKIP`]); `tool` messages → `functionResponse{name,response}` parts in a
/// `user` turn, the name looked up from the earlier call's id, `response` the result when it is a
/// JSON object, else `{"output": <text>}`; consecutive tool results share one turn (Gemini wants
/// as many responses as the model turn had calls), and consecutive turns of one kind are merged;
/// `tools` → `tools[{functionDeclarations[{name,description,parametersJsonSchema}]}]`
/// (`parametersJsonSchema` takes plain JSON Schema, where `parameters` takes only Google's
/// OpenAPI subset); `tool_choice` → `toolConfig.functionCallingConfig.mode` `AUTO`/`NONE`/`ANY`
/// (+ `allowedFunctionNames` for a named function); `generationConfig` gets `temperature`,
/// `topP`, `topK` (Anthropic door's `top_k`), `maxOutputTokens`, `stopSequences`, `candidateCount`, `seed`, `presencePenalty`,
/// `frequencyPenalty`, and for `response_format` `json_object` → `responseMimeType:
/// application/json`, `json_schema` → also `responseJsonSchema`, translated by [`gemini_schema`]; the JSON comes
/// back as the text content. With user tools a JSON `response_format` is the synthetic
/// [`JSON_TOOL`] function instead (see [`json_tool`]; Gemini 2.x rejects JSON mode with tools).
/// `user` and `parallel_tool_calls` have no Gemini equivalent and are not sent; neither are
/// `reasoning_effort` (whether the model thinks is its own setting), `logprobs` and the
/// provider passthrough fields, nor thinking blocks and `cache_control` of earlier turns. Errors (class
/// `invalid_request`, with `param`): `n` > 1 (one choice only), unknown `response_format` or
/// `tool_choice`, unparsable tool arguments, unsupported image URLs, a tool result whose call is
/// unknown, no non-system message.
pub fn build_request(req: &ChatRequest) -> Result<Value, ErrorInfo> {
    let p = &req.params;
    one_choice(p.n, "the Gemini adapter")?;
    let mut system: Vec<Part> = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    let mut call_names: HashMap<&str, &str> = HashMap::new();
    for (i, m) in req.messages.iter().enumerate() {
        match m.role {
            Role::System | Role::Developer => {
                let text = m.content.as_ref().map(Content::text).unwrap_or_default();
                if !text.is_empty() {
                    system.push(Part::text(&text));
                }
            }
            Role::User => push_turn(
                &mut turns,
                "user",
                false,
                PARTS.blocks(m.content.as_ref(), i)?,
            ),
            Role::Assistant => {
                let mut out = PARTS.blocks(m.content.as_ref(), i)?;
                for (j, call) in m.tool_calls.iter().enumerate() {
                    out.push(function_call_part(call, j == 0, i)?);
                    call_names.insert(&call.id, &call.function.name);
                }
                push_turn(&mut turns, "model", false, out);
            }
            Role::Tool => {
                let part = function_response_part(m, &call_names, i)?;
                push_turn(&mut turns, "user", true, vec![part]);
            }
        }
    }
    if turns.is_empty() {
        return Err(invalid(
            "messages",
            "Gemini needs at least one user or assistant message",
        ));
    }
    let json_tool = json_tool(req)?;
    let structured = json_tool.is_some();
    let (mut tools, mut tool_config) = (Vec::new(), None);
    if !req.tools.is_empty() {
        let declarations = req.tools.iter().map(|t| FunctionDeclaration {
            name: t.function.name.clone(),
            description: t.function.description.clone(),
            parameters_json_schema: t.function.parameters.clone(),
        });
        let function_declarations = declarations.chain(json_tool).collect();
        tools.push(Tool {
            function_declarations,
        });
        tool_config = choice_config(req.tool_choice.as_ref())?;
        if structured {
            let (json_config, instruct) = json_tool_config(tool_config);
            tool_config = Some(json_config);
            if instruct {
                system.push(Part::text(JSON_INSTRUCTION));
            }
        }
    }
    let mut generation_config = GenerationConfig {
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k,
        max_output_tokens: p.max_tokens,
        stop_sequences: &p.stop,
        candidate_count: p.n,
        seed: p.seed,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        ..GenerationConfig::default()
    };
    if let (Some(rf), false) = (&p.response_format, structured) {
        response_format(rf, &mut generation_config)?;
    }
    let body = GenerateContentRequest {
        contents: turns,
        system_instruction: (!system.is_empty()).then_some(SystemInstruction { parts: system }),
        tools,
        tool_config,
        generation_config,
    };
    to_json(&body)
}

/// With user tools, Gemini 2.x answers 400 "Function calling with a response mime type:
/// 'application/json' is unsupported" (googleapis/python-genai #867), so a JSON
/// `response_format` then becomes the synthetic [`JSON_TOOL`] function instead (as on Anthropic,
/// see `anthropic::structured`): `parametersJsonSchema` = [`gemini_schema`] of the schema
/// (`{"type":"object"}` for `json_object`), and its `functionCall` comes back as the text
/// content. `None` without user tools or without a JSON `response_format`.
pub(super) fn json_tool(req: &ChatRequest) -> Result<Option<FunctionDeclaration>, ErrorInfo> {
    let Some(rf) = req
        .params
        .response_format
        .as_ref()
        .filter(|_| !req.tools.is_empty())
    else {
        return Ok(None);
    };
    let schema =
        match rf.get("type").and_then(Value::as_str).unwrap_or("") {
            "json_object" => serde_json::json!({ "type": "object" }),
            "json_schema" => gemini_schema(rf.pointer("/json_schema/schema").ok_or_else(|| {
                invalid("response_format", "json_schema needs json_schema.schema")
            })?),
            _ => return Ok(None),
        };
    json_tool_unclaimed(req, "with tools")?;
    Ok(Some(FunctionDeclaration {
        name: JSON_TOOL.to_owned(),
        description: Some(
            "Respond with the final answer as a JSON object matching this schema.".to_owned(),
        ),
        parameters_json_schema: Some(schema),
    }))
}

/// `toolConfig` with [`JSON_TOOL`] declared next to user tools, from the translated client
/// choice: unset or `AUTO` stays `AUTO` and needs [`JSON_INSTRUCTION`] (the `bool`); `NONE`
/// becomes `ANY` allowing only [`JSON_TOOL`]; `ANY` (with or without names) is kept.
fn json_tool_config(user: Option<ToolConfig>) -> (ToolConfig, bool) {
    let mode = user.as_ref().map(|c| c.function_calling_config.mode);
    match (mode, user) {
        (Some(Mode::None), _) => (
            ToolConfig::new(Mode::Any, vec![JSON_TOOL.to_owned()]),
            false,
        ),
        (Some(Mode::Any), Some(user)) => (user, false),
        _ => (ToolConfig::new(Mode::Auto, Vec::new()), true),
    }
}

/// OpenAI `response_format` → `generationConfig.responseMimeType` (+ `responseJsonSchema`).
fn response_format(rf: &Value, config: &mut GenerationConfig<'_>) -> Result<(), ErrorInfo> {
    let kind = rf.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => {}
        "json_object" => config.response_mime_type = Some("application/json"),
        "json_schema" => {
            let schema = rf.pointer("/json_schema/schema").ok_or_else(|| {
                invalid("response_format", "json_schema needs json_schema.schema")
            })?;
            config.response_mime_type = Some("application/json");
            config.response_json_schema = Some(gemini_schema(schema));
        }
        other => {
            return Err(invalid(
                "response_format",
                format!("response_format `{other}` is not supported by the Gemini adapter"),
            ));
        }
    }
    Ok(())
}

/// Keywords [`gemini_schema`] strips: not in the JSON Schema subset Gemini's structured output
/// takes (Gemini API docs, "Structured output": `type`, `format`, `title`, `description`,
/// `enum`, `items`, `prefixItems`, `minItems`, `maxItems`, `minimum`, `maximum`, `anyOf`,
/// `oneOf`, `properties`, `required`, `$ref`/`$defs`), or rejected by older models and Vertex
/// AI's `responseSchema` (`additionalProperties`: "Unknown name … Cannot find field", LiteLLM
/// and prism-php reports); `strict` is OpenAI's flag, not JSON Schema.
pub const GEMINI_DROPPED_KEYWORDS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "additionalProperties",
    "unevaluatedProperties",
    "patternProperties",
    "strict",
];

/// An OpenAI JSON schema as Gemini's `responseJsonSchema`: local `$ref`s inlined from
/// `$defs`/`definitions` (recursion cut after a few levels, see
/// [`crate::providers::shared::inline_refs`]), then every [`GEMINI_DROPPED_KEYWORDS`] entry
/// removed at every level (property names are never touched). Without `additionalProperties`
/// Gemini may not add keys the schema lacks; `required` still holds.
pub fn gemini_schema(schema: &Value) -> Value {
    let mut out = schema.clone();
    crate::providers::shared::inline_refs(&mut out);
    crate::providers::shared::walk_schema(&mut out, &mut |o| {
        o.retain(|k, _| !GEMINI_DROPPED_KEYWORDS.contains(&k.as_str()));
    });
    out
}

/// Appends `parts` as a turn, merging into the previous turn when it has the same role and kind
/// (tool results are never merged with ordinary user text). Empty turns are dropped.
fn push_turn(turns: &mut Vec<Turn>, role: &'static str, tool_results: bool, parts: Vec<Part>) {
    if parts.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role && last.tool_results == tool_results => {
            last.parts.extend(parts);
        }
        _ => turns.push(Turn {
            role,
            tool_results,
            parts,
        }),
    }
}

/// Gemini parts: `{"text"}`, `inlineData` / `fileData` for images and documents.
const PARTS: PartCodec<Part> = PartCodec {
    text: Part::text,
    image: image_part,
    file: file_part,
};

/// A document: by URL as `fileData` (Gemini API "Document understanding"), inline as
/// `inlineData` (which takes documents too); another provider's `file_id` cannot be read.
fn file_part(file: &FilePart, i: usize) -> Result<Part, ErrorInfo> {
    if file.file_id.is_some() {
        return Err(bad_message(
            i,
            "Gemini cannot read another provider's file_id: send the document inline or by URL",
        ));
    }
    match &file.file_url {
        Some(url) => Ok(PartData::FileData(FileData {
            mime_type: "application/pdf",
            file_uri: url.clone(),
        })
        .into()),
        None => image_part(&file.file_data, i),
    }
}

/// `data:<mime>;base64,<data>` → `inlineData`; `http(s)://` → `fileData` (Gemini API reference,
/// "Content" → `Blob` / `FileData`).
fn image_part(url: &str, i: usize) -> Result<Part, ErrorInfo> {
    if switchyard_schemas::input::is_data_url(url) {
        let d = switchyard_schemas::input::parse_data_url(url).ok_or_else(|| {
            bad_message(i, "image data URLs must be data:<media type>;base64,<data>")
        })?;
        let blob = Blob {
            mime_type: d.media_type.to_owned(),
            data: d.data.to_owned(),
        };
        return Ok(PartData::InlineData(blob).into());
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        let file = FileData {
            mime_type: mime_from_extension(url),
            file_uri: url.to_owned(),
        };
        return Ok(PartData::FileData(file).into());
    }
    Err(bad_message(i, "image URLs must be http(s) or data: URLs"))
}

/// The image MIME type a URL's file extension suggests (query and fragment ignored).
fn mime_from_extension(url: &str) -> &'static str {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let file = path.rsplit('/').next().unwrap_or(path);
    let ext = file
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "gif" => "image/gif",
        "heic" => "image/heic",
        "heif" => "image/heif",
        _ => DEFAULT_IMAGE_MIME,
    }
}

/// An assistant tool call → `{"functionCall":{"name","args"}}` (args = parsed arguments
/// object), the first of a turn with `thoughtSignature` [`THOUGHT_SIGNATURE_SKIP`].
fn function_call_part(call: &ToolCall, first: bool, i: usize) -> Result<Part, ErrorInfo> {
    let call = FunctionCall {
        name: call.function.name.clone(),
        args: tool_call_input(call, i)?,
    };
    Ok(Part {
        data: PartData::FunctionCall(call),
        thought_signature: first.then_some(THOUGHT_SIGNATURE_SKIP),
    })
}

/// A `role: tool` message → `{"functionResponse":{"name","response"}}`. Gemini matches results
/// to calls by function name (and order), so the name comes from the assistant call with this
/// `tool_call_id` (falling back to the message's `name`). `response` is the result when it is a
/// JSON object, else `{"output": <text>}`.
fn function_response_part(
    m: &Message,
    call_names: &HashMap<&str, &str>,
    i: usize,
) -> Result<Part, ErrorInfo> {
    let id = m.tool_call_id.as_deref().filter(|id| !id.is_empty());
    let id = id.ok_or_else(|| bad_message(i, "role `tool` needs tool_call_id"))?;
    let name = call_names
        .get(id)
        .copied()
        .or(m.name.as_deref())
        .ok_or_else(|| bad_message(i, format!("no earlier assistant tool call has id `{id}`")))?;
    let text = m.content.as_ref().map(Content::text).unwrap_or_default();
    let response = match serde_json::from_str::<Value>(&text) {
        Ok(v @ Value::Object(_)) => v,
        _ => serde_json::json!({ "output": text }),
    };
    let response = FunctionResponse {
        name: name.to_owned(),
        response,
    };
    Ok(PartData::FunctionResponse(response).into())
}

/// OpenAI `tool_choice` → `toolConfig`: `auto`→`AUTO`, `none`→`NONE`, `required`→`ANY`,
/// `{"type":"function","function":{"name"}}`→`ANY` + `allowedFunctionNames: [name]`.
fn choice_config(choice: Option<&Value>) -> Result<Option<ToolConfig>, ErrorInfo> {
    let bad = || {
        invalid(
            "tool_choice",
            "tool_choice must be auto, none, required or a named function",
        )
    };
    let config = match choice {
        None => return Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolConfig::new(Mode::Auto, Vec::new()),
            "none" => ToolConfig::new(Mode::None, Vec::new()),
            "required" => ToolConfig::new(Mode::Any, Vec::new()),
            _ => return Err(bad()),
        },
        Some(v @ Value::Object(_)) => {
            let name = v.pointer("/function/name").and_then(Value::as_str);
            ToolConfig::new(Mode::Any, vec![name.ok_or_else(bad)?.to_owned()])
        }
        Some(_) => return Err(bad()),
    };
    Ok(Some(config))
}
