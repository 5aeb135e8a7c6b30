//! Google Gemini API wire format: `GenerateContentResponse` objects, SSE and JSON-array streams,
//! errors.
//!
//! References: Gemini API reference, "Generating content" (`models.generateContent`,
//! `models.streamGenerateContent`; with `alt=sse` every SSE `data:` is one
//! `GenerateContentResponse`, without it the stream is one JSON array of them; there is no
//! `[DONE]`, the last chunk carries `finishReason` and the full `usageMetadata`) and "API
//! errors" (`{"error":{"code","message","status"}}`). Google writes streamed JSON with `": "`
//! after keys and `,` without a space, and non-stream bodies pretty-printed; the mock does too.

use std::borrow::Cow;

use axum::http::Uri;
use bytes::Bytes;
use serde::Serialize;
use serde_json::{Value, json};

use super::behaviour::{Generation, Output, RequestInfo, Usage, word_count};
use super::wire::{Item, Script, SseFormat};

/// The two `models.*` methods the mock serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    /// `:generateContent` (one JSON object).
    Generate,
    /// `:streamGenerateContent` (SSE with `alt=sse`, else a JSON array).
    Stream,
}

/// Splits the last path segment `{model}:{method}` (Gemini API reference, "Generating content").
pub(crate) fn parse_target(path: &str) -> Option<(&str, Method)> {
    let segment = path.rsplit('/').next()?;
    let (model, method) = segment.split_once(':')?;
    let method = match method {
        "generateContent" => Method::Generate,
        "streamGenerateContent" => Method::Stream,
        _ => return None,
    };
    (!model.is_empty()).then_some((model, method))
}

/// Whether the query asks for server-sent events (`alt=sse`).
pub(crate) fn is_sse(uri: &Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|kv| kv.eq_ignore_ascii_case("alt=sse")))
}

/// Text of every `parts[].text` of a `Content`.
fn content_text(content: &Value) -> Vec<&str> {
    content
        .get("parts")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default()
}

/// A `{"messages":[{"role":"user","content":…}]}` view of the request holding the text of the
/// last `user` content that has text, so the shared `#mock` directive parser can read it.
pub(crate) fn directive_view(body: &Value) -> Cow<'_, Value> {
    let last = body
        .get("contents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .rev()
        .filter(|c| c.get("role").and_then(Value::as_str).unwrap_or("user") == "user")
        .map(content_text)
        .find(|texts| !texts.is_empty());
    let text = last.map(|t| t.join("\n")).unwrap_or_default();
    Cow::Owned(json!({ "messages": [{ "role": "user", "content": text }] }))
}

/// Reads the fields the mock needs from a `GenerateContentRequest`; model and streaming come
/// from the URL.
pub(crate) fn request_info(body: &Value, uri: &Uri) -> Result<RequestInfo, String> {
    let Some((model, method)) = parse_target(uri.path()) else {
        return Err("Invalid method: expected :generateContent or :streamGenerateContent".into());
    };
    let contents = body.get("contents").and_then(Value::as_array);
    if contents.is_none_or(Vec::is_empty) {
        return Err("* GenerateContentRequest.contents: contents is not specified".into());
    }
    let tool_names = body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("functionDeclarations").and_then(Value::as_array))
        .flatten()
        .filter_map(|f| f.get("name").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    let system = body.get("systemInstruction").map(content_text);
    let prompt_words = contents
        .into_iter()
        .flatten()
        .flat_map(content_text)
        .chain(system.into_iter().flatten())
        .map(word_count)
        .sum();
    Ok(RequestInfo {
        model: model.to_string(),
        stream: method == Method::Stream,
        include_usage: true,
        max_tokens: body
            .pointer("/generationConfig/maxOutputTokens")
            .and_then(Value::as_u64),
        tool_names,
        prompt_words,
        n: 1,
        // `toolConfig.functionCallingConfig` mode `ANY` allowing exactly one function.
        forced_tool: body
            .pointer("/toolConfig/functionCallingConfig")
            .filter(|c| c.get("mode").and_then(Value::as_str) == Some("ANY"))
            .and_then(|c| c.get("allowedFunctionNames"))
            .and_then(Value::as_array)
            .filter(|names| names.len() == 1)
            .and_then(|names| names[0].as_str())
            .map(str::to_string),
        json_text: body
            .pointer("/generationConfig/responseMimeType")
            .and_then(Value::as_str)
            == Some("application/json"),
        ..RequestInfo::default()
    })
}

/// `(status, default message)` of a Google error for an HTTP status ("API errors" table).
fn error_kind(status: u16) -> (&'static str, &'static str) {
    match status {
        401 => (
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. (mock)",
        ),
        403 => (
            "PERMISSION_DENIED",
            "The caller does not have permission. (mock)",
        ),
        404 => ("NOT_FOUND", "Requested entity was not found. (mock)"),
        429 => (
            "RESOURCE_EXHAUSTED",
            "Resource has been exhausted (e.g. check quota). (mock)",
        ),
        499 => ("CANCELLED", "The operation was cancelled. (mock)"),
        400..=499 => (
            "INVALID_ARGUMENT",
            "Request contains an invalid argument. (mock)",
        ),
        503 => (
            "UNAVAILABLE",
            "The model is overloaded. Please try again later. (mock)",
        ),
        504 => (
            "DEADLINE_EXCEEDED",
            "Deadline expired before operation could complete. (mock)",
        ),
        _ => ("INTERNAL", "An internal error has occurred. (mock)"),
    }
}

/// `{"error":{"code","message","status"}}` for an HTTP status.
pub(crate) fn error_body(status: u16, message: Option<&str>) -> Value {
    let (kind, default) = error_kind(status);
    json!({ "error": { "code": status, "message": message.unwrap_or(default), "status": kind } })
}

/// Google's pretty-printed JSON (non-stream bodies and errors).
pub(crate) fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// Writes `": "` after object keys, as Google's streamed JSON does.
struct GoogleFormatter;

impl serde_json::ser::Formatter for GoogleFormatter {
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// One streamed chunk in Google's compact form.
fn compact(v: &Value) -> String {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, GoogleFormatter);
    match v.serialize(&mut ser) {
        Ok(()) => String::from_utf8(buf).unwrap_or_else(|_| v.to_string()),
        Err(_) => v.to_string(),
    }
}

/// `usageMetadata`: `promptTokenCount` includes `cachedContentTokenCount`; `candidatesTokenCount`
/// only when known (it is absent on the early chunks of a stream).
fn usage(u: Usage, completion: Option<u64>) -> Value {
    let mut m = json!({ "promptTokenCount": u.prompt });
    if let Some(c) = completion {
        m["candidatesTokenCount"] = json!(c);
    }
    m["totalTokenCount"] = json!(u.prompt + completion.unwrap_or(0));
    if u.cached > 0 {
        m["cachedContentTokenCount"] = json!(u.cached);
    }
    m
}

fn finish_reason(g: &Generation) -> &str {
    g.finish_word("MAX_TOKENS", "STOP", "STOP")
}

fn function_call(name: &str, arguments: &str) -> Value {
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!({}));
    json!({ "functionCall": { "name": name, "args": args } })
}

fn response(
    id: &str,
    info: &RequestInfo,
    parts: Value,
    finish: Option<&str>,
    usage: Value,
) -> Value {
    let mut candidate = json!({ "content": { "parts": parts, "role": "model" } });
    if let Some(f) = finish {
        candidate["finishReason"] = json!(f);
    }
    json!({
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": info.model,
        "responseId": id,
    })
}

/// The non-streaming `GenerateContentResponse`.
pub(crate) fn generate_response(id: &str, info: &RequestInfo, g: &Generation) -> Value {
    let parts = match &g.output {
        Output::Text { chunks, .. } => json!([{ "text": chunks.concat() }]),
        Output::Tools(calls) => calls
            .iter()
            .map(|c| function_call(&c.name, &c.arguments))
            .collect(),
    };
    let u = g
        .raw_usage
        .clone()
        .unwrap_or_else(|| usage(g.usage, Some(g.usage.completion)));
    response(id, info, parts, Some(finish_reason(g)), u)
}

/// The chunks of a streamed answer: SSE `data:` events with `alt=sse`, else one JSON array
/// (`[`, elements separated by `,\r\n`, `]`).
pub(crate) fn stream_script(
    id: &str,
    info: &RequestInfo,
    g: &Generation,
    fmt: SseFormat,
    sse: bool,
) -> Script {
    // A given `usageMetadata` is the last chunk's; the early chunks carry only its prompt
    // counts (Gemini streams report candidates only at the end).
    let early_usage = match &g.raw_usage {
        Some(raw) => {
            let mut m = serde_json::Map::new();
            for k in ["promptTokenCount", "cachedContentTokenCount"] {
                if let Some(v) = raw.get(k) {
                    m.insert(k.into(), v.clone());
                }
            }
            Value::Object(m)
        }
        None => usage(g.usage, None),
    };
    let chunk = |parts: Value| response(id, info, parts, None, early_usage.clone());
    let contents: Vec<Value> = match &g.output {
        Output::Text { chunks, .. } => chunks
            .iter()
            .map(|piece| chunk(json!([{ "text": piece }])))
            .collect(),
        // Gemini sends each function call whole (no argument deltas).
        Output::Tools(calls) => calls
            .iter()
            .map(|c| chunk(json!([function_call(&c.name, &c.arguments)])))
            .collect(),
    };
    let last = response(
        id,
        info,
        json!([{ "text": "" }]),
        Some(finish_reason(g)),
        g.raw_usage
            .clone()
            .unwrap_or_else(|| usage(g.usage, Some(g.usage.completion))),
    );
    let error = error_body(503, None);
    if sse {
        let event = |v: &Value| fmt.data(&compact(v));
        return Script {
            prelude: Vec::new(),
            body: contents.iter().map(|c| Item::Content(event(c))).collect(),
            trailer: vec![event(&last)],
            error: event(&error),
        };
    }
    let element = |v: &Value, tail: &str| Bytes::from(format!("{}{tail}", pretty(v)));
    Script {
        prelude: vec![Bytes::from_static(b"[")],
        body: contents
            .iter()
            .map(|c| Item::Content(element(c, ",\r\n")))
            .collect(),
        trailer: vec![element(&last, "]")],
        error: element(&error, "]"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use serde_json::{Value, json};

    use super::super::tests::{parse_sse, post};
    use super::super::{DEFAULT_TEXT, MockUpstream};

    const STREAM: &str = "/v1beta/models/gemini-test:streamGenerateContent?alt=sse";
    const GENERATE: &str = "/v1beta/models/gemini-test:generateContent";

    fn request(text: &str) -> Value {
        json!({
            "systemInstruction": { "parts": [{ "text": "Be brief" }] },
            "contents": [{ "role": "user", "parts": [{ "text": text }] }],
        })
    }

    fn chunks(bytes: &[u8]) -> Vec<Value> {
        parse_sse(bytes)
            .into_iter()
            .map(|(name, data)| {
                assert!(name.is_none());
                serde_json::from_str(&data).unwrap()
            })
            .collect()
    }

    #[tokio::test]
    async fn sse_stream_is_google_shaped() {
        let mock = MockUpstream::start().await.unwrap();
        let resp = post(
            &mock,
            STREAM,
            &[("x-goog-api-key", "k")],
            &request("Say hi"),
        )
        .await;
        assert_eq!(resp.status(), 200);
        let bytes = resp.bytes().await.unwrap();
        assert!(
            bytes.starts_with(b"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": ")
        );
        let data = chunks(&bytes);
        assert_eq!(data.len(), 14);
        let text: String = data
            .iter()
            .filter_map(|d| d.pointer("/candidates/0/content/parts/0/text")?.as_str())
            .collect();
        assert_eq!(text, DEFAULT_TEXT);
        assert!(
            data[..13]
                .iter()
                .all(|d| d["candidates"][0].get("finishReason").is_none())
        );
        let last = &data[13];
        assert_eq!(last["candidates"][0]["finishReason"], "STOP");
        assert_eq!(
            last["usageMetadata"],
            json!({"promptTokenCount": 4, "candidatesTokenCount": 13, "totalTokenCount": 17})
        );
        assert_eq!(last["modelVersion"], "gemini-test");
        let recorded = &mock.requests()[0];
        assert_eq!(
            recorded.path,
            "/v1beta/models/gemini-test:streamGenerateContent"
        );
        assert_eq!(recorded.query.as_deref(), Some("alt=sse"));
        assert_eq!(recorded.header("x-goog-api-key"), Some("k"));
    }

    #[tokio::test]
    async fn json_array_stream_without_alt_sse() {
        let mock = MockUpstream::start().await.unwrap();
        let path = "/v1/models/gemini-test:streamGenerateContent";
        let resp = post(&mock, path, &[], &request("x\n#mock text=a+b chunks=2")).await;
        let body: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        let parts: Vec<&Value> = body
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["candidates"][0]["content"]["parts"][0]["text"])
            .collect();
        assert_eq!(parts, [&json!("a "), &json!("b"), &json!("")]);
    }

    #[tokio::test]
    async fn non_stream_tool_calls_and_errors() {
        let mock = MockUpstream::start().await.unwrap();
        let mut body = request("weather?\n#mock tool_calls=2");
        body["tools"] = json!([{ "functionDeclarations": [{ "name": "lookup" }] }]);
        let v: Value = post(&mock, GENERATE, &[], &body)
            .await
            .json()
            .await
            .unwrap();
        let parts = &v["candidates"][0]["content"]["parts"];
        assert_eq!(parts[0]["functionCall"]["name"], "lookup");
        assert_eq!(parts[1]["functionCall"]["args"], json!({"city": "London"}));
        assert_eq!(v["candidates"][0]["finishReason"], "STOP");
        assert_eq!(v["usageMetadata"]["candidatesTokenCount"], 20);

        let resp = post(&mock, GENERATE, &[("x-mock-status", "429")], &body).await;
        assert_eq!(resp.status(), 429);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED");
        assert_eq!(v["error"]["code"], 429);

        let resp = post(&mock, GENERATE, &[], &json!({ "contents": [] })).await;
        assert_eq!(resp.status(), 400);
        let resp = post(&mock, "/v1beta/models/m:countTokens", &[], &body).await;
        assert_eq!(resp.status(), 404);
    }

    #[tokio::test]
    async fn in_stream_error_and_truncation() {
        let mock = MockUpstream::start().await.unwrap();
        let resp = post(&mock, STREAM, &[], &request("x\n#mock error_after=1")).await;
        let data = chunks(&resp.bytes().await.unwrap());
        assert_eq!(data.len(), 2);
        assert_eq!(data[1]["error"]["status"], "UNAVAILABLE");

        let mut body = request("x");
        body["generationConfig"] = json!({ "maxOutputTokens": 2 });
        let data = chunks(&post(&mock, STREAM, &[], &body).await.bytes().await.unwrap());
        assert_eq!(data.len(), 3);
        assert_eq!(data[2]["candidates"][0]["finishReason"], "MAX_TOKENS");
    }
}
