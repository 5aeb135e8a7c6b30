//! Normalised request → Anthropic Messages request body: the typed wire shapes of the body
//! (Anthropic API reference, "Messages" → body parameters,
//! <https://docs.anthropic.com/en/api/messages>) and [`build_request`].
//!
//! The translated body is typed; what stays `serde_json::Value` is JSON whose shape is the
//! client's: tool input schemas, tool-call input, `cache_control` breakpoints and the Anthropic
//! front door's raw fields ([`Passthrough::ANTHROPIC`]), which are merged over the serialised
//! body (so the last steps, [`apply_passthrough`] and [`map_reasoning_effort`], work on the
//! merged JSON object).

use serde::Serialize;
use serde_json::Value;
use switchyard_schemas::config::TargetConfig;
use switchyard_schemas::input::DataUrl;
use switchyard_schemas::request::{
    Content, FilePart, Message, Passthrough, Role, ThinkingBlock, ToolCall,
};
use switchyard_schemas::{ChatRequest, ErrorInfo};

use super::tools::{Tool, ToolChoice};
use super::{DEFAULT_MAX_TOKENS, structured};
use crate::providers::shared::{
    PartCodec, Turn, bad_message, empty_object_schema, invalid, one_choice, push_turn, to_json,
    tool_call_input,
};

/// A Messages request body as translated ("Messages" → body parameters); unset optional
/// parameters are left out.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    /// Required by Anthropic.
    max_tokens: u32,
    /// The system prompt as one string (the raw block form only comes through passthrough).
    system: Option<String>,
    messages: Vec<Turn<ContentBlock>>,
    /// `true` for a streaming client, else absent.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    temperature: Option<f64>,
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
    metadata: Option<Metadata<'a>>,
    top_k: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool>,
    /// Only sent together with `tools`.
    tool_choice: Option<ToolChoice>,
}

/// `metadata` ("Messages" → `metadata.user_id`: an opaque id of the end user).
#[derive(Debug, Serialize)]
struct Metadata<'a> {
    user_id: &'a str,
}

/// One content block of a message ("Messages" → `messages[].content[]`), with the prompt
/// caching breakpoint `cache_control` ("Prompt caching": allowed on text, image, document,
/// tool_use and tool_result blocks, not on thinking blocks; see [`ContentBlock::cached_by`]).
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
struct ContentBlock {
    #[serde(flatten)]
    block: Block,
    /// The client's breakpoint object as given, e.g. `{"type":"ephemeral"}`.
    cache_control: Option<Value>,
}

/// The content block types Switchyard sends, by their `type`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    /// `{"type":"text","text"}`.
    Text { text: String },
    /// `{"type":"image","source"}` ("Vision": base64 or URL source).
    Image { source: Source },
    /// `{"type":"document","source","title"?}` ("PDF support").
    Document {
        source: Source,
        title: Option<String>,
    },
    /// `{"type":"tool_use","id","name","input"}`: an assistant's tool call, `input` the parsed
    /// arguments object.
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    /// `{"type":"tool_result","tool_use_id","content"?}`: a tool's answer in a user turn.
    ToolResult {
        tool_use_id: String,
        content: Option<ToolResultContent>,
    },
    /// `{"type":"thinking","thinking","signature"?}` ("Extended thinking"), replayed unchanged.
    Thinking {
        thinking: String,
        signature: Option<String>,
    },
    /// `{"type":"redacted_thinking","data"}`, replayed unchanged.
    RedactedThinking { data: String },
}

/// `tool_result.content`: a string or content blocks.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ToolResultContent {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

/// An image or document `source`, by its `type`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Source {
    /// `{"type":"base64","media_type","data"}`.
    Base64 { media_type: String, data: String },
    /// `{"type":"url","url"}`: fetched by Anthropic, never by the gateway.
    Url { url: String },
    /// `{"type":"file","file_id"}` (Files API, beta: the client sends its `anthropic-beta`).
    File { file_id: String },
}

impl From<DataUrl<'_>> for Source {
    fn from(d: DataUrl<'_>) -> Self {
        Source::Base64 {
            media_type: d.media_type.to_owned(),
            data: d.data.to_owned(),
        }
    }
}

impl From<Block> for ContentBlock {
    fn from(block: Block) -> Self {
        ContentBlock {
            block,
            cache_control: None,
        }
    }
}

impl ContentBlock {
    fn text(text: &str) -> Self {
        Block::Text {
            text: text.to_owned(),
        }
        .into()
    }

    /// This block with `m`'s `cache_control` breakpoint, if it has one (not on a thinking
    /// block, which takes none).
    fn cached_by(mut self, m: &Message) -> Self {
        let thinking = matches!(
            self.block,
            Block::Thinking { .. } | Block::RedactedThinking { .. }
        );
        if let (Some(cache), false) = (&m.cache_control, thinking) {
            self.cache_control = Some(cache.clone());
        }
        self
    }
}

/// `thinking` as [`map_reasoning_effort`] sets it ("Extended thinking":
/// `{"type":"enabled","budget_tokens"}`); any other form comes through passthrough.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Thinking {
    Enabled { budget_tokens: u32 },
}

/// Translates a normalised request into an Anthropic Messages request body (JSON object).
///
/// Mapping (Anthropic API reference, "Messages"): `system`/`developer` messages → top-level `system`
/// joined with `"\n\n"`; `tool` messages → `tool_result` blocks in a `user` turn; consecutive turns of
/// one role merged (Anthropic requires alternation); assistant `tool_calls` → `tool_use` blocks;
/// `max_tokens` defaults to [`DEFAULT_MAX_TOKENS`]; `stop` → `stop_sequences`; `user` →
/// `metadata.user_id`; `"stream": true` when the client streams. Errors (class `invalid_request`, with `param`):
/// `n` > 1, unparsable tool-call arguments, unsupported image URLs, and the `response_format`
/// errors of `structured::json_tool`. `response_format` `json_schema` / `json_object` becomes
/// the synthetic [`structured::JSON_TOOL`] (see [`structured`] for the rule).
/// `seed`, `presence_penalty` and `frequency_penalty` have no Anthropic equivalent and are not sent;
/// `tool_choice` is only sent together with `tools`. `top_k` is sent as is; an assistant
/// message's `thinking_blocks` go first in its content, unchanged (signatures included); a
/// message's `cache_control` goes on its last block. Without a raw `system`, system messages are
/// joined into one string (their `cache_control` is not kept).
///
/// The [`Passthrough::ANTHROPIC`] fields the Anthropic front door carried (`thinking`,
/// `context_management`, `output_config`, `service_tier`, `metadata`, the raw `system` and
/// `tools` with their `cache_control`, …) are sent unchanged and win over the translated ones;
/// with a raw `system`, the leading system message it became is not sent twice, while later
/// system messages are appended to it as text blocks. Its headers (`anthropic-beta`) are sent too.
///
/// `reasoning_effort` (OpenAI front door) without a passthrough `thinking` becomes
/// `thinking: {"type":"enabled","budget_tokens":B}` with B = 1,024 (`low`), 4,096 (`medium`),
/// 16,384 (`high`), 32,768 (`xhigh`), capped at `max_tokens` − 1 (as in OpenAI,
/// `max_tokens` bounds reasoning and answer together; unset, `max_tokens` becomes
/// B + [`DEFAULT_MAX_TOKENS`]); `none`, `minimal`, a cap below Anthropic's minimum of 1,024, or a
/// forced tool choice (which thinking does not allow) send no `thinking`. With thinking on,
/// `temperature`, `top_p` and `top_k` are not sent (Anthropic allows no changes to them then).
pub fn build_request(target: &TargetConfig, req: &ChatRequest) -> Result<Value, ErrorInfo> {
    let p = &req.params;
    one_choice(p.n, "Anthropic")?;
    let json_tool = structured::json_tool(req)?;
    let mut system: Vec<String> = Vec::new();
    let mut turns: Vec<Turn<ContentBlock>> = Vec::new();
    for (i, m) in req.messages.iter().enumerate() {
        match m.role {
            Role::System | Role::Developer => {
                let text = m.content.as_ref().map(Content::text).unwrap_or_default();
                if !text.is_empty() {
                    system.push(text);
                }
            }
            Role::User => {
                let blocks = cached(PARTS.blocks(m.content.as_ref(), i)?, m);
                push_turn(&mut turns, "user", blocks);
            }
            Role::Assistant => {
                let mut blocks: Vec<ContentBlock> = m
                    .thinking_blocks
                    .iter()
                    .filter_map(thinking_block)
                    .collect();
                blocks.extend(PARTS.blocks(m.content.as_ref(), i)?);
                for call in &m.tool_calls {
                    blocks.push(tool_use_block(call, i)?);
                }
                push_turn(&mut turns, "assistant", cached(blocks, m));
            }
            Role::Tool => push_turn(
                &mut turns,
                "user",
                vec![tool_result_block(m, i)?.cached_by(m)],
            ),
        }
    }
    let json_choice = match &json_tool {
        Some(_) if req.tools.is_empty() => Some(structured::tool_choice(None, false)),
        Some(_) => {
            let user = tool_choice(req.tool_choice.as_ref(), p.parallel_tool_calls)?;
            Some(structured::tool_choice(user, true))
        }
        None => None,
    };
    if let Some((_, true)) = json_choice {
        system.push(structured::JSON_INSTRUCTION.to_owned());
    }
    let (mut tools, mut choice) = (Vec::new(), None);
    if !req.tools.is_empty() || json_tool.is_some() {
        tools = req
            .tools
            .iter()
            .map(|t| Tool {
                name: t.function.name.clone(),
                description: t.function.description.clone(),
                input_schema: (t.function.parameters.clone()).unwrap_or_else(empty_object_schema),
            })
            .collect();
        tools.extend(json_tool);
        choice = match json_choice {
            Some((choice, _)) => Some(choice),
            None => tool_choice(req.tool_choice.as_ref(), p.parallel_tool_calls)?,
        };
    }
    let body = MessagesRequest {
        model: &target.upstream_model,
        max_tokens: p.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        system: (!system.is_empty()).then(|| system.join("\n\n")),
        messages: turns,
        stream: req.stream,
        temperature: p.temperature,
        top_p: p.top_p,
        stop_sequences: &p.stop,
        metadata: p.user.as_deref().map(|user_id| Metadata { user_id }),
        top_k: p.top_k,
        tools,
        tool_choice: choice,
    };
    let mut body = to_json(&body)?;
    if let Some(obj) = body.as_object_mut() {
        apply_passthrough(obj, req)?;
        map_reasoning_effort(obj, req)?;
    }
    Ok(body)
}

/// `blocks` with the message's `cache_control` breakpoint on the last one (see
/// [`ContentBlock::cached_by`]).
fn cached(mut blocks: Vec<ContentBlock>, m: &Message) -> Vec<ContentBlock> {
    if let Some(last) = blocks.pop() {
        blocks.push(last.cached_by(m));
    }
    blocks
}

/// A normalised thinking block as an Anthropic content block, unchanged; an OpenAI encrypted
/// `reasoning` item has none (dropped).
fn thinking_block(b: &ThinkingBlock) -> Option<ContentBlock> {
    let block = match b {
        ThinkingBlock::Thinking {
            thinking,
            signature,
        } => Block::Thinking {
            thinking: thinking.clone(),
            signature: signature.clone(),
        },
        ThinkingBlock::RedactedThinking { data } => Block::RedactedThinking { data: data.clone() },
        ThinkingBlock::Reasoning { .. } => return None,
    };
    Some(block.into())
}

/// The Anthropic front door's own fields, over the translated ones (see [`build_request`]).
/// Its raw `system` is the client's JSON (a string or text blocks of any shape).
fn apply_passthrough(
    obj: &mut serde_json::Map<String, Value>,
    req: &ChatRequest,
) -> Result<(), ErrorInfo> {
    let Some(extra) = req.passthrough.get(Passthrough::ANTHROPIC) else {
        return Ok(());
    };
    for (k, v) in &extra.body {
        if k == "system" {
            // Later system messages (Claude Code sends them mid-conversation) follow the raw ones.
            let mut blocks = match v {
                Value::String(t) => vec![to_json(&ContentBlock::text(t))?],
                Value::Array(a) => a.clone(),
                _ => Vec::new(),
            };
            let later = req
                .messages
                .iter()
                .filter(|m| matches!(m.role, Role::System | Role::Developer))
                .skip(1)
                .filter_map(|m| Some((m.content.as_ref()?.text(), m)))
                .filter(|(t, _)| !t.is_empty());
            for (t, m) in later {
                blocks.push(to_json(&ContentBlock::text(&t).cached_by(m))?);
            }
            obj.insert("system".into(), Value::Array(blocks));
            continue;
        }
        obj.insert(k.clone(), v.clone());
    }
    Ok(())
}

/// `reasoning_effort` → a `thinking` budget, when no `thinking` was given (see [`build_request`]).
/// Reads the merged body: a passthrough `thinking` or `tool_choice` counts as given.
fn map_reasoning_effort(
    obj: &mut serde_json::Map<String, Value>,
    req: &ChatRequest,
) -> Result<(), ErrorInfo> {
    if obj.contains_key("thinking") {
        return Ok(());
    }
    let budget: u32 = match req.params.reasoning_effort.as_deref() {
        Some("low") => 1024,
        Some("medium") => 4096,
        Some("high") => 16_384,
        Some("xhigh") => 32_768,
        _ => return Ok(()),
    };
    let forced = obj
        .get("tool_choice")
        .and_then(|c| c.get("type"))
        .is_some_and(|t| t == "any" || t == "tool");
    let (budget, max_tokens) = match req.params.max_tokens {
        Some(max) => (budget.min(max.saturating_sub(1)), max),
        None => (budget, budget + DEFAULT_MAX_TOKENS),
    };
    if forced || budget < 1024 {
        return Ok(());
    }
    obj.insert("max_tokens".into(), Value::from(max_tokens));
    let thinking = Thinking::Enabled {
        budget_tokens: budget,
    };
    obj.insert("thinking".into(), to_json(&thinking)?);
    for k in ["temperature", "top_p", "top_k"] {
        obj.remove(k);
    }
    Ok(())
}

/// Anthropic's content blocks: `{"type":"text"}`, `image` and `document`.
const PARTS: PartCodec<ContentBlock> = PartCodec {
    text: ContentBlock::text,
    image: image_block,
    file: document_block,
};

/// `data:<media>;base64,<data>` → a base64 image source; `http(s)://` → a URL image source
/// (`data:` syntax: [`switchyard_schemas::input::parse_data_url`]).
fn image_block(url: &str, i: usize) -> Result<ContentBlock, ErrorInfo> {
    let source = if switchyard_schemas::input::is_data_url(url) {
        let d = switchyard_schemas::input::parse_data_url(url).ok_or_else(|| {
            bad_message(i, "image data URLs must be data:<media type>;base64,<data>")
        })?;
        Source::from(d)
    } else if url.starts_with("https://") || url.starts_with("http://") {
        Source::Url {
            url: url.to_owned(),
        }
    } else {
        return Err(bad_message(i, "image URLs must be http(s) or data: URLs"));
    };
    Ok(Block::Image { source }.into())
}

/// An inline document → `{"type":"document","source":{"type":"base64","media_type","data"},
/// "title"}` (Anthropic API reference, "PDF support"; the file name as the title).
fn document_block(file: &FilePart, i: usize) -> Result<ContentBlock, ErrorInfo> {
    // Anthropic "PDF support": a `url` source is fetched by Anthropic, not by the gateway.
    let source = match (&file.file_url, &file.file_id) {
        // Anthropic Files API (beta): the client sends the `anthropic-beta` header with it.
        (_, Some(id)) => Source::File {
            file_id: id.clone(),
        },
        (Some(url), None) => Source::Url { url: url.clone() },
        (None, None) => {
            let d =
                switchyard_schemas::input::parse_data_url(&file.file_data).ok_or_else(|| {
                    bad_message(i, "file data must be data:<media type>;base64,<data>")
                })?;
            Source::from(d)
        }
    };
    let title = file.filename.clone();
    Ok(Block::Document { source, title }.into())
}

/// An assistant tool call → `{"type":"tool_use","id","name","input"}` (input = parsed arguments).
fn tool_use_block(call: &ToolCall, i: usize) -> Result<ContentBlock, ErrorInfo> {
    let block = Block::ToolUse {
        id: call.id.clone(),
        name: call.function.name.clone(),
        input: tool_call_input(call, i)?,
    };
    Ok(block.into())
}

/// A `role: tool` message → `{"type":"tool_result","tool_use_id","content"}`; no `content` when
/// the result is empty.
fn tool_result_block(m: &Message, i: usize) -> Result<ContentBlock, ErrorInfo> {
    let id = m.tool_call_id.as_deref().filter(|id| !id.is_empty());
    let id = id.ok_or_else(|| bad_message(i, "role `tool` needs tool_call_id"))?;
    let content = match &m.content {
        Some(Content::Text(t)) if !t.is_empty() => Some(ToolResultContent::Text(t.clone())),
        Some(parts @ Content::Parts(_)) => {
            let blocks = PARTS.blocks(Some(parts), i)?;
            (!blocks.is_empty()).then_some(ToolResultContent::Blocks(blocks))
        }
        _ => None,
    };
    let block = Block::ToolResult {
        tool_use_id: id.to_owned(),
        content,
    };
    Ok(block.into())
}

/// OpenAI `tool_choice` (+ `parallel_tool_calls`) → Anthropic `tool_choice`:
/// `auto`→`{"type":"auto"}`, `none`→`{"type":"none"}`, `required`→`{"type":"any"}`,
/// `{"type":"function","function":{"name"}}`→`{"type":"tool","name"}`;
/// `parallel_tool_calls: false` adds `disable_parallel_tool_use: true` (not on `none`), and
/// alone (no `tool_choice`) gives `auto` with it.
fn tool_choice(
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolChoice>, ErrorInfo> {
    let bad = || {
        invalid(
            "tool_choice",
            "tool_choice must be auto, none, required or a named function",
        )
    };
    let disable_parallel_tool_use = parallel == Some(false);
    let out = match choice {
        None if disable_parallel_tool_use => ToolChoice::Auto {
            disable_parallel_tool_use,
        },
        None => return Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto {
                disable_parallel_tool_use,
            },
            "none" => ToolChoice::None,
            "required" => ToolChoice::Any {
                disable_parallel_tool_use,
            },
            _ => return Err(bad()),
        },
        Some(v @ Value::Object(_)) => {
            let name = v.pointer("/function/name").and_then(Value::as_str);
            ToolChoice::Tool {
                name: name.ok_or_else(bad)?.to_owned(),
                disable_parallel_tool_use,
            }
        }
        Some(_) => return Err(bad()),
    };
    Ok(Some(out))
}
