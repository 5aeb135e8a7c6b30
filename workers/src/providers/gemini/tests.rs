//! Unit tests of the gemini adapter.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::providers::shared::JSON_INSTRUCTION;
use crate::providers::test_support::{self, GEMINI, end, text};
use serde_json::json;
use switchyard_mock::MockUpstream;

/// Feeds `chunks` as separate writes through the SSE parser and the translator.
fn translate_chunks(chunks: &[&str]) -> Vec<Item> {
    test_support::translate_chunks::<GeminiTranslator>(chunks)
}

/// One SSE `data:` event per non-empty line of JSON.
fn sse(lines: &str) -> String {
    lines
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| format!("data: {l}\r\n\r\n"))
        .collect()
}

fn usage(prompt: u64, cached: u64, completion: u64, reasoning: u64) -> Item {
    test_support::usage(prompt, cached, 0, completion, reasoning)
}
fn call(index: u32, id: &str, name: &str, arguments: &str) -> Item {
    Ok(FrameBody::ToolCall {
        index,
        id: Some(id.into()),
        name: Some(name.into()),
        arguments: arguments.into(),
    })
}

#[tokio::test]
async fn plain_text_stream_and_wire_request() {
    let mock = MockUpstream::start().await.unwrap();
    let mut t = GEMINI.target(&mock.base_url());
    t.api_key = switchyard_schemas::Secret::new("AIza-test");
    let events = GEMINI
        .run_with(&t, &GEMINI.plain_text_request())
        .await
        .unwrap();
    assert_eq!(events, test_support::hello_world(usage(5, 0, 2, 0)));
    let sent = &mock.requests()[0];
    assert_eq!(
        sent.path,
        "/v1beta/models/gemini-test:streamGenerateContent"
    );
    assert_eq!(sent.query.as_deref(), Some("alt=sse"));
    assert_eq!(sent.header("x-goog-api-key"), Some("AIza-test"));
    assert_eq!(sent.header("authorization"), None);
    assert_eq!(
        sent.body["systemInstruction"],
        json!({"parts": [{"text": "Be brief."}]})
    );
    assert_eq!(sent.body["contents"][0]["role"], "user");
    assert_eq!(
        sent.body["generationConfig"],
        json!({"temperature": 0.2, "maxOutputTokens": 64})
    );
    assert!(sent.body.get("model").is_none());
}

#[tokio::test]
async fn two_parallel_tool_calls() {
    let mock = MockUpstream::start().await.unwrap();
    let req = GEMINI.weather_calls_request();
    let events = GEMINI.run(&mock, &req).await.unwrap();
    let expected = vec![
        call(0, "call_0", "get_weather", r#"{"city":"Paris"}"#),
        call(1, "call_1", "get_weather", r#"{"city":"London"}"#),
        usage(9, 0, 20, 0),
        end(FinishReason::ToolCalls),
    ];
    assert_eq!(events, expected);
    let sent = &mock.requests()[0].body;
    assert_eq!(
        sent["tools"][0]["functionDeclarations"][0]["name"],
        "get_weather"
    );
    assert_eq!(
        sent["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY"}})
    );
}

#[test]
fn finish_reasons() {
    for (reason, expected) in [
        ("STOP", FinishReason::Stop),
        ("MAX_TOKENS", FinishReason::Length),
        ("SAFETY", FinishReason::ContentFilter),
        ("RECITATION", FinishReason::ContentFilter),
        ("BLOCKLIST", FinishReason::ContentFilter),
        ("PROHIBITED_CONTENT", FinishReason::ContentFilter),
        ("SPII", FinishReason::ContentFilter),
        ("IMAGE_SAFETY", FinishReason::ContentFilter),
        ("OTHER", FinishReason::Stop),
        ("MALFORMED_FUNCTION_CALL", FinishReason::Stop),
    ] {
        let body = sse(&format!(
            r#"{{"candidates": [{{"content": {{"parts": [{{"text": ""}}],"role": "model"}},"finishReason": "{reason}"}}]}}"#
        ));
        assert_eq!(translate_chunks(&[&body]), vec![end(expected)], "{reason}");
    }
    assert_eq!(finish_reason("FINISH_REASON_UNSPECIFIED"), None);
}

/// Usage with thinking and caching; a `thought` part, an id-carrying call, split writes.
#[test]
fn thoughts_cache_and_split_writes() {
    let body = sse(r#"
        {"candidates": [{"content": {"parts": [{"text": "plan…", "thought": true}],"role": "model"}}],"usageMetadata": {"promptTokenCount": 11,"totalTokenCount": 11}}
        {"candidates": [{"content": {"parts": [{"text": "Hi"}],"role": "model"}}],"usageMetadata": {"promptTokenCount": 11,"totalTokenCount": 11}}
        {"candidates": [{"content": {"parts": [{"functionCall": {"id": "fc-9", "name": "now", "args": {}}}, {"functionCall": {"name": "w"}}],"role": "model"},"finishReason": "STOP"}],"usageMetadata": {"promptTokenCount": 100,"cachedContentTokenCount": 64,"candidatesTokenCount": 5,"thoughtsTokenCount": 30,"totalTokenCount": 135}}
    "#);
    let (a, b) = body.split_at(body.find("\"Hi\"").unwrap() + 2);
    let expected = vec![
        text("Hi"),
        call(0, "fc-9", "now", "{}"),
        call(1, "call_1", "w", "{}"),
        usage(100, 64, 35, 30),
        end(FinishReason::ToolCalls),
    ];
    assert_eq!(translate_chunks(&[a, b]), expected);
}

#[test]
fn blocked_prompt_bad_json_and_missing_finish() {
    let blocked = sse(
        r#"{"promptFeedback": {"blockReason": "SAFETY"},"usageMetadata": {"promptTokenCount": 7,"totalTokenCount": 7}}"#,
    );
    let events = translate_chunks(&[&blocked]);
    let err = events[0].clone().unwrap_err();
    assert_eq!((events.len(), err.class), (1, ErrorClass::InvalidRequest));
    assert!(err.message.contains("SAFETY"), "{}", err.message);
    for body in [
        "data: {not json\n\n".to_owned(),
        sse(r#"{"candidates": [{"content": {"parts": [{"text": "cut"}],"role": "model"}}]}"#),
    ] {
        let events = translate_chunks(&[&body]);
        let last = events.last().unwrap().clone().unwrap_err();
        assert_eq!(last.class, ErrorClass::Protocol, "{body}");
    }
}

#[test]
fn in_stream_errors_are_classified() {
    let cases = [
        ("UNAVAILABLE", ErrorClass::Overloaded),
        ("RESOURCE_EXHAUSTED", ErrorClass::RateLimited),
        ("INVALID_ARGUMENT", ErrorClass::InvalidRequest),
        ("DEADLINE_EXCEEDED", ErrorClass::Timeout),
        ("INTERNAL", ErrorClass::Upstream5xx),
    ];
    test_support::in_stream_errors::<GeminiTranslator>(&cases, |status| {
        let data = json!({"error": {"code": 500, "message": "m", "status": status}});
        format!("data: {data}\n\n")
    });
}

#[tokio::test]
async fn error_statuses() {
    let (limited, invalid) = test_support::error_statuses(&GEMINI).await;
    assert!(
        limited.message.contains("Resource has been exhausted"),
        "{}",
        limited.message
    );
    assert_eq!(invalid.upstream_status, Some(400));
}

fn build(messages: Value, extra: Value) -> Result<Value, ErrorInfo> {
    build_request(&GEMINI.request(messages, extra))
}

#[test]
fn system_roles_and_images() {
    let images = [
        "data:image/png;base64,AAAA",
        "https://e.com/a.WEBP?x=1",
        "https://e.com/img",
    ];
    let messages = test_support::instructed("What are these?", &images, true);
    let body = build(
        messages,
        json!({"params": {"stop": ["END"], "seed": 7, "top_p": 0.9, "top_k": 40,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 1, "user": "u-1",
        "reasoning_effort": "high", "logprobs": true}}),
    )
    .unwrap();
    assert_eq!(
        body["systemInstruction"],
        json!({"parts": [{"text": "Be brief."}, {"text": "Use French."}]})
    );
    assert_eq!(
        body["contents"],
        json!([
            {"role": "user", "parts": [
                {"text": "What are these?"},
                {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                {"fileData": {"mimeType": "image/webp", "fileUri": "https://e.com/a.WEBP?x=1"}},
                {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://e.com/img"}},
                {"text": "Please."}]},
            {"role": "model", "parts": [{"text": "Deux chats."}]}
        ])
    );
    assert_eq!(
        body["generationConfig"],
        json!({"topP": 0.9, "topK": 40, "stopSequences": ["END"], "candidateCount": 1, "seed": 7,
            "presencePenalty": 0.5, "frequencyPenalty": -0.5})
    );
    assert!(body.get("tools").is_none() && body.get("toolConfig").is_none());
}

#[test]
fn tool_calls_and_results_with_name_lookup() {
    let calls = [
        ("c1", "weather", r#"{"city":"Paris"}"#),
        ("c2", "clock", ""),
    ];
    let results = [("c2", r#"{"time":"12:00"}"#), ("c1", "sunny")];
    let messages = test_support::tool_round(
        "Weather in Paris, and the time?",
        json!(null),
        &calls,
        &results,
    );
    let body = build(messages, test_support::weather_and_clock()).unwrap();
    assert_eq!(
        body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "Weather in Paris, and the time?"}]},
            {"role": "model", "parts": [
                {"functionCall": {"name": "weather", "args": {"city": "Paris"}},
                    "thoughtSignature": THOUGHT_SIGNATURE_SKIP},
                {"functionCall": {"name": "clock", "args": {}}}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "clock", "response": {"time": "12:00"}}},
                {"functionResponse": {"name": "weather", "response": {"output": "sunny"}}}]},
            {"role": "user", "parts": [{"text": "Thanks"}]}
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"functionDeclarations": [
            {"name": "weather", "description": "w",
                "parametersJsonSchema": {"type": "object", "additionalProperties": false}},
            {"name": "clock"}]}])
    );
    assert!(body.get("toolConfig").is_none());
}

#[test]
fn tool_choice_mapping() {
    let (tools, user, named) = test_support::choice_setup();
    for (choice, expected) in [
        (json!("auto"), json!({"mode": "AUTO"})),
        (json!("none"), json!({"mode": "NONE"})),
        (json!("required"), json!({"mode": "ANY"})),
        (named, json!({"mode": "ANY", "allowedFunctionNames": ["w"]})),
    ] {
        let extra = json!({"tools": tools, "tool_choice": choice});
        let body = build(user.clone(), extra).unwrap();
        assert_eq!(body["toolConfig"]["functionCallingConfig"], expected);
    }
    let err = build(user, json!({"tools": tools, "tool_choice": "sometimes"})).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tool_choice"));
}

#[test]
fn json_mode_and_schema() {
    let user = || json!([{"role": "user", "content": "x"}]);
    let rf = |v: Value| json!({"params": {"response_format": v}});
    let body = build(user(), rf(json!({"type": "json_object"}))).unwrap();
    assert_eq!(
        body["generationConfig"],
        json!({"responseMimeType": "application/json"})
    );
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let body = build(
        user(),
        rf(json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})),
    )
    .unwrap();
    assert_eq!(
        body["generationConfig"],
        json!({"responseMimeType": "application/json", "responseJsonSchema": schema})
    );
    let body = build(user(), rf(json!({"type": "text"}))).unwrap();
    assert!(body.get("generationConfig").is_none());
    for bad in [json!({"type": "json_schema"}), json!({"type": "grammar"})] {
        let err = build(user(), rf(bad)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("response_format"));
    }
}

#[test]
fn rejects_what_gemini_cannot_take() {
    let err = build(
        json!([{"role": "user", "content": "x"}]),
        json!({"params": {"n": 2}}),
    );
    assert_eq!(err.unwrap_err().param.as_deref(), Some("n"));
    let orphan = json!([{"role": "user", "content": "x"},
        {"role": "tool", "tool_call_id": "nope", "content": "r"}]);
    let err = build(orphan, json!({})).unwrap_err();
    assert!(err.message.contains("`nope`"), "{}", err.message);
    let only_system = json!([{"role": "system", "content": "x"}]);
    assert_eq!(
        build(only_system, json!({})).unwrap_err().param.as_deref(),
        Some("messages")
    );
    let bad_image = json!([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}]}]);
    assert!(build(bad_image, json!({})).is_err());
    let bad_args = json!([{"role": "assistant", "tool_calls": [
        {"id": "t", "type": "function", "function": {"name": "w", "arguments": "[1]"}}]}]);
    assert!(build(bad_args, json!({})).is_err());
}

#[test]
fn url_shape() {
    assert_eq!(
        stream_url(
            "https://generativelanguage.googleapis.com/v1beta/",
            "models/gemini-2.5-flash"
        ),
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
}

#[test]
fn gemini_schema_inlines_refs_and_strips_rejected_keywords() {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            // A property *named* like a dropped keyword stays.
            "strict": {"type": "boolean"},
            "place": {"$ref": "#/$defs/Place", "description": "where"},
            "tags": {"type": "array", "items": {"$ref": "#/definitions/Tag"}},
            "either": {"anyOf": [{"$ref": "#/$defs/Place"}, {"type": "null"}]}
        },
        "required": ["place"],
        "$defs": {"Place": {"type": "object", "additionalProperties": false,
            "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        "definitions": {"Tag": {"type": "string", "$comment": "short"}}
    });
    let place = json!({"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"]});
    let mut described = place.clone();
    described["description"] = json!("where");
    assert_eq!(
        gemini_schema(&schema),
        json!({
            "type": "object",
            "properties": {
                "strict": {"type": "boolean"},
                "place": described,
                "tags": {"type": "array", "items": {"type": "string"}},
                "either": {"anyOf": [place, {"type": "null"}]}
            },
            "required": ["place"]
        })
    );
    // A recursive schema is cut after a few levels instead of looping.
    let tree = json!({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
        "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}});
    let out = gemini_schema(&tree).to_string();
    assert!(!out.contains("$ref") && !out.contains("$defs"), "{out}");
}

/// FC-41 (Gemini): the JSON comes back as text, and the upstream saw the translated schema.
#[tokio::test]
async fn fc41_json_schema_answer_is_text() {
    let mock = MockUpstream::start().await.unwrap();
    let t = GEMINI.target(&mock.base_url());
    let schema = json!({"type": "object", "additionalProperties": false,
        "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}},
        "required": ["city", "temp_c"]});
    for stream in [true, false] {
        let req = GEMINI.request(
            test_support::directive_messages(
                "tool_args=%7B%22city%22%3A%22Paris%22%2C%22temp_c%22%3A21%7D",
            ),
            json!({"stream": stream, "params": {"response_format": {"type": "json_schema",
                "json_schema": {"name": "weather", "strict": true, "schema": schema}}}}),
        );
        let events = GEMINI.run_with(&t, &req).await.unwrap();
        let texts = test_support::texts_only(&events).concat();
        assert_eq!(texts, r#"{"city":"Paris","temp_c":21}"#, "stream={stream}");
        assert_eq!(events.last(), Some(&end(FinishReason::Stop)));
    }
    let sent = &mock.requests()[0].body;
    assert_eq!(
        sent["generationConfig"]["responseJsonSchema"],
        json!({"type": "object",
            "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}},
            "required": ["city", "temp_c"]})
    );
}

fn weather_tool_request(directives: &str, extra: Value) -> ChatRequest {
    let mut extra = extra;
    extra["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    extra["params"] = json!({"response_format": {"type": "json_schema", "json_schema": {
        "name": "weather", "schema": {"type": "object", "additionalProperties": false,
            "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}}}}}});
    GEMINI.request(test_support::directive_messages(directives), extra)
}

/// With user tools Gemini gets no JSON mode (2.x rejects it with function calling) but the
/// synthetic `json_tool_call` function, whose call comes back as the text content.
#[test]
fn json_schema_with_user_tools_is_the_json_tool() {
    let body = build_request(&weather_tool_request("", json!({}))).unwrap();
    let decls = &body["tools"][0]["functionDeclarations"];
    assert_eq!(decls[0]["name"], "get_weather");
    assert_eq!(decls[1]["name"], "json_tool_call");
    assert_eq!(
        decls[1]["parametersJsonSchema"],
        json!({"type": "object",
            "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}}})
    );
    assert_eq!(
        body["toolConfig"],
        json!({"functionCallingConfig": {"mode": "AUTO"}})
    );
    assert_eq!(
        body["systemInstruction"],
        json!({"parts": [{"text": JSON_INSTRUCTION}]})
    );
    assert!(body.get("generationConfig").is_none(), "{body}");
    let none = build_request(&weather_tool_request("", json!({"tool_choice": "none"}))).unwrap();
    assert_eq!(
        none["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["json_tool_call"]}})
    );
}

#[tokio::test]
async fn json_tool_call_is_text_and_real_tool_stays_a_tool() {
    let mock = MockUpstream::start().await.unwrap();
    let t = GEMINI.target(&mock.base_url());
    let weather = "%7B%22city%22%3A%22Paris%22%2C%22temp_c%22%3A21%7D";
    for stream in [true, false] {
        let req = weather_tool_request(
            &format!("call=json_tool_call:{weather}"),
            json!({"stream": stream}),
        );
        let events = GEMINI.run_with(&t, &req).await.unwrap();
        assert_eq!(
            events,
            vec![
                text(r#"{"city":"Paris","temp_c":21}"#),
                events[1].clone(),
                end(FinishReason::Stop)
            ],
            "stream={stream}"
        );
        assert!(matches!(events[1], Ok(FrameBody::Usage { .. })));
        let req = weather_tool_request(
            "call=get_weather:%7B%22city%22%3A%22Paris%22%7D",
            json!({"stream": stream}),
        );
        let events = GEMINI.run_with(&t, &req).await.unwrap();
        assert_eq!(
            events[0],
            call(0, "call_0", "get_weather", r#"{"city":"Paris"}"#)
        );
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[2], end(FinishReason::ToolCalls));
    }
}

// --- whole request bodies (pinned before the typed request structs) ---

/// A rich conversation (system and developer instructions, images and documents inline and by
/// URL, tool calls and results by name lookup, every generation parameter, tools and a named
/// `tool_choice`): the exact body.
#[test]
fn whole_body_of_a_rich_request() {
    let mut messages = test_support::rich_opening(json!([
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://e.com/a.gif#x"}},
        {"type": "text", "text": ""},
        {"type": "file", "file": {"filename": "r.pdf",
            "file_data": "data:application/pdf;base64,JVBE"}},
        {"type": "file", "file": {"file_url": "https://e.com/b.pdf"}}]));
    messages.extend(test_support::rich_tool_round());
    messages.extend([
        json!({"role": "tool", "tool_call_id": "c9", "name": "lookup", "content": "[1]"}),
        json!({"role": "user", "content": "Thanks"}),
        json!({"role": "assistant", "content": ""}),
    ]);
    let messages = Value::Array(messages);
    let mut extra = test_support::weather_and_clock();
    extra["tool_choice"] = json!({"type": "function", "function": {"name": "clock"}});
    extra["params"] = json!({"max_tokens": 300, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "stop": ["END"], "n": 1, "seed": 7, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "user": "u-1", "parallel_tool_calls": false, "reasoning_effort": "low",
        "response_format": {"type": "text"}});
    let body = build(messages, extra).unwrap();
    assert_eq!(
        body,
        json!({
            "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Use French."}]},
            "contents": [
                {"role": "user", "parts": [
                    {"text": "Look:"},
                    {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                    {"fileData": {"mimeType": "image/gif", "fileUri": "https://e.com/a.gif#x"}},
                    {"inlineData": {"mimeType": "application/pdf", "data": "JVBE"}},
                    {"fileData": {"mimeType": "application/pdf",
                        "fileUri": "https://e.com/b.pdf"}}]},
                {"role": "model", "parts": [
                    {"text": "Let me check."},
                    {"functionCall": {"name": "weather", "args": {"city": "Paris"}},
                        "thoughtSignature": THOUGHT_SIGNATURE_SKIP},
                    {"functionCall": {"name": "clock", "args": {}}}]},
                {"role": "user", "parts": [
                    {"functionResponse": {"name": "weather", "response": {"output": "sunny"}}},
                    {"functionResponse": {"name": "clock", "response": {"time": "12:00"}}},
                    {"functionResponse": {"name": "lookup", "response": {"output": "[1]"}}}]},
                {"role": "user", "parts": [{"text": "Thanks"}]}
            ],
            "tools": [{"functionDeclarations": [
                {"name": "weather", "description": "w",
                    "parametersJsonSchema": {"type": "object", "additionalProperties": false}},
                {"name": "clock"}]}],
            "toolConfig": {"functionCallingConfig":
                {"mode": "ANY", "allowedFunctionNames": ["clock"]}},
            "generationConfig": {"temperature": 0.5, "topP": 0.9, "topK": 40,
                "maxOutputTokens": 300, "stopSequences": ["END"], "candidateCount": 1,
                "seed": 7, "presencePenalty": 0.5, "frequencyPenalty": -0.5}
        })
    );
}

/// `response_format` with and without user tools: the synthetic JSON tool with the
/// instruction (`auto`), the forced JSON tool (`none`), and JSON mode: the exact bodies.
#[test]
fn whole_bodies_of_json_requests() {
    let user = json!([{"role": "user", "content": "x"}]);
    let schema = json!({"type": "object", "additionalProperties": false,
        "properties": {"a": {"type": "integer"}}});
    let rf = json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}});
    let clock = json!([{"type": "function", "function": {"name": "clock"}}]);
    let json_decl = json!({"name": "json_tool_call",
        "description": "Respond with the final answer as a JSON object matching this schema.",
        "parametersJsonSchema": {"type": "object", "properties": {"a": {"type": "integer"}}}});
    let extra = json!({"tools": clock, "params": {"response_format": rf, "temperature": 0.1}});
    assert_eq!(
        build(user.clone(), extra).unwrap(),
        json!({
            "contents": [{"role": "user", "parts": [{"text": "x"}]}],
            "systemInstruction": {"parts": [{"text": JSON_INSTRUCTION}]},
            "tools": [{"functionDeclarations": [{"name": "clock"}, json_decl]}],
            "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
            "generationConfig": {"temperature": 0.1}
        })
    );
    let extra = json!({"tools": clock, "tool_choice": "none",
        "params": {"response_format": {"type": "json_object"}}});
    let mut object_decl = json_decl.clone();
    object_decl["parametersJsonSchema"] = json!({"type": "object"});
    assert_eq!(
        build(user.clone(), extra).unwrap(),
        json!({
            "contents": [{"role": "user", "parts": [{"text": "x"}]}],
            "tools": [{"functionDeclarations": [{"name": "clock"}, object_decl]}],
            "toolConfig": {"functionCallingConfig":
                {"mode": "ANY", "allowedFunctionNames": ["json_tool_call"]}}
        })
    );
    let extra = json!({"params": {"response_format": rf, "max_tokens": 5}});
    assert_eq!(
        build(user, extra).unwrap(),
        json!({
            "contents": [{"role": "user", "parts": [{"text": "x"}]}],
            "generationConfig": {"maxOutputTokens": 5, "responseMimeType": "application/json",
                "responseJsonSchema": {"type": "object",
                    "properties": {"a": {"type": "integer"}}}}
        })
    );
}
