//! Unit tests of the bedrock adapter.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::providers::test_support::{self, BEDROCK, end, text};
use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::Header;
use serde_json::json;
use std::time::{Duration, UNIX_EPOCH};
use switchyard_mock::MockUpstream;
use switchyard_schemas::Secret;

fn usage(prompt: u64, cached: u64, written: u64, completion: u64) -> Item {
    test_support::usage(prompt, cached, written, completion, 0)
}
fn call(index: u32, id: Option<&str>, name: Option<&str>, arguments: &str) -> Item {
    tool_frame(
        index,
        id.map(str::to_owned),
        name.map(str::to_owned),
        arguments.into(),
    )
}

fn aws(akid: &str) -> AwsTarget {
    AwsTarget {
        region: "us-east-1".into(),
        access_key_id: Secret::new(akid),
        secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
        session_token: None,
    }
}

// ---- event-stream frames made with the crate's writer -------------------------------

fn frame(headers: &[(&'static str, &str)], payload: &[u8]) -> Vec<u8> {
    let headers = headers
        .iter()
        .map(|(n, v)| Header::new(*n, FrameHeaderValue::String((*v).to_owned().into())))
        .collect();
    let mut out = Vec::new();
    write_message_to(&Frame::new_from_parts(headers, payload.to_vec()), &mut out).unwrap();
    out
}
fn event(kind: &str, payload: Value) -> Vec<u8> {
    frame(
        &[
            (":event-type", kind),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.to_string().as_bytes(),
    )
}
fn exception(kind: &str, message: &str) -> Vec<u8> {
    frame(
        &[
            (":exception-type", kind),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        json!({ "message": message }).to_string().as_bytes(),
    )
}

/// Runs raw body chunks through the decoder and translator.
async fn decode(chunks: Vec<Vec<u8>>) -> Vec<Item> {
    let body = futures::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<Bytes, std::io::Error>(Bytes::from(c))),
    );
    translate_event_stream(body).collect().await
}

fn text_answer(stop: &str) -> Vec<u8> {
    [
        event("messageStart", json!({"p": "abc", "role": "assistant"})),
        event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": "Hi"}, "p": "abcdefgh"}),
        ),
        event("contentBlockStop", json!({"contentBlockIndex": 0})),
        event("messageStop", json!({"stopReason": stop})),
        event(
            "metadata",
            json!({"usage": {"inputTokens": 3, "outputTokens": 1, "totalTokens": 4},
                "metrics": {"latencyMs": 120}}),
        ),
    ]
    .concat()
}

// ---- against the mock ------------------------------------------------------------------

#[tokio::test]
async fn plain_text_stream_and_wire_request() {
    let mock = MockUpstream::start().await.unwrap();
    let events = BEDROCK
        .run(&mock, &BEDROCK.plain_text_request())
        .await
        .unwrap();
    assert_eq!(events, test_support::hello_world(usage(5, 0, 0, 2)));
    let sent = &mock.requests()[0];
    assert_eq!(
        sent.path,
        "/v1/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream"
    );
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(sent.body["system"], json!([{"text": "Be brief."}]));
    assert_eq!(sent.body["messages"][0]["role"], "user");
    assert_eq!(
        sent.body["inferenceConfig"],
        json!({"maxTokens": 64, "temperature": 0.2})
    );
    assert!(sent.body.get("modelId").is_none() && sent.body.get("model").is_none());
}

#[tokio::test]
async fn sigv4_authorization_header_arrives_with_the_bedrock_scope() {
    let mock = MockUpstream::start().await.unwrap();
    let mut t = BEDROCK.target(&mock.base_url());
    t.aws.as_mut().unwrap().session_token = Some(Secret::new("FwoGZXIvYXdzE-session"));
    let events = BEDROCK.run_with(&t, &BEDROCK.ask("text=ok")).await.unwrap();
    assert_eq!(events.last(), Some(&end(FinishReason::Stop)));
    let sent = &mock.requests()[0];
    let auth = sent.header("authorization").unwrap();
    let date = sent.header("x-amz-date").unwrap();
    assert_eq!(date.len(), 16, "{date}");
    let scope = format!(
        "AWS4-HMAC-SHA256 Credential=AKID/{}/us-east-1/bedrock/aws4_request, ",
        &date[..8]
    );
    assert!(auth.starts_with(&scope), "{auth}");
    assert!(
        auth.contains(
            "SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, Signature="
        ),
        "{auth}"
    );
    let signature = auth.rsplit("Signature=").next().unwrap();
    assert_eq!(signature.len(), 64);
    assert!(signature.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(
        sent.header("x-amz-security-token"),
        Some("FwoGZXIvYXdzE-session")
    );
    assert_eq!(sent.header("accept"), Some(EVENT_STREAM_CONTENT_TYPE));
    // No API-key style credentials are sent.
    assert_eq!(sent.header("x-api-key"), None);
}

#[tokio::test]
async fn usage_values_are_exact() {
    let events = test_support::usage_values_are_exact(&BEDROCK, usage(10, 3, 0, 4)).await;
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            Ok(FrameBody::Text { text }) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, switchyard_mock::DEFAULT_TEXT);
}

#[tokio::test]
async fn two_tool_calls() {
    let mock = MockUpstream::start().await.unwrap();
    let req = BEDROCK.weather_calls_request();
    let events = BEDROCK.run(&mock, &req).await.unwrap();
    let expected = vec![
        call(0, Some("tooluse_mock_0"), Some("get_weather"), ""),
        call(0, None, None, "{\"city\":"),
        call(0, None, None, "\"Paris\"}"),
        call(1, Some("tooluse_mock_1"), Some("get_weather"), ""),
        call(1, None, None, "{\"city\":\""),
        call(1, None, None, "London\"}"),
        usage(9, 0, 0, 20),
        end(FinishReason::ToolCalls),
    ];
    assert_eq!(events, expected);
    let sent = &mock.requests()[0].body;
    assert_eq!(
        sent["toolConfig"],
        json!({"tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {"json":
            {"type": "object", "properties": {"city": {"type": "string"}}}}}}],
            "toolChoice": {"any": {}}})
    );
}

#[tokio::test]
async fn exception_frame_mid_stream() {
    let err = test_support::error_after_two_chunks(&BEDROCK, false, ErrorClass::Upstream5xx).await;
    assert!(
        err.message
            .starts_with("upstream stream error modelStreamErrorException: "),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn http_errors_are_classified() {
    let mock = MockUpstream::start().await.unwrap();
    let err = BEDROCK
        .run_ask(&mock, "status=429 retry_after=7")
        .await
        .unwrap_err();
    assert_eq!(
        (err.class, err.upstream_status, err.retry_after_ms),
        (ErrorClass::RateLimited, Some(429), Some(7000))
    );
    assert!(
        err.message
            .starts_with("upstream returned HTTP 429 ThrottlingException: Too many requests"),
        "{}",
        err.message
    );
    let err = BEDROCK.run_ask(&mock, "status=429").await.unwrap_err();
    assert_eq!(
        (err.class, err.retry_after_ms),
        (ErrorClass::RateLimited, None)
    );
    for (status, class) in [
        (503, ErrorClass::Overloaded),
        (400, ErrorClass::InvalidRequest),
        (403, ErrorClass::Permission),
        (404, ErrorClass::NotFound),
        (408, ErrorClass::Timeout),
        (424, ErrorClass::Upstream5xx),
        (500, ErrorClass::Upstream5xx),
    ] {
        let err = BEDROCK
            .run_ask(&mock, &format!("status={status}"))
            .await
            .unwrap_err();
        assert_eq!((err.class, err.upstream_status), (class, Some(status)));
    }
}

#[tokio::test]
async fn arn_model_ids_stay_one_path_segment() {
    let mock = MockUpstream::start().await.unwrap();
    let mut t = BEDROCK.target(&mock.base_url());
    t.upstream_model =
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-micro-v1:0".into();
    let events = BEDROCK.run_with(&t, &BEDROCK.ask("text=ok")).await.unwrap();
    assert_eq!(
        events,
        vec![text("ok"), usage(3, 0, 0, 1), end(FinishReason::Stop)]
    );
    assert_eq!(
        mock.requests()[0].path,
        "/v1/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.amazon.nova-micro-v1%3A0/converse-stream"
    );
}

#[tokio::test]
async fn default_endpoint_and_missing_credentials() {
    let mut t = BEDROCK.target("http://unused");
    t.base_url = String::new();
    let req = BEDROCK.ask("x");
    let at = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
    let signed = prepare(&t, "", &req, at).unwrap();
    assert_eq!(
        signed.url,
        "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream"
    );
    t.aws = None;
    let err = prepare(&t, "", &req, at).unwrap_err();
    assert_eq!(err.class, ErrorClass::Internal);
}

// ---- signing --------------------------------------------------------------------------

fn header<'a>(headers: &'a [(HeaderName, HeaderValue)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.to_str().unwrap())
        .unwrap()
}

/// The `post-vanilla` and `get-vanilla-with-session-token` cases of the AWS SigV4 test suite
/// (credentials `AKIDEXAMPLE`, 2015-08-30T12:36:00Z, service `service`): our use of the
/// signer reproduces AWS's published signatures.
#[test]
fn signs_the_aws_sigv4_test_suite_vectors() {
    let at = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
    let creds = aws("AKIDEXAMPLE");
    let h = sigv4_headers(
        "service",
        "POST",
        "https://example.amazonaws.com/",
        &[],
        b"",
        &creds,
        at,
    )
    .unwrap();
    assert_eq!(header(&h, "x-amz-date"), "20150830T123600Z");
    assert_eq!(
        header(&h, "authorization"),
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
         SignedHeaders=host;x-amz-date, \
         Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
    );
    let mut creds = creds;
    creds.session_token = Some(Secret::new(
        "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267",
    ));
    let h = sigv4_headers(
        "service",
        "GET",
        "https://example.amazonaws.com/",
        &[],
        b"",
        &creds,
        at,
    )
    .unwrap();
    assert_eq!(
        header(&h, "authorization"),
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
         SignedHeaders=host;x-amz-date;x-amz-security-token, \
         Signature=07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8"
    );
    let (_, token) = h.iter().find(|(n, _)| n == "x-amz-security-token").unwrap();
    assert!(token.is_sensitive());
}

/// Fixed time, credentials, model and body → a stable Authorization header for a Bedrock call.
/// The expected signature was cross-checked with an independent SigV4 computation (HMAC-SHA256
/// chain over the canonical request whose URI is the double-encoded
/// `/model/anthropic.claude-3-haiku-20240307-v1%253A0/converse-stream`).
#[test]
fn bedrock_signature_is_deterministic() {
    let t = serde_json::from_value::<TargetConfig>(json!({"id": "b", "provider": "bedrock",
        "upstream_model": "anthropic.claude-3-haiku-20240307-v1:0",
        "aws": {"region": "us-west-2", "access_key_id": "AKIDEXAMPLE",
            "secret_access_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}}))
    .unwrap();
    let req = BEDROCK.request(json!([{"role": "user", "content": "Hello"}]), json!({}));
    let at = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
    let a = prepare(&t, "", &req, at).unwrap();
    let b = prepare(&t, "", &req, at).unwrap();
    assert_eq!(
        a.body,
        br#"{"messages":[{"role":"user","content":[{"text":"Hello"}]}]}"#
    );
    let auth = header(&a.headers, "authorization");
    assert_eq!(auth, header(&b.headers, "authorization"));
    assert_eq!(
        auth,
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-west-2/bedrock/aws4_request, \
         SignedHeaders=content-type;host;x-amz-date, \
         Signature=50a9d551fa3db0b189e4c5ceab5e6bf1b557d2c22c647495bedc22ed12dd607a"
    );
    let (_, value) = a
        .headers
        .iter()
        .find(|(n, _)| n == "authorization")
        .unwrap();
    assert!(value.is_sensitive());
    // Another second, another signature.
    let c = prepare(&t, "", &req, at + Duration::from_secs(1)).unwrap();
    assert_ne!(header(&c.headers, "authorization"), auth);
}

#[test]
fn path_segments_are_encoded() {
    assert_eq!(
        encode_path_segment("arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.x-v1:0"),
        "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.x-v1%3A0"
    );
    assert_eq!(
        converse_stream_url("http://h/v1/", "a b~_.-"),
        "http://h/v1/model/a%20b~_.-/converse-stream"
    );
    let err = sigv4_headers(
        "bedrock",
        "POST",
        "/relative",
        &[],
        b"",
        &aws("A"),
        SystemTime::now(),
    )
    .unwrap_err();
    assert_eq!(err.class, ErrorClass::Internal);
}

// ---- stream translation (raw frames) -------------------------------------------------

#[tokio::test]
async fn decodes_frames_split_at_every_byte() {
    let bytes = text_answer("end_turn");
    let chunks: Vec<Vec<u8>> = bytes.iter().map(|b| vec![*b]).collect();
    let expected = vec![text("Hi"), usage(3, 0, 0, 1), end(FinishReason::Stop)];
    assert_eq!(decode(chunks).await, expected);
    assert_eq!(decode(vec![bytes]).await, expected);
}

#[tokio::test]
async fn finish_reasons() {
    for (reason, expected) in [
        ("end_turn", FinishReason::Stop),
        ("stop_sequence", FinishReason::Stop),
        ("max_tokens", FinishReason::Length),
        ("model_context_window_exceeded", FinishReason::Length),
        ("tool_use", FinishReason::ToolCalls),
        ("guardrail_intervened", FinishReason::ContentFilter),
        ("content_filtered", FinishReason::ContentFilter),
        ("malformed_tool_use", FinishReason::Stop),
    ] {
        let events = decode(vec![text_answer(reason)]).await;
        assert_eq!(events.last(), Some(&end(expected)), "{reason}");
    }
}

#[tokio::test]
async fn exceptions_are_classified() {
    for (kind, class) in [
        ("throttlingException", ErrorClass::RateLimited),
        ("serviceUnavailableException", ErrorClass::Overloaded),
        ("modelStreamErrorException", ErrorClass::Upstream5xx),
        ("internalServerException", ErrorClass::Upstream5xx),
        ("validationException", ErrorClass::InvalidRequest),
        ("somethingNewException", ErrorClass::Upstream5xx),
    ] {
        let body = [
            event("messageStart", json!({"role": "assistant"})),
            event(
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "a"}}),
            ),
            exception(kind, "boom"),
            event("messageStop", json!({"stopReason": "end_turn"})),
        ]
        .concat();
        let events = decode(vec![body]).await;
        assert_eq!(events.len(), 2, "{kind}: {events:?}");
        assert_eq!(events[0], text("a"));
        let err = events[1].clone().unwrap_err();
        assert_eq!(err.class, class, "{kind}");
        assert_eq!(err.message, format!("upstream stream error {kind}: boom"));
    }
    let overflow = exception(
        "validationException",
        "Input is too long for requested model.",
    );
    let err = decode(vec![overflow]).await[0].clone().unwrap_err();
    assert_eq!(err.class, ErrorClass::ContextLengthExceeded);
    let generic = frame(
        &[
            (":message-type", "error"),
            (":error-code", "InternalFailure"),
            (":error-message", "oops"),
        ],
        b"",
    );
    let err = decode(vec![generic]).await[0].clone().unwrap_err();
    assert_eq!(
        (err.class, err.message.as_str()),
        (
            ErrorClass::Upstream5xx,
            "upstream stream error InternalFailure: oops"
        )
    );
}

/// Tool blocks interleaved with text and reasoning; a tool without arguments; cache usage.
#[tokio::test]
async fn tools_text_reasoning_and_cache_usage() {
    let body = [
        event("messageStart", json!({"role": "assistant"})),
        event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "hmm"}}}),
        ),
        event("contentBlockStop", json!({"contentBlockIndex": 0})),
        event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 1, "delta": {"text": "Let me check."}}),
        ),
        event("contentBlockStop", json!({"contentBlockIndex": 1})),
        event(
            "contentBlockStart",
            json!({"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "tooluse_a", "name": "weather"}}}),
        ),
        event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 2, "delta": {"toolUse": {"input": "{\"city\": \"Paris\"}"}}}),
        ),
        event("contentBlockStop", json!({"contentBlockIndex": 2})),
        event(
            "contentBlockStart",
            json!({"contentBlockIndex": 3, "start": {"toolUse": {"toolUseId": "tooluse_b", "name": "clock"}}}),
        ),
        event("contentBlockStop", json!({"contentBlockIndex": 3})),
        event("messageStop", json!({"stopReason": "tool_use"})),
        event(
            "metadata",
            json!({"usage": {"inputTokens": 10, "outputTokens": 7, "totalTokens": 117,
                "cacheReadInputTokens": 64, "cacheWriteInputTokens": 36},
                "metrics": {"latencyMs": 900}}),
        ),
    ]
    .concat();
    let expected = vec![
        text("Let me check."),
        call(0, Some("tooluse_a"), Some("weather"), ""),
        call(0, None, None, "{\"city\": \"Paris\"}"),
        call(1, Some("tooluse_b"), Some("clock"), ""),
        call(1, None, None, "{}"),
        usage(110, 64, 36, 7),
        end(FinishReason::ToolCalls),
    ];
    assert_eq!(decode(vec![body]).await, expected);
}

#[test]
fn usage_inclusive_or_exclusive_input() {
    let u = json!({"inputTokens": 100, "outputTokens": 5, "totalTokens": 105,
        "cacheReadInputTokens": 80});
    assert_eq!(parse_usage(&u).prompt_tokens, 100);
    let u = json!({"inputTokens": 20, "outputTokens": 5, "totalTokens": 105,
        "cacheReadInputTokens": 80});
    assert_eq!(parse_usage(&u).prompt_tokens, 100);
    let u = json!({"inputTokens": 20, "outputTokens": 5, "cacheWriteInputTokens": 8});
    assert_eq!(parse_usage(&u).prompt_tokens, 28);
}

#[tokio::test]
async fn broken_streams_are_protocol_errors() {
    let whole = text_answer("end_turn");
    // Truncated inside a frame.
    let events = decode(vec![whole[..whole.len() - 3].to_vec()]).await;
    assert_eq!(
        events.last().unwrap().clone().unwrap_err().class,
        ErrorClass::Protocol
    );
    // A flipped payload byte fails the message CRC.
    let mut bad = event(
        "contentBlockDelta",
        json!({"contentBlockIndex": 0, "delta": {"text": "x"}}),
    );
    let at = bad.len() - 8;
    bad[at] ^= 0x20;
    let err = decode(vec![bad]).await[0].clone().unwrap_err();
    assert_eq!(err.class, ErrorClass::Protocol);
    assert!(
        err.message.contains("bad event-stream frame"),
        "{}",
        err.message
    );
    // Ended before messageStop; messageStop without metadata.
    let start = event("messageStart", json!({"role": "assistant"}));
    let err = decode(vec![start.clone()]).await[0].clone().unwrap_err();
    assert_eq!(err.class, ErrorClass::Protocol);
    let stop = event("messageStop", json!({"stopReason": "end_turn"}));
    assert_eq!(
        decode(vec![start, stop]).await,
        vec![end(FinishReason::Stop)]
    );
    // Tool delta for an unknown block; non-JSON payload.
    let stray = event(
        "contentBlockDelta",
        json!({"contentBlockIndex": 4, "delta": {"toolUse": {"input": "{}"}}}),
    );
    assert_eq!(
        decode(vec![stray]).await[0].clone().unwrap_err().class,
        ErrorClass::Protocol
    );
    let junk = frame(
        &[(":message-type", "event"), (":event-type", "messageStop")],
        b"{nope",
    );
    assert_eq!(
        decode(vec![junk]).await[0].clone().unwrap_err().class,
        ErrorClass::Protocol
    );
    // Unknown event types are skipped.
    let body = [
        event("somethingNew", json!({"x": 1})),
        text_answer("end_turn"),
    ]
    .concat();
    assert_eq!(decode(vec![body]).await.len(), 3);
}

#[test]
fn http_error_shapes() {
    let mut h = HeaderMap::new();
    h.insert(
        "x-amzn-errortype",
        HeaderValue::from_static(
            "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/",
        ),
    );
    let e = classify_http_error(
        400,
        &h,
        br#"{"message":"Input is too long for requested model."}"#,
    );
    assert_eq!(e.class, ErrorClass::ContextLengthExceeded);
    assert_eq!(
        e.message,
        "upstream returned HTTP 400 ValidationException: Input is too long for requested model."
    );
    let e = classify_http_error(
        403,
        &HeaderMap::new(),
        br#"{"__type":"com.amazon.coral.service#UnrecognizedClientException","Message":"The security token included in the request is invalid."}"#,
    );
    assert_eq!((e.class, e.retryable), (ErrorClass::Auth, false));
    // An auth failure's body never reaches the client (it may echo the credential).
    assert_eq!(
        e.message,
        "upstream returned HTTP 403 UnrecognizedClientException: the upstream refused the \
         target's credentials (check the key configured for it)"
    );
    let e = classify_http_error(403, &HeaderMap::new(), br#"{"message":"no access"}"#);
    assert_eq!(e.class, ErrorClass::Permission);
    let e = classify_http_error(400, &HeaderMap::new(), b"not json");
    assert_eq!(
        (e.class, e.message.as_str()),
        (
            ErrorClass::InvalidRequest,
            "upstream returned HTTP 400: not json"
        )
    );
    assert_eq!(
        sanitize_error_code("aws#ThrottlingException:http://x"),
        "ThrottlingException"
    );
    assert_eq!(
        exception_class("ModelNotReadyException", ""),
        Some(ErrorClass::Overloaded)
    );
    assert_eq!(exception_class("Nope", ""), None);
}

// ---- request translation ----------------------------------------------------------------

fn build(messages: Value, extra: Value) -> Result<Value, ErrorInfo> {
    build_request(&BEDROCK.request(messages, extra))
}

#[test]
fn system_roles_images_and_inference_config() {
    let images = ["data:image/png;base64,AAAA", "data:image/jpeg;base64,BBBB"];
    let messages = test_support::instructed("What are these?", &images, true);
    let body = build(
        messages,
        json!({"params": {"stop": ["END"], "top_p": 0.9, "max_tokens": 10, "n": 1,
            "presence_penalty": 0.0, "user": "u-1", "parallel_tool_calls": true,
            "response_format": {"type": "text"}}}),
    )
    .unwrap();
    assert_eq!(
        body,
        json!({
            "messages": [
                {"role": "user", "content": [
                    {"text": "What are these?"},
                    {"image": {"format": "png", "source": {"bytes": "AAAA"}}},
                    {"image": {"format": "jpeg", "source": {"bytes": "BBBB"}}},
                    {"text": "Please."}]},
                {"role": "assistant", "content": [{"text": "Deux chats."}]}
            ],
            "system": [{"text": "Be brief."}, {"text": "Use French."}],
            "inferenceConfig": {"maxTokens": 10, "topP": 0.9, "stopSequences": ["END"]}
        })
    );
}

/// The assistant turn that said `said` and called `weather` (`c1`, Paris) and `clock` (`c2`),
/// in Converse form.
fn converse_calls(said: &str) -> Value {
    json!({"role": "assistant", "content": [
        {"text": said},
        {"toolUse": {"toolUseId": "c1", "name": "weather", "input": {"city": "Paris"}}},
        {"toolUse": {"toolUseId": "c2", "name": "clock", "input": {}}}]})
}

/// [`test_support::weather_and_clock`] as Converse `toolConfig.tools`.
fn converse_tools() -> Value {
    json!([
        {"toolSpec": {"name": "weather", "description": "w",
            "inputSchema": {"json": {"type": "object", "additionalProperties": false}}}},
        {"toolSpec": {"name": "clock",
            "inputSchema": {"json": {"type": "object", "properties": {}}}}}])
}

#[test]
fn tool_calls_and_results() {
    let calls = [
        ("c1", "weather", r#"{"city":"Paris"}"#),
        ("c2", "clock", ""),
    ];
    let results = [("c1", "sunny"), ("c2", r#"{"time":"12:00"}"#)];
    let messages = test_support::tool_round(
        "Weather in Paris, and the time?",
        json!("Checking."),
        &calls,
        &results,
    );
    let body = build(messages, test_support::weather_and_clock()).unwrap();
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"text": "Weather in Paris, and the time?"}]},
            converse_calls("Checking."),
            {"role": "user", "content": [
                {"toolResult": {"toolUseId": "c1", "content": [{"text": "sunny"}]}},
                {"toolResult": {"toolUseId": "c2", "content": [{"json": {"time": "12:00"}}]}},
                {"text": "Thanks"}]}
        ])
    );
    assert_eq!(body["toolConfig"], json!({"tools": converse_tools()}));
}

#[test]
fn tool_choice_mapping() {
    let (tools, user, named) = test_support::choice_setup();
    for (choice, expected) in [
        (json!("auto"), None),
        (json!("required"), Some(json!({"any": {}}))),
        (named, Some(json!({"tool": {"name": "w"}}))),
    ] {
        let extra = json!({"tools": tools, "tool_choice": choice});
        let body = build(user.clone(), extra).unwrap();
        assert_eq!(body["toolConfig"].get("toolChoice"), expected.as_ref());
    }
    // `none` without tool history: no tools at all.
    let body = build(user.clone(), json!({"tools": tools, "tool_choice": "none"})).unwrap();
    assert!(body.get("toolConfig").is_none());
    // `none` with tool history: Bedrock needs toolConfig, so it cannot be honoured.
    let history = json!([{"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "r"}]);
    let err = build(history, json!({"tools": tools, "tool_choice": "none"})).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tool_choice"));
    let err = build(
        user.clone(),
        json!({"tools": tools, "tool_choice": "sometimes"}),
    );
    assert_eq!(err.unwrap_err().param.as_deref(), Some("tool_choice"));
    // tool_choice without tools is ignored.
    assert!(
        build(user, json!({"tool_choice": "required"}))
            .unwrap()
            .get("toolConfig")
            .is_none()
    );
}

#[test]
fn rejects_what_converse_cannot_take() {
    let user = || json!([{"role": "user", "content": "x"}]);
    for (params, param) in [
        (json!({"n": 2}), "n"),
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (json!({"seed": 7}), "seed"),
        (json!({"presence_penalty": 0.5}), "presence_penalty"),
        (json!({"frequency_penalty": -1.0}), "frequency_penalty"),
    ] {
        let err = build(user(), json!({"params": params})).unwrap_err();
        assert_eq!(
            (err.class, err.param.as_deref()),
            (ErrorClass::InvalidRequest, Some(param))
        );
    }
    let web_image = json!([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://e.com/cat.png"}}]}]);
    let err = build(web_image, json!({})).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("messages"));
    assert!(err.message.contains("data: URLs"), "{}", err.message);
    let svg = json!([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/svg+xml;base64,AA"}}]}]);
    assert!(
        build(svg, json!({}))
            .unwrap_err()
            .message
            .contains("image/svg+xml")
    );
    let bad_args = json!([{"role": "assistant", "tool_calls": [
        {"id": "t", "type": "function", "function": {"name": "w", "arguments": "[1]"}}]}]);
    assert!(build(bad_args, json!({})).is_err());
    let no_id = json!([{"role": "tool", "content": "r"}]);
    assert!(
        build(no_id, json!({}))
            .unwrap_err()
            .message
            .contains("tool_call_id")
    );
    let only_system = json!([{"role": "system", "content": "x"}]);
    assert_eq!(
        build(only_system, json!({})).unwrap_err().param.as_deref(),
        Some("messages")
    );
}

/// A rich conversation (system and developer instructions, images, an inline PDF, tool calls
/// and text / JSON results, sampling parameters, tools and `required`): the exact body. Fields
/// Converse has no place for (`user`, `parallel_tool_calls`, `top_k`, `reasoning_effort`,
/// `cache_control`, thinking blocks) are not sent.
#[test]
fn whole_body_of_a_rich_request() {
    let mut messages = test_support::rich_opening(json!([
        {"type": "image_url", "image_url": {"url": "data:image/webp;base64,AAAA"}},
        {"type": "text", "text": ""},
        {"type": "file", "file": {"filename": "report_v2.pdf",
            "file_data": "data:application/pdf;base64,JVBE"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBF"}}]));
    messages.insert(2, json!({"role": "system", "content": ""}));
    messages.extend(test_support::rich_tool_round());
    messages.extend([
        json!({"role": "tool", "tool_call_id": "c3", "content": "[1]"}),
        json!({"role": "user", "content": "Thanks"}),
        json!({"role": "assistant", "content": ""}),
    ]);
    let messages = Value::Array(messages);
    let mut extra = test_support::weather_and_clock();
    extra["tool_choice"] = json!("required");
    extra["params"] = json!({"max_tokens": 300, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "stop": ["END", "STOP"], "user": "u-1", "parallel_tool_calls": false,
        "reasoning_effort": "low", "frequency_penalty": 0.0});
    let body = build(messages, extra).unwrap();
    assert_eq!(
        body,
        json!({
            "system": [{"text": "Be brief."}, {"text": "Use French."}],
            "messages": [
                {"role": "user", "content": [
                    {"text": "Look:"},
                    {"image": {"format": "webp", "source": {"bytes": "AAAA"}}},
                    {"document": {"format": "pdf", "name": "report v2 pdf",
                        "source": {"bytes": "JVBE"}}},
                    {"document": {"format": "pdf", "name": "document",
                        "source": {"bytes": "JVBF"}}}]},
                converse_calls("Let me check."),
                {"role": "user", "content": [
                    {"toolResult": {"toolUseId": "c1", "content": [{"text": "sunny"}]}},
                    {"toolResult": {"toolUseId": "c2", "content": [{"json": {"time": "12:00"}}]}},
                    {"toolResult": {"toolUseId": "c3", "content": [{"text": "[1]"}]}},
                    {"text": "Thanks"}]}
            ],
            "inferenceConfig": {"maxTokens": 300, "temperature": 0.5, "topP": 0.9,
                "stopSequences": ["END", "STOP"]},
            "toolConfig": {
                "tools": converse_tools(),
                "toolChoice": {"any": {}}
            }
        })
    );
    // A named choice, and no inferenceConfig when no parameter is given.
    let user = json!([{"role": "user", "content": "x"}]);
    let mut extra = test_support::weather_and_clock();
    extra["tool_choice"] = json!({"type": "function", "function": {"name": "clock"}});
    let body = build(user, extra).unwrap();
    assert_eq!(
        body,
        json!({
            "messages": [{"role": "user", "content": [{"text": "x"}]}],
            "toolConfig": {
                "tools": converse_tools(),
                "toolChoice": {"tool": {"name": "clock"}}
            }
        })
    );
}
