//! The one validation rule for batch input, run on every line before any item is queued (so an
//! invalid input costs zero upstream calls): a JSON object, a unique well-formed `custom_id`,
//! `method` POST, `url` equal to the batch's endpoint, and a body that passes the live endpoint's
//! own parser (the same `FrontDoor::parse` a live request goes through) naming a configured
//! model, without `stream`. OpenAI's limits (OpenAI API reference, "Batch"): at most 50,000
//! requests and 200 MB per input file.

use super::records::LineError;
use crate::AppState;
use crate::front_door::FrontDoor;
use serde_json::Value;
use std::collections::HashSet;

/// Most requests in one batch (OpenAI: 50,000; Anthropic: 100,000 — the smaller for both).
pub const MAX_REQUESTS: usize = 50_000;
/// Largest input file, bytes (OpenAI: 200 MB).
pub const MAX_FILE_BYTES: usize = 200 * 1024 * 1024;
/// Most errors listed in `errors.data` (the count of bad lines is in the first message).
const MAX_LISTED: usize = 1_000;

/// The endpoints a batch may target.
pub const ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
];

/// One checked request: its `custom_id` and body.
#[derive(Debug)]
pub struct Checked {
    /// The client's `custom_id`.
    pub custom_id: String,
    /// The request body.
    pub body: Value,
}

fn err(code: &str, message: String, param: Option<&str>, line: usize) -> LineError {
    LineError {
        code: code.into(),
        message,
        param: param.map(str::to_owned),
        line: Some(line as u64),
    }
}

/// Checks a body against `endpoint`'s live parser and the configured models.
pub fn check_body(app: &AppState, endpoint: &str, body: &Value) -> Result<(), (String, String)> {
    let bytes = serde_json::to_vec(body).map_err(|e| ("invalid_body".into(), e.to_string()))?;
    let parsed = match endpoint {
        "/v1/chat/completions" => crate::chat::OpenAiChat::default()
            .parse(&bytes)
            .map(|i| (i.model, i.stream)),
        "/v1/messages" => crate::anthropic::AnthropicMessages { beta: None }
            .parse(&bytes)
            .map(|i| (i.model, i.stream)),
        "/v1/embeddings" => crate::embeddings::model_of(&bytes).map(|m| (m, false)),
        "/v1/responses" => crate::responses::validate(&bytes),
        other => return Err(("invalid_url".into(), format!("`{other}` is not batchable"))),
    };
    let (model, stream) = parsed.map_err(|e| {
        let code = e.code.unwrap_or("invalid_body").to_owned();
        (code, e.message)
    })?;
    if stream {
        return Err((
            "invalid_body".into(),
            "`stream: true` is not supported in a batch".into(),
        ));
    }
    if app.config.get().model(&model).is_none() {
        return Err((
            "model_not_found".into(),
            crate::error::ApiError::model_not_found(&model).message,
        ));
    }
    Ok(())
}

/// Checks the custom id rule shared by both APIs: a non-empty string of at most 64 characters,
/// unique in the batch.
fn check_custom_id<'a>(
    v: Option<&'a Value>,
    seen: &mut HashSet<String>,
    line: usize,
) -> Result<&'a str, LineError> {
    let Some(id) = v.and_then(Value::as_str) else {
        return Err(err(
            "missing_custom_id",
            "`custom_id` must be a string".into(),
            Some("custom_id"),
            line,
        ));
    };
    if id.is_empty() || id.chars().count() > 64 {
        return Err(err(
            "invalid_custom_id",
            "`custom_id` must be 1 to 64 characters".into(),
            Some("custom_id"),
            line,
        ));
    }
    if !seen.insert(id.to_owned()) {
        return Err(err(
            "duplicate_custom_id",
            format!("The custom_id `{id}` appears more than once; each must be unique."),
            Some("custom_id"),
            line,
        ));
    }
    Ok(id)
}

/// Validates an OpenAI batch input file (JSONL: `{"custom_id","method","url","body"}` per line,
/// OpenAI API reference, "The request input object"): every checked request, or every error
/// found (blank lines are skipped; line numbers are 1-based).
pub fn openai_file(
    app: &AppState,
    endpoint: &str,
    content: &[u8],
) -> Result<Vec<Checked>, Vec<LineError>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    if content.len() > MAX_FILE_BYTES {
        return Err(vec![LineError {
            code: "file_too_large".into(),
            message: format!(
                "The input file has {} bytes; at most {MAX_FILE_BYTES} are allowed.",
                content.len()
            ),
            param: None,
            line: None,
        }]);
    }
    for (i, raw) in content.split(|b| *b == b'\n').enumerate() {
        let line = i + 1;
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match openai_line(app, endpoint, raw, &mut seen, line) {
            Ok(c) => out.push(c),
            Err(e) => errors.push(e),
        }
    }
    if out.len() + errors.len() > MAX_REQUESTS {
        errors.insert(
            0,
            LineError {
                code: "too_many_requests".into(),
                message: format!(
                    "The input file has {} requests; at most {MAX_REQUESTS} are allowed.",
                    out.len() + errors.len()
                ),
                param: None,
                line: None,
            },
        );
    }
    if out.is_empty() && errors.is_empty() {
        errors.push(LineError {
            code: "empty_file".into(),
            message: "The input file has no requests.".into(),
            param: None,
            line: None,
        });
    }
    verdict(out, errors)
}

/// The checked items when no line failed; else the first [`MAX_LISTED`] errors.
fn verdict<T>(out: Vec<T>, mut errors: Vec<LineError>) -> Result<Vec<T>, Vec<LineError>> {
    if errors.is_empty() {
        Ok(out)
    } else {
        errors.truncate(MAX_LISTED);
        Err(errors)
    }
}

fn openai_line(
    app: &AppState,
    endpoint: &str,
    raw: &[u8],
    seen: &mut HashSet<String>,
    line: usize,
) -> Result<Checked, LineError> {
    let v: Value = serde_json::from_slice(raw).map_err(|e| {
        err(
            "invalid_json_line",
            format!("Line {line} is not valid JSON: {e}"),
            None,
            line,
        )
    })?;
    let Some(obj) = v.as_object() else {
        return Err(err(
            "invalid_json_line",
            format!("Line {line} is not a JSON object"),
            None,
            line,
        ));
    };
    let custom_id = check_custom_id(obj.get("custom_id"), seen, line)?.to_owned();
    if obj.get("method").and_then(Value::as_str) != Some("POST") {
        return Err(err(
            "invalid_method",
            "`method` must be `POST`".into(),
            Some("method"),
            line,
        ));
    }
    let url = obj.get("url").and_then(Value::as_str).unwrap_or("");
    if url != endpoint {
        return Err(err(
            "mismatched_url",
            format!("`url` is `{url}` but the batch's endpoint is `{endpoint}`"),
            Some("url"),
            line,
        ));
    }
    let Some(body) = obj.get("body").filter(|b| b.is_object()) else {
        return Err(err(
            "invalid_body",
            "`body` must be a JSON object".into(),
            Some("body"),
            line,
        ));
    };
    check_body(app, endpoint, body)
        .map_err(|(code, message)| err(&code, message, Some("body"), line))?;
    Ok(Checked {
        custom_id,
        body: body.clone(),
    })
}

/// Validates Anthropic `requests` (`[{"custom_id","params"}]`, Anthropic API reference, "Create
/// a Message Batch") with the same rule; `line` is the 1-based index in `requests`.
pub fn anthropic_requests(
    app: &AppState,
    requests: &[Value],
) -> Result<Vec<Checked>, Vec<LineError>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    for (i, r) in requests.iter().enumerate() {
        let line = i + 1;
        let checked = check_custom_id(r.get("custom_id"), &mut seen, line).and_then(|id| {
            let Some(params) = r.get("params").filter(|p| p.is_object()) else {
                return Err(err(
                    "invalid_body",
                    "`params` must be a JSON object".into(),
                    Some("params"),
                    line,
                ));
            };
            check_body(app, "/v1/messages", params)
                .map_err(|(code, message)| err(&code, message, Some("params"), line))?;
            Ok(Checked {
                custom_id: id.to_owned(),
                body: params.clone(),
            })
        });
        match checked {
            Ok(c) => out.push(c),
            Err(e) => errors.push(e),
        }
    }
    if out.len() + errors.len() > MAX_REQUESTS || requests.is_empty() {
        errors.insert(
            0,
            LineError {
                code: "invalid_request_count".into(),
                message: format!("`requests` must hold 1 to {MAX_REQUESTS} requests."),
                param: Some("requests".into()),
                line: None,
            },
        );
    }
    verdict(out, errors)
}
