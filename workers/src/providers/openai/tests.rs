//! Unit tests of the OpenAI adapter: request bodies, and the stream translator's two read paths.
#![allow(clippy::unwrap_used)]
use super::*;
use serde_json::json;

/// A rich request: every message role and part kind, Anthropic-only fields (thinking
/// blocks, cache breakpoints, `top_k`, the Anthropic passthrough), every OpenAI parameter
/// and the OpenAI passthrough.
pub(crate) fn rich_request() -> ChatRequest {
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
        {"role": "user", "name": "ann", "cache_control": {"type": "ephemeral"}, "content": [
            {"type": "text", "text": "Look:"},
            {"type": "image_url",
                "image_url": {"url": "https://e.com/a.png", "detail": "high"}},
            {"type": "file", "file": {"filename": "r.pdf",
                "file_data": "data:application/pdf;base64,JVBE"}}]},
        {"role": "assistant", "content": "Let me check.", "thinking_blocks": [
            {"type": "thinking", "thinking": "t", "signature": "sig"}],
            "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "Thanks"}
    ]);
    let extra = json!({
        "tools": [{"type": "function", "function": {"name": "weather", "description": "w",
            "parameters": {"type": "object"}, "strict": true}}],
        "tool_choice": "auto",
        "params": {"max_tokens": 300, "temperature": 0.5, "top_p": 0.9, "stop": ["END"],
            "n": 2, "seed": 7, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "response_format": {"type": "json_object"}, "parallel_tool_calls": false,
            "user": "u-1", "logprobs": true, "top_logprobs": 2, "reasoning_effort": "low",
            "top_k": 3},
        "passthrough": {
            "openai": {"body": {"service_tier": "flex", "logit_bias": {"1": 2}}},
            "anthropic": {"body": {"thinking": {"type": "adaptive"}}}}});
    let target = ("t", "openai", "gpt-test");
    crate::providers::test_support::request("m", target, messages, extra)
}

/// [`rich_request`]'s body for `kind` (`max_key` and `developer` as that dialect sends
/// them, `openai_only` the fields only OpenAI itself gets).
pub(crate) fn rich_body(max_key: &str, developer: &str, openai_only: bool) -> Value {
    let mut body = json!({
        "model": "up",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": developer, "content": [{"type": "text", "text": "Use French."}]},
            {"role": "user", "name": "ann", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url",
                    "image_url": {"url": "https://e.com/a.png", "detail": "high"}},
                {"type": "file", "file": {"filename": "r.pdf",
                    "file_data": "data:application/pdf;base64,JVBE"}}]},
            {"role": "assistant", "content": "Let me check.",
                "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "user", "content": "Thanks"}
        ],
        "tools": [{"type": "function", "function": {"name": "weather", "description": "w",
            "parameters": {"type": "object"}, "strict": true}}],
        "tool_choice": "auto",
        "temperature": 0.5,
        "top_p": 0.9,
        max_key: 300,
        "stop": ["END"],
        "n": 2,
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "response_format": {"type": "json_object"},
        "parallel_tool_calls": false,
        "user": "u-1",
        "logprobs": true,
        "top_logprobs": 2,
        "stream": true,
        "stream_options": {"include_usage": true}
    });
    if openai_only {
        let o = body.as_object_mut().unwrap();
        o.insert("reasoning_effort".into(), json!("low"));
        o.insert("service_tier".into(), json!("flex"));
        o.insert("logit_bias".into(), json!({"1": 2}));
    }
    body
}

/// The whole body for OpenAI and for a compatible server; a minimal request's body.
#[test]
fn whole_bodies() {
    let req = rich_request();
    let openai =
        Value::Object(build_object(ChatDialect::of(ProviderKind::Openai), "up", &req).unwrap());
    assert_eq!(
        openai,
        rich_body("max_completion_tokens", "developer", true)
    );
    let compatible = Value::Object(
        build_object(ChatDialect::of(ProviderKind::OpenaiCompatible), "up", &req).unwrap(),
    );
    assert_eq!(compatible, rich_body("max_tokens", "system", false));
    let user = json!([{"role": "user", "content": "x"}]);
    let target = ("t", "openai", "gpt-test");
    let extra = json!({"stream": false});
    let req = crate::providers::test_support::request("m", target, user, extra);
    assert_eq!(
        Value::Object(build_object(ChatDialect::of(ProviderKind::Openai), "up", &req).unwrap()),
        json!({"model": "up", "messages": [{"role": "user", "content": "x"}]})
    );
    let mut req = rich_request();
    req.params.user = Some("u".repeat(65));
    let o = build_object(ChatDialect::of(ProviderKind::Openai), "up", &req).unwrap();
    assert_eq!(o["user"], json!(user_field(&"u".repeat(65))));
}

/// The embeddings body: floats, with `dimensions` and `user` when given.
#[test]
fn embed_bodies() {
    let req: EmbedRequest = serde_json::from_value(json!({
        "id": "01900000-0000-7000-8000-000000000000", "model": "m",
        "target": {"id": "t", "provider": "openai", "upstream_model": "e"},
        "input": ["a", "b"], "dimensions": 8, "user": "u-1", "deadline_ms": 0}))
    .unwrap();
    assert_eq!(
        serde_json::to_value(embed_body("up", &req)).unwrap(),
        json!({"model": "up", "input": ["a", "b"], "encoding_format": "float",
            "dimensions": 8, "user": "u-1"})
    );
}

/// Every chunk reads the same on the typed path ([`chunk::parse`]) as on the `Value` path, for
/// one choice and for several; chunks the typed path declines are read by the `Value` path.
#[test]
fn typed_and_value_paths_agree() {
    let typed = [
        r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"Hel\"lo \u00e9"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning_content":"think"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning":"r2","content":"c"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning_content":null,"reasoning":"r3"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":""}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":1}"}}]}}]}"#,
        r#"{"choices":[{"index":1,"delta":{"content":"second"}}]}"#,
        r#"{"choices":[{"delta":{"content":"no index"},"logprobs":null}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"u"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        r#"{"choices":[{"index":1,"delta":null,"finish_reason":"length"}]}"#,
    ];
    let declined = [
        r#"{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[{"token":"x","logprob":-0.1}]}}]}"#,
        r#"{"choices":[{"index":0.0,"delta":{"content":[1]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}"#,
        r#"{"choices":[],"object":"error","message":"overloaded"}"#,
        r#"{"\u0065rror":{"message":"overloaded","code":400},"choices":[]}"#,
        r#"{"choices":[],"object":"\u0065rror","message":"overloaded"}"#,
        r#"{"choices":[], "type" : "error"}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"x"}}],"error":null}"#,
        r#"[[[0,null,{"content":"by position"}]]]"#,
        r#"{"choices":[[0,null,{"content":"by position"},"stop"]]}"#,
        r#"{"choices":[{"index":0,"delta":[null,null,"x"]}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[[0,"id",["f","{}"]]]}}]}"#,
    ];
    let last = r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":2}},"service_tier":"flex"}"#;
    for c in typed.iter().chain([&last]) {
        assert!(chunk::parse(c).is_some(), "typed path declined {c}");
    }
    for c in declined {
        assert!(chunk::parse(c).is_none(), "typed path took {c}");
    }
    for multi in [false, true] {
        let new = || OpenAiTranslator {
            multi,
            ..OpenAiTranslator::default()
        };
        let (mut by_event, mut by_value) = (new(), new());
        let (mut a, mut b) = (VecDeque::new(), VecDeque::new());
        for c in typed.iter().chain(&declined).chain([&last]) {
            let ev = SseEvent {
                data: (*c).to_owned(),
                ..SseEvent::default()
            };
            let ended = by_event.on_event(ev, &mut a);
            assert_eq!(
                ended,
                by_value.on_value(&serde_json::from_str(c).unwrap(), &mut b),
                "{c}"
            );
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{c}");
        }
        assert!(
            format!("{a:?}").contains("service_tier: Some(Flex)"),
            "{a:?}"
        );
    }
}

/// Every `chat.completion` reads the same on the typed path ([`completion::parse`]) as on the
/// `Value` path ([`parse_completion`]); bodies the typed path declines are read by the `Value`
/// path.
#[test]
fn typed_and_value_completions_agree() {
    let typed = [
        r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hel\"lo \u00e9","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":3,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":4,"audio_tokens":1,"accepted_prediction_tokens":0}},"service_tier":"flex","system_fingerprint":"fp"}"#,
        r#"{"choices":[{"message":{"content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"a\":1}"}},{"type":"function","function":{"name":"put"}}]},"finish_reason":"tool_calls"}]}"#,
        r#"{"choices":[{"index":1,"message":{"content":"second"},"finish_reason":"length"},{"index":0,"message":{"content":"first","reasoning_content":"think"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        r#"{"choices":[{"index":0,"message":{"content":"x","reasoning_content":""}}],"usage":null,"service_tier":null}"#,
        r#"{"choices":[{"index":0,"message":null,"finish_reason":"content_filter"}],"usage":{"prompt_tokens":null,"prompt_tokens_details":null}}"#,
        r#"{"choices":[{"index":0,"message":{"content":"x","tool_calls":null}}]}"#,
    ];
    let declined = [
        r#"{"choices":[{"index":0,"message":{"content":"x"},"logprobs":{"content":[{"token":"x","logprob":-0.1}]}}]}"#,
        r#"{"choices":[{"index":0,"message":{"content":[{"type":"text","text":"parts"}]}}]}"#,
        r#"{"choices":[{"index":0,"message":{"content":"a","content":"b"}}]}"#,
        r#"{"choices":[{"index":0,"message":{"content":"a","tool_calls":[{"id":"c","function":{"name":"f","arguments":{"a":1}}}]}}]}"#,
        r#"{"choices":[{"index":0.0,"message":{"content":"a"}}]}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0}}"#,
        r#"{"object":"chat.completion"}"#,
        r#"{"choices":[{"index":0,"message":{"content":"a"}}],"error":null}"#,
        r#"{"choices":[{"index":0,"message":{"content":"a"}}],"usage":{"prompt_tokens":"7"}}"#,
        r#"{"\u0065rror":{"message":"overloaded"},"choices":[{"message":{"content":"hi"}}]}"#,
        r#"{"object":"\u0065rror","choices":[{"message":{"content":"hi"}}]}"#,
        r#"{"type" : "err\u006fr","choices":[{"message":{"content":"hi"}}]}"#,
        r#"[[[]]]"#,
        r#"{"choices":[[0,null,["hi"],"length"]]}"#,
        r#"{"choices":[{"message":["a"]}]}"#,
        r#"{"choices":[{"message":{"content":"a"}}],"usage":[3,4]}"#,
        r#"{"choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":1,"prompt_tokens_details":[5]}}"#,
        r#"{"choices":[{"message":{"content":"a","tool_calls":[["id",["f","{}"]]]}}]}"#,
    ];
    for body in typed {
        let fast = completion::parse(body.as_bytes());
        let slow = parse_completion(&serde_json::from_str(body).unwrap());
        assert_eq!(fast, Some(slow.unwrap()), "{body}");
    }
    for body in declined {
        assert_eq!(
            completion::parse(body.as_bytes()),
            None,
            "typed path took {body}"
        );
    }
}
