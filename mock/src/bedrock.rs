//! Amazon Bedrock Converse wire format: `ConverseStream` event-stream frames, `Converse` JSON,
//! errors.
//!
//! References: Amazon Bedrock API Reference, "Converse" / "ConverseStream" (`POST
//! /model/{modelId}/converse` and `/converse-stream`, errors) and "ConverseStreamOutput"
//! (`messageStart`, `contentBlockStart` for tool use, `contentBlockDelta`, `contentBlockStop`,
//! `messageStop`, `metadata`; exception members such as `modelStreamErrorException`); AWS SDKs,
//! "Event stream encoding" (binary frames, here written with `aws-smithy-eventstream`, with the
//! headers `:event-type`, `:content-type`, `:message-type`, or `:exception-type` for exceptions).
//! Like Bedrock, every event payload carries a padding member `p`. The mock does not verify
//! SigV4 signatures; the `authorization` header is recorded like every other.

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use axum::http::Uri;
use bytes::Bytes;
use serde_json::{Value, json};

use super::behaviour::{
    Generation, Output, RequestInfo, Usage, content_words, messages_words, names_at,
};
use super::wire::{Item, Script};

/// Padding alphabet of the `p` member.
const PADDING: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// Splits `…/model/{modelId}/converse(-stream)` into the percent-decoded model id and whether
/// the call streams.
pub(crate) fn parse_target(path: &str) -> Option<(String, bool)> {
    let (rest, stream) = if let Some(rest) = path.strip_suffix("/converse-stream") {
        (rest, true)
    } else {
        (path.strip_suffix("/converse")?, false)
    };
    let (prefix, model) = rest.rsplit_once('/')?;
    if !prefix.ends_with("/model") || model.is_empty() {
        return None;
    }
    let model = super::behaviour::percent_decode(&model.replace('+', "%2B")).ok()?;
    Some((model, stream))
}

/// Reads the fields the mock needs from a Converse request; model and streaming come from the URL.
pub(crate) fn request_info(body: &Value, uri: &Uri) -> Result<RequestInfo, String> {
    let Some((model, stream)) = parse_target(uri.path()) else {
        return Err("Invalid operation: expected /model/{modelId}/converse-stream".into());
    };
    if body
        .get("messages")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
    {
        return Err("The messages field is required and must not be empty.".into());
    }
    let tool_names = names_at(body.pointer("/toolConfig/tools"), "/toolSpec/name");
    let system_words = body.get("system").map_or(0, content_words);
    Ok(RequestInfo {
        model,
        stream,
        include_usage: true,
        max_tokens: body
            .pointer("/inferenceConfig/maxTokens")
            .and_then(Value::as_u64),
        tool_names,
        prompt_words: messages_words(body) + system_words,
        n: 1,
        ..RequestInfo::default()
    })
}

/// `(error shape, default message)` of a Bedrock error for an HTTP status ("ConverseStream" →
/// Errors).
fn error_kind(status: u16) -> (&'static str, &'static str) {
    match status {
        // AWS answers bad credentials with UnrecognizedClientException (HTTP 403 on the real
        // service; the mock keeps the status asked for).
        401 => (
            "UnrecognizedClientException",
            "The security token included in the request is invalid. (mock)",
        ),
        403 => (
            "AccessDeniedException",
            "You don't have access to the model with the specified model ID. (mock)",
        ),
        404 => (
            "ResourceNotFoundException",
            "The provided model identifier is invalid. (mock)",
        ),
        408 => (
            "ModelTimeoutException",
            "Model has timed out in processing the request. (mock)",
        ),
        424 => ("ModelErrorException", "The model returned an error. (mock)"),
        429 => (
            "ThrottlingException",
            "Too many requests, please wait before trying again. (mock)",
        ),
        400..=499 => (
            "ValidationException",
            "The input fails to satisfy the constraints. (mock)",
        ),
        503 => (
            "ServiceUnavailableException",
            "The service is unavailable. Please try again later. (mock)",
        ),
        _ => (
            "InternalServerException",
            "The server encountered an internal error. (mock)",
        ),
    }
}

/// `{"message": …}` for an HTTP status (the shape name goes in `x-amzn-ErrorType`).
pub(crate) fn error_body(status: u16, message: Option<&str>) -> Value {
    let (_, default) = error_kind(status);
    json!({ "message": message.unwrap_or(default) })
}

/// The `x-amzn-ErrorType` header value for an HTTP status, with the `:url` suffix Bedrock sends.
pub(crate) fn error_type_header(status: u16) -> String {
    let (shape, _) = error_kind(status);
    format!("{shape}:http://internal.amazon.com/coral/com.amazon.bedrock/")
}

/// One event-stream frame with string headers.
fn frame(headers: [(&'static str, String); 3], payload: &Value) -> Bytes {
    let headers = headers
        .into_iter()
        .map(|(name, value)| Header::new(name, HeaderValue::String(value.into())))
        .collect();
    let message = Message::new_from_parts(headers, payload.to_string());
    let mut out = Vec::new();
    match write_message_to(&message, &mut out) {
        Ok(()) => Bytes::from(out),
        Err(e) => {
            tracing::error!(error = %e, "mock could not encode an event-stream frame");
            Bytes::new()
        }
    }
}

/// An `event` frame of type `kind`; a padding member `p` is added to the payload.
fn event(kind: &str, mut payload: Value) -> Bytes {
    let len = 1 + payload.to_string().len() % (PADDING.len() - 1);
    if let Some(obj) = payload.as_object_mut() {
        obj.insert("p".into(), json!(&PADDING[..len]));
    }
    frame(
        [
            (":event-type", kind.to_string()),
            (":content-type", "application/json".to_string()),
            (":message-type", "event".to_string()),
        ],
        &payload,
    )
}

/// An `exception` frame (`:exception-type` names the `ConverseStreamOutput` member).
fn exception(kind: &str, message: &str) -> Bytes {
    frame(
        [
            (":exception-type", kind.to_string()),
            (":content-type", "application/json".to_string()),
            (":message-type", "exception".to_string()),
        ],
        &json!({ "message": message }),
    )
}

/// `TokenUsage`: `inputTokens` excludes cache reads (the mock never writes to a cache), and
/// `totalTokens` adds everything up.
fn usage(u: Usage) -> Value {
    let input = u.prompt.saturating_sub(u.cached);
    let mut m = json!({
        "inputTokens": input,
        "outputTokens": u.completion,
        "totalTokens": input + u.cached + u.completion,
    });
    if u.cached > 0 {
        m["cacheReadInputTokens"] = json!(u.cached);
        m["cacheWriteInputTokens"] = json!(0);
    }
    m
}

fn stop_reason(g: &Generation) -> &str {
    g.finish_word("max_tokens", "end_turn", "tool_use")
}

/// Tool use id of the `i`-th call.
fn tool_id(key: &str) -> String {
    format!("tooluse_mock_{key}")
}

/// The non-streaming `Converse` response.
pub(crate) fn converse_response(g: &Generation, latency_ms: u64) -> Value {
    let content: Vec<Value> = match &g.output {
        Output::Text { chunks, .. } => vec![json!({ "text": chunks.concat() })],
        Output::Tools(calls) => calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
                json!({ "toolUse": { "toolUseId": tool_id(&c.key(i)), "name": c.name, "input": input } })
            })
            .collect(),
    };
    json!({
        "output": { "message": { "role": "assistant", "content": content } },
        "stopReason": stop_reason(g),
        "usage": g.raw_usage.clone().unwrap_or_else(|| usage(g.usage)),
        "metrics": { "latencyMs": latency_ms },
    })
}

/// The frames of a streamed answer. Text goes in content block 0 without a
/// `contentBlockStart` (Bedrock sends one only for tool use); each tool call is its own block
/// with `contentBlockStart` (`toolUseId`, `name`) and its arguments as `toolUse.input` string
/// fragments. The in-stream error is a `modelStreamErrorException`.
pub(crate) fn stream_script(g: &Generation, latency_ms: u64) -> Script {
    let mut body = Vec::new();
    match &g.output {
        Output::Text { chunks, .. } => {
            for piece in chunks {
                body.push(Item::Content(event(
                    "contentBlockDelta",
                    json!({ "contentBlockIndex": 0, "delta": { "text": piece } }),
                )));
            }
            body.push(Item::Frame(event(
                "contentBlockStop",
                json!({ "contentBlockIndex": 0 }),
            )));
        }
        Output::Tools(calls) => {
            for (i, call) in calls.iter().enumerate() {
                let start =
                    json!({ "toolUse": { "toolUseId": tool_id(&call.key(i)), "name": call.name } });
                body.push(Item::Frame(event(
                    "contentBlockStart",
                    json!({ "contentBlockIndex": i, "start": start }),
                )));
                for piece in &call.pieces {
                    body.push(Item::Content(event(
                        "contentBlockDelta",
                        json!({ "contentBlockIndex": i, "delta": { "toolUse": { "input": piece } } }),
                    )));
                }
                body.push(Item::Frame(event(
                    "contentBlockStop",
                    json!({ "contentBlockIndex": i }),
                )));
            }
        }
    }
    let u = g.raw_usage.clone().unwrap_or_else(|| usage(g.usage));
    let metadata = json!({ "usage": u, "metrics": { "latencyMs": latency_ms } });
    Script {
        prelude: vec![event("messageStart", json!({ "role": "assistant" }))],
        body,
        trailer: vec![
            event("messageStop", json!({ "stopReason": stop_reason(g) })),
            event("metadata", metadata),
        ],
        error: exception(
            "modelStreamErrorException",
            "The model stream was interrupted. Retry your request. (mock)",
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
    use bytes::BytesMut;
    use serde_json::{Value, json};

    use super::super::tests::post;
    use super::super::{DEFAULT_TEXT, MockUpstream};
    use super::parse_target;

    const STREAM: &str = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream";

    fn request(text: &str) -> Value {
        json!({
            "system": [{ "text": "Be brief" }],
            "messages": [{ "role": "user", "content": [{ "text": text }] }],
        })
    }

    /// `(:event-type or :exception-type, payload)` of every frame.
    fn frames(bytes: &[u8]) -> Vec<(String, Value)> {
        let mut buf = BytesMut::from(bytes);
        let mut decoder = MessageFrameDecoder::new();
        let mut out = Vec::new();
        while let DecodedFrame::Complete(m) = decoder.decode_frame(&mut buf).unwrap() {
            let header = |n: &str| {
                m.headers()
                    .iter()
                    .find(|h| h.name().as_str() == n)
                    .map(|h| h.value().as_string().unwrap().as_str().to_owned())
            };
            let kind = header(":event-type").or_else(|| header(":exception-type"));
            out.push((kind.unwrap(), serde_json::from_slice(m.payload()).unwrap()));
        }
        assert!(buf.is_empty());
        out
    }

    #[test]
    fn targets() {
        assert_eq!(
            parse_target("/v1/model/a.b-v1%3A0/converse-stream"),
            Some(("a.b-v1:0".into(), true))
        );
        assert_eq!(parse_target("/model/m/converse"), Some(("m".into(), false)));
        assert_eq!(parse_target("/model//converse"), None);
        assert_eq!(parse_target("/x/m/converse"), None);
    }

    #[tokio::test]
    async fn stream_is_event_stream_framed() {
        let mock = MockUpstream::start().await.unwrap();
        let resp = post(
            &mock,
            STREAM,
            &[("authorization", "AWS4-HMAC-SHA256 x")],
            &request("Say hi"),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-type"],
            "application/vnd.amazon.eventstream"
        );
        let f = frames(&resp.bytes().await.unwrap());
        let kinds: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds[0], "messageStart");
        assert_eq!(
            kinds[kinds.len() - 3..],
            ["contentBlockStop", "messageStop", "metadata"]
        );
        let text: String = f
            .iter()
            .filter_map(|(_, p)| p.pointer("/delta/text")?.as_str())
            .collect();
        assert_eq!(text, DEFAULT_TEXT);
        assert!(f.iter().all(|(_, p)| p["p"].is_string()));
        let last = &f[f.len() - 1].1;
        assert_eq!(
            last["usage"],
            json!({"inputTokens": 4, "outputTokens": 13, "totalTokens": 17})
        );
        assert_eq!(f[f.len() - 2].1["stopReason"], "end_turn");
        let recorded = &mock.requests()[0];
        assert_eq!(recorded.path, STREAM);
        assert_eq!(recorded.header("authorization"), Some("AWS4-HMAC-SHA256 x"));
    }

    #[tokio::test]
    async fn tools_errors_and_non_stream() {
        let mock = MockUpstream::start().await.unwrap();
        let mut body = request("weather?\n#mock tool_calls=2");
        body["toolConfig"] = json!({ "tools": [{ "toolSpec": { "name": "lookup",
            "inputSchema": { "json": {} } } }] });
        let f = frames(&post(&mock, STREAM, &[], &body).await.bytes().await.unwrap());
        let starts: Vec<&Value> = f
            .iter()
            .filter(|(k, _)| k == "contentBlockStart")
            .map(|(_, p)| &p["start"]["toolUse"])
            .collect();
        assert_eq!(
            starts,
            [
                &json!({"toolUseId": "tooluse_mock_0", "name": "lookup"}),
                &json!({"toolUseId": "tooluse_mock_1", "name": "lookup"})
            ]
        );
        assert_eq!(f[f.len() - 2].1["stopReason"], "tool_use");

        let resp = post(&mock, "/v1/model/m/converse", &[], &body).await;
        let v: Value = resp.json().await.unwrap();
        assert_eq!(
            v["output"]["message"]["content"][1]["toolUse"]["input"],
            json!({"city": "London"})
        );
        assert_eq!(v["usage"]["outputTokens"], 20);

        let resp = post(&mock, STREAM, &[("x-mock-status", "429")], &body).await;
        assert_eq!(resp.status(), 429);
        assert_eq!(
            resp.headers()["x-amzn-errortype"],
            "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"
        );
        assert!(resp.headers().contains_key("x-amzn-requestid"));
        let v: Value = resp.json().await.unwrap();
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .starts_with("Too many requests")
        );

        let f = frames(
            &post(&mock, STREAM, &[], &request("x\n#mock error_after=1"))
                .await
                .bytes()
                .await
                .unwrap(),
        );
        assert_eq!(f.len(), 3);
        assert_eq!(f[2].0, "modelStreamErrorException");

        let resp = post(&mock, STREAM, &[], &json!({ "messages": [] })).await;
        assert_eq!(resp.status(), 400);
    }
}
