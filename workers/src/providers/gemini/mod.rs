//! Google Gemini API adapter: `POST {base_url}/models/{model}:streamGenerateContent?alt=sse`
//! (`:generateContent` for non-streaming clients; any `application/json` answer is read whole) with
//! the key in `x-goog-api-key` (Gemini API reference, "API reference" → authentication), e.g.
//! `base_url: https://generativelanguage.googleapis.com/v1beta`.
//!
//! Request translation follows the Gemini API reference, "Generating content"
//! (`GenerateContentRequest`: `contents[]` of `{role: user|model, parts[]}`, `systemInstruction`,
//! `tools[].functionDeclarations[]`, `toolConfig.functionCallingConfig`, `generationConfig`) and
//! the "Function calling" guide (`functionCall` / `functionResponse` parts). Stream translation:
//! with `alt=sse` every SSE `data:` is one `GenerateContentResponse`; text and whole function calls
//! arrive as `candidates[0].content.parts[]`, `finishReason` marks the last chunk, `usageMetadata`
//! is cumulative (the last one wins), and there is no `[DONE]`: the stream simply ends.

use std::collections::{HashMap, VecDeque};

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::{Map, Value, json};
use switchyard_schemas::config::ProviderKind;
use switchyard_schemas::request::{Content, FilePart, Message, Role, ToolCall};
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage};

use crate::provider::{Answer, Call, EventStream, Provider, SseTranslator, Upstream, send_checked};
use crate::sse::SseEvent;

/// MIME type assumed for an `http(s)` image URL whose extension says nothing (`fileData.mimeType`
/// is required; Gemini API reference, "Content" → `FileData`).
pub const DEFAULT_IMAGE_MIME: &str = "image/jpeg";

/// `thoughtSignature` sent on the first `functionCall` part of each replayed model turn. Gemini 3
/// models reject function-call history without signatures (400); OpenAI-shaped history cannot
/// carry the real ones, and the Gemini API "Thought signatures" FAQ documents this value for
/// history that did not come from the same model.
pub const THOUGHT_SIGNATURE_SKIP: &str = "skip_thought_signature_validator";

/// Adapter for the Google Gemini API (`{base_url}/models/{model}:streamGenerateContent?alt=sse`
/// for streaming clients, `:generateContent` for the others; `x-goog-api-key` auth). Stateless.
#[derive(Debug, Clone, Copy, Default)]
pub struct GeminiProvider;

impl Provider for GeminiProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Gemini
    }

    fn stream_chat(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<EventStream> {
        let (http, target, base_url) = (up.http, up.target, up.base_url);
        let body = build_request(req).map(|body| body.to_string());
        let structured = matches!(json_tool(req), Ok(Some(_)));
        let (url, accept) = if req.stream {
            (
                stream_url(base_url, &target.upstream_model),
                "text/event-stream",
            )
        } else {
            (
                generate_url(base_url, &target.upstream_model),
                "application/json",
            )
        };
        let mut builder = http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, accept);
        let key = api_key_header(target);
        Box::pin(async move {
            let body = body?;
            if let Some(key) = key? {
                builder = builder.header("x-goog-api-key", key);
            }
            let resp = send_checked(builder.body(body)).await?;
            let parse = if structured {
                parse_structured_response
            } else {
                parse_response
            };
            let translator = GeminiTranslator {
                structured,
                ..GeminiTranslator::default()
            };
            Ok(read_answer(resp, parse, translator))
        })
    }
}

/// `{base_url}/models/{model}:streamGenerateContent?alt=sse` (Gemini API reference, "Generating
/// content" → `models.streamGenerateContent`); a `models/` prefix on the model id (the resource
/// name form `models.list` returns) is accepted.
pub fn stream_url(base_url: &str, upstream_model: &str) -> String {
    let model = upstream_model.trim_start_matches("models/");
    let base = base_url.trim_end_matches('/');
    format!("{base}/models/{model}:streamGenerateContent?alt=sse")
}

/// `{base_url}/models/{model}:generateContent` (Gemini API reference, `models.generateContent`),
/// for non-streaming clients.
pub fn generate_url(base_url: &str, upstream_model: &str) -> String {
    let model = upstream_model.trim_start_matches("models/");
    format!(
        "{}/models/{model}:generateContent",
        base_url.trim_end_matches('/')
    )
}

/// Reads a whole `GenerateContentResponse` — the shape of one stream chunk — with the stream
/// translator, then collects it ([`Answer::from_frames`]). A JSON array of chunks (the stream
/// without `alt=sse`) is read the same way.
fn parse_response(v: &Value) -> Result<Answer, ErrorInfo> {
    parse_with(v, GeminiTranslator::default())
}

/// [`parse_response`] for a request that declared [`JSON_TOOL`].
fn parse_structured_response(v: &Value) -> Result<Answer, ErrorInfo> {
    let t = GeminiTranslator {
        structured: true,
        ..GeminiTranslator::default()
    };
    parse_with(v, t)
}

fn parse_with(v: &Value, mut t: GeminiTranslator) -> Result<Answer, ErrorInfo> {
    let mut out = VecDeque::new();
    match v.as_array() {
        Some(chunks) => {
            for c in chunks {
                t.chunk(c, &mut out)?;
            }
        }
        None => t.chunk(v, &mut out)?,
    }
    t.on_eof(&mut out);
    Answer::from_frames(out)
}

use crate::providers::shared::{
    JSON_INSTRUCTION, JSON_TOOL, PartCodec, api_key_header, bad_message, invalid, one_choice,
    protocol, read_answer, without_nulls,
};

/// One `Content` being built: role, whether it holds tool results, parts.
struct Turn {
    role: &'static str,
    tool_results: bool,
    parts: Vec<Value>,
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
    let mut system: Vec<Value> = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    let mut call_names: HashMap<&str, &str> = HashMap::new();
    for (i, m) in req.messages.iter().enumerate() {
        match m.role {
            Role::System | Role::Developer => {
                let text = m.content.as_ref().map(Content::text).unwrap_or_default();
                if !text.is_empty() {
                    system.push(json!({ "text": text }));
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
    let contents: Vec<Value> = turns
        .into_iter()
        .map(|t| json!({ "role": t.role, "parts": t.parts }))
        .collect();
    let mut body = Map::new();
    body.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        body.insert("systemInstruction".into(), json!({ "parts": system }));
    }
    let json_tool = json_tool(req)?;
    if !req.tools.is_empty() {
        let declarations = req.tools.iter().map(|t| {
            let f = &t.function;
            without_nulls(json!({
                "name": f.name,
                "description": f.description,
                "parametersJsonSchema": f.parameters,
            }))
        });
        let declarations: Vec<Value> = declarations.chain(json_tool.clone()).collect();
        body.insert(
            "tools".into(),
            json!([{ "functionDeclarations": declarations }]),
        );
        let mut config = tool_config(req.tool_choice.as_ref())?;
        if json_tool.is_some() {
            let (json_config, instruct) = json_tool_config(config);
            config = Some(json_config);
            if instruct {
                system.push(json!({ "text": JSON_INSTRUCTION }));
                body.insert("systemInstruction".into(), json!({ "parts": system }));
            }
        }
        if let Some(config) = config {
            body.insert("toolConfig".into(), config);
        }
    }
    let mut config = without_nulls(json!({
        "temperature": p.temperature,
        "topP": p.top_p,
        "topK": p.top_k,
        "maxOutputTokens": p.max_tokens,
        "stopSequences": (!p.stop.is_empty()).then_some(&p.stop),
        "candidateCount": p.n,
        "seed": p.seed,
        "presencePenalty": p.presence_penalty,
        "frequencyPenalty": p.frequency_penalty,
    }));
    if let (Some(rf), Some(obj), None) = (&p.response_format, config.as_object_mut(), &json_tool) {
        response_format(rf, obj)?;
    }
    if config.as_object().is_some_and(|c| !c.is_empty()) {
        body.insert("generationConfig".into(), config);
    }
    Ok(Value::Object(body))
}

/// With user tools, Gemini 2.x answers 400 "Function calling with a response mime type:
/// 'application/json' is unsupported" (googleapis/python-genai #867), so a JSON
/// `response_format` then becomes the synthetic [`JSON_TOOL`] function instead (as on Anthropic,
/// see `anthropic::structured`): `parametersJsonSchema` = [`gemini_schema`] of the schema
/// (`{"type":"object"}` for `json_object`), and its `functionCall` comes back as the text
/// content. `None` without user tools or without a JSON `response_format`.
fn json_tool(req: &ChatRequest) -> Result<Option<Value>, ErrorInfo> {
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
            "json_object" => json!({ "type": "object" }),
            "json_schema" => gemini_schema(rf.pointer("/json_schema/schema").ok_or_else(|| {
                invalid("response_format", "json_schema needs json_schema.schema")
            })?),
            _ => return Ok(None),
        };
    if req.tools.iter().any(|t| t.function.name == JSON_TOOL) {
        return Err(invalid(
            "tools",
            format!("the tool name `{JSON_TOOL}` is reserved for response_format with tools"),
        ));
    }
    Ok(Some(json!({
        "name": JSON_TOOL,
        "description": "Respond with the final answer as a JSON object matching this schema.",
        "parametersJsonSchema": schema,
    })))
}

/// `toolConfig` with [`JSON_TOOL`] declared next to user tools, from the translated client
/// choice: unset or `AUTO` stays `AUTO` and needs [`JSON_INSTRUCTION`] (the `bool`); `NONE`
/// becomes `ANY` allowing only [`JSON_TOOL`]; `ANY` (with or without names) is kept.
fn json_tool_config(user: Option<Value>) -> (Value, bool) {
    let mode = user
        .as_ref()
        .and_then(|c| c.pointer("/functionCallingConfig/mode"))
        .and_then(Value::as_str)
        .unwrap_or("AUTO")
        .to_owned();
    match (mode.as_str(), user) {
        ("NONE", _) => (
            json!({ "functionCallingConfig": { "mode": "ANY", "allowedFunctionNames": [JSON_TOOL] } }),
            false,
        ),
        ("ANY", Some(user)) => (user, false),
        _ => (json!({ "functionCallingConfig": { "mode": "AUTO" } }), true),
    }
}

/// OpenAI `response_format` → `generationConfig.responseMimeType` (+ `responseJsonSchema`).
fn response_format(rf: &Value, config: &mut Map<String, Value>) -> Result<(), ErrorInfo> {
    let kind = rf.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => {}
        "json_object" => {
            config.insert("responseMimeType".into(), json!("application/json"));
        }
        "json_schema" => {
            let schema = rf.pointer("/json_schema/schema").ok_or_else(|| {
                invalid("response_format", "json_schema needs json_schema.schema")
            })?;
            config.insert("responseMimeType".into(), json!("application/json"));
            config.insert("responseJsonSchema".into(), gemini_schema(schema));
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
fn push_turn(turns: &mut Vec<Turn>, role: &'static str, tool_results: bool, parts: Vec<Value>) {
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
const PARTS: PartCodec<Value> = PartCodec {
    text: |t| json!({ "text": t }),
    image: image_part,
    file: file_part,
};

/// A document: by URL as `fileData` (Gemini API "Document understanding"), inline as
/// `inlineData` (which takes documents too); another provider's `file_id` cannot be read.
fn file_part(file: &FilePart, i: usize) -> Result<Value, ErrorInfo> {
    if file.file_id.is_some() {
        return Err(bad_message(
            i,
            "Gemini cannot read another provider's file_id: send the document inline or by URL",
        ));
    }
    match &file.file_url {
        Some(url) => Ok(json!({ "fileData": { "mimeType": "application/pdf", "fileUri": url } })),
        None => image_part(&file.file_data, i),
    }
}

/// `data:<mime>;base64,<data>` → `inlineData`; `http(s)://` → `fileData` (Gemini API reference,
/// "Content" → `Blob` / `FileData`).
fn image_part(url: &str, i: usize) -> Result<Value, ErrorInfo> {
    if switchyard_schemas::input::is_data_url(url) {
        return match switchyard_schemas::input::parse_data_url(url) {
            Some(d) => Ok(json!({ "inlineData": { "mimeType": d.media_type, "data": d.data } })),
            None => Err(bad_message(
                i,
                "image data URLs must be data:<media type>;base64,<data>",
            )),
        };
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        let mime = mime_from_extension(url);
        return Ok(json!({ "fileData": { "mimeType": mime, "fileUri": url } }));
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

/// An assistant tool call → `{"functionCall":{"name","args"}}` (args = parsed arguments object).
fn function_call_part(call: &ToolCall, first: bool, i: usize) -> Result<Value, ErrorInfo> {
    let args = crate::providers::shared::tool_call_input(call, i)?;
    let mut part = json!({ "functionCall": { "name": call.function.name, "args": args } });
    if first && let Some(obj) = part.as_object_mut() {
        obj.insert("thoughtSignature".into(), json!(THOUGHT_SIGNATURE_SKIP));
    }
    Ok(part)
}

/// A `role: tool` message → `{"functionResponse":{"name","response"}}`. Gemini matches results
/// to calls by function name (and order), so the name comes from the assistant call with this
/// `tool_call_id` (falling back to the message's `name`).
fn function_response_part(
    m: &Message,
    call_names: &HashMap<&str, &str>,
    i: usize,
) -> Result<Value, ErrorInfo> {
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
        _ => json!({ "output": text }),
    };
    Ok(json!({ "functionResponse": { "name": name, "response": response } }))
}

/// OpenAI `tool_choice` → `toolConfig`: `auto`→`AUTO`, `none`→`NONE`, `required`→`ANY`,
/// `{"type":"function","function":{"name"}}`→`ANY` + `allowedFunctionNames: [name]`.
fn tool_config(choice: Option<&Value>) -> Result<Option<Value>, ErrorInfo> {
    let bad = || {
        invalid(
            "tool_choice",
            "tool_choice must be auto, none, required or a named function",
        )
    };
    let config = match choice {
        None => return Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => json!({ "mode": "AUTO" }),
            "none" => json!({ "mode": "NONE" }),
            "required" => json!({ "mode": "ANY" }),
            _ => return Err(bad()),
        },
        Some(v @ Value::Object(_)) => {
            let name = v.pointer("/function/name").and_then(Value::as_str);
            json!({ "mode": "ANY", "allowedFunctionNames": [name.ok_or_else(bad)?] })
        }
        Some(_) => return Err(bad()),
    };
    Ok(Some(json!({ "functionCallingConfig": config })))
}

type Item = Result<FrameBody, ErrorInfo>;

/// Gemini stream → normalised events: `Text`, whole `ToolCall`s, then (at the end of the byte
/// stream, Gemini has no end marker) one `Usage` and `End`; a stream that ends without any
/// `finishReason` is a `protocol` error.
#[derive(Debug, Default)]
pub struct GeminiTranslator {
    /// From `candidates[0].finishReason`.
    finish: Option<FinishReason>,
    /// The last `usageMetadata` (cumulative).
    usage: Option<Usage>,
    /// Function calls seen so far (the next tool index).
    calls: u32,
    /// The request declared [`JSON_TOOL`]: its call is the text answer, other text is held in
    /// `held` until the end and dropped when [`JSON_TOOL`] answered (as on Anthropic).
    structured: bool,
    /// [`JSON_TOOL`] was called.
    json_answered: bool,
    /// Text written while `structured`.
    held: String,
}

impl SseTranslator for GeminiTranslator {
    fn on_event(&mut self, ev: SseEvent, out: &mut VecDeque<Item>) -> bool {
        let data = ev.data.trim();
        if data.is_empty() {
            return false;
        }
        match serde_json::from_str::<Value>(data) {
            Ok(v) => match self.chunk(&v, out) {
                Ok(()) => false,
                Err(e) => {
                    out.push_back(Err(e));
                    true
                }
            },
            Err(e) => {
                out.push_back(Err(protocol(format!(
                    "upstream sent an unparsable stream chunk: {e}"
                ))));
                true
            }
        }
    }

    fn on_eof(&mut self, out: &mut VecDeque<Item>) {
        let Some(finish) = self.finish else {
            out.push_back(Err(protocol(
                "upstream stream ended before any finishReason",
            )));
            return;
        };
        if !self.json_answered && !self.held.is_empty() {
            let text = std::mem::take(&mut self.held);
            out.push_back(Ok(FrameBody::Text { text }));
        }
        if let Some(usage) = self.usage {
            out.push_back(Ok(FrameBody::Usage { usage }));
        }
        // Gemini says STOP after function calls; OpenAI's vocabulary says tool_calls.
        let finish_reason = match finish {
            FinishReason::Stop if self.calls > 0 => FinishReason::ToolCalls,
            other => other,
        };
        out.push_back(Ok(FrameBody::End { finish_reason }));
    }
}

impl GeminiTranslator {
    /// Handles one `GenerateContentResponse` (or an in-stream `{"error":…}`).
    fn chunk(&mut self, v: &Value, out: &mut VecDeque<Item>) -> Result<(), ErrorInfo> {
        if v.get("error").is_some() {
            return Err(crate::providers::classify::stream_error(v));
        }
        if let Some(reason) = v
            .pointer("/promptFeedback/blockReason")
            .and_then(Value::as_str)
        {
            return Err(ErrorInfo::new(
                ErrorClass::InvalidRequest,
                format!("the prompt was blocked by Gemini (blockReason {reason})"),
            ));
        }
        if let Some(u) = v.get("usageMetadata").filter(|u| u.is_object()) {
            self.usage = Some(parse_usage(u));
        }
        let candidates = v.get("candidates").and_then(Value::as_array);
        // One choice only: the candidate with index 0 (the field is omitted when 0).
        let Some(candidate) = candidates
            .into_iter()
            .flatten()
            .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        else {
            return Ok(());
        };
        let parts = candidate
            .pointer("/content/parts")
            .and_then(Value::as_array);
        for part in parts.into_iter().flatten() {
            // Thought summaries (`thought: true`) are not part of the answer.
            if part.get("thought").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            if let Some(text) = part.get("text").and_then(Value::as_str)
                && !text.is_empty()
            {
                if self.structured {
                    self.held.push_str(text);
                } else {
                    out.push_back(Ok(FrameBody::Text {
                        text: text.to_owned(),
                    }));
                }
            }
            if let Some(call) = part.get("functionCall") {
                if self.structured && call.get("name").and_then(Value::as_str) == Some(JSON_TOOL) {
                    self.json_answered = true;
                    let text = match call.get("args") {
                        Some(args @ Value::Object(_)) => args.to_string(),
                        _ => "{}".to_owned(),
                    };
                    out.push_back(Ok(FrameBody::Text { text }));
                } else {
                    out.push_back(Ok(self.tool_call(call)?));
                }
            }
        }
        if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str)
            && let Some(f) = finish_reason(reason)
        {
            self.finish = Some(f);
        }
        Ok(())
    }

    /// A whole `functionCall{id?,name,args}` → one `ToolCall` piece. Gemini API calls usually
    /// carry no id, so `call_<n>` is generated (n = the call's index in this response).
    fn tool_call(&mut self, call: &Value) -> Result<FrameBody, ErrorInfo> {
        let name = call.get("name").and_then(Value::as_str);
        let name = name.ok_or_else(|| protocol("functionCall without a name"))?;
        let index = self.calls;
        self.calls += 1;
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map_or_else(|| format!("call_{index}"), str::to_owned);
        let arguments = match call.get("args") {
            Some(args @ Value::Object(_)) => args.to_string(),
            _ => "{}".to_owned(),
        };
        Ok(FrameBody::ToolCall {
            index,
            id: Some(id),
            name: Some(name.to_owned()),
            arguments,
        })
    }
}

/// Gemini `usageMetadata` → normalised usage: `promptTokenCount` already includes
/// `cachedContentTokenCount`; Gemini counts thinking separately (`thoughtsTokenCount`), while our
/// `completion_tokens` includes reasoning, so it is `candidatesTokenCount + thoughtsTokenCount`.
fn parse_usage(u: &Value) -> Usage {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let thoughts = n("thoughtsTokenCount");
    Usage {
        prompt_tokens: n("promptTokenCount"),
        cached_tokens: n("cachedContentTokenCount"),
        cache_write_tokens: 0,
        completion_tokens: n("candidatesTokenCount").saturating_add(thoughts),
        reasoning_tokens: thoughts,
        ..Default::default()
    }
}

/// Gemini `finishReason` → OpenAI `finish_reason` (Gemini API reference, `Candidate.FinishReason`);
/// `None` for `FINISH_REASON_UNSPECIFIED`. Blocked output (`SAFETY`, `RECITATION`, `BLOCKLIST`,
/// `PROHIBITED_CONTENT`, `SPII`, `IMAGE_SAFETY`, …) is `content_filter`; `LANGUAGE`, `OTHER`,
/// `MALFORMED_FUNCTION_CALL` and unknown reasons end the answer as `stop`.
fn finish_reason(reason: &str) -> Option<FinishReason> {
    Some(match reason {
        "FINISH_REASON_UNSPECIFIED" => return None,
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" => {
            FinishReason::ContentFilter
        }
        r if r.starts_with("IMAGE_") => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    })
}

#[cfg(test)]
mod tests;
