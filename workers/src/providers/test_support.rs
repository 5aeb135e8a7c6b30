//! Test helpers shared by the provider adapters' test modules.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::provider::Provider;
use futures::StreamExt;
use serde_json::{Value, json};
use switchyard_mock::MockUpstream;
use switchyard_schemas::config::TargetConfig;
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, FinishReason, FrameBody, Usage};

/// One normalised event of an upstream stream.
pub(crate) type Item = Result<FrameBody, ErrorInfo>;

/// A streaming request for `model` on target (`id`, `provider`, `upstream_model`), with `extra`
/// top-level fields merged in.
pub(crate) fn request(
    model: &str,
    target: (&str, &str, &str),
    messages: Value,
    extra: Value,
) -> ChatRequest {
    let (id, provider, upstream_model) = target;
    let mut v = json!({"id": "01900000-0000-7000-8000-000000000000", "model": model,
        "target": {"id": id, "provider": provider, "upstream_model": upstream_model},
        "messages": messages, "stream": true, "deadline_ms": 0});
    if let (Some(obj), Value::Object(extra)) = (v.as_object_mut(), extra) {
        obj.extend(extra);
    }
    serde_json::from_value(v).unwrap()
}

/// The last user message text with a `#mock` directive line steering the mock.
pub(crate) fn directive_messages(directives: &str) -> Value {
    json!([{"role": "user", "content": format!("hi\n#mock {directives}")}])
}

/// A conversation with a system and a developer instruction, a user turn of `question` and
/// `images` (URLs), and the user's "Please."; when `answered`, then the assistant's answer and
/// an empty user turn (which the adapters drop).
pub(crate) fn instructed(question: &str, images: &[&str], answered: bool) -> Value {
    let mut content = vec![json!({"type": "text", "text": question})];
    content.extend(
        images
            .iter()
            .map(|url| json!({"type": "image_url", "image_url": {"url": url}})),
    );
    let mut messages = vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "developer", "content": [{"type": "text", "text": "Use French."}]}),
        json!({"role": "user", "content": content}),
        json!({"role": "user", "content": "Please."}),
    ];
    if answered {
        messages.push(json!({"role": "assistant", "content": "Deux chats."}));
        messages.push(json!({"role": "user", "content": ""}));
    }
    Value::Array(messages)
}

/// A user `question`, the assistant's turn (`said`, then the `calls` as (id, name, arguments)),
/// the tool `results` as (call id, content) in the given order, and the user's "Thanks".
pub(crate) fn tool_round(
    question: &str,
    said: Value,
    calls: &[(&str, &str, &str)],
    results: &[(&str, &str)],
) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, arguments)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    let mut messages = vec![
        json!({"role": "user", "content": question}),
        json!({"role": "assistant", "content": said, "tool_calls": calls}),
    ];
    messages.extend(
        results
            .iter()
            .map(|(id, content)| json!({"role": "tool", "tool_call_id": id, "content": content})),
    );
    messages.push(json!({"role": "user", "content": "Thanks"}));
    Value::Array(messages)
}

/// How the rich conversations of the whole-body tests start: a system and a developer
/// instruction, then a user turn with an Anthropic cache breakpoint of the text "Look:" and
/// `parts`.
pub(crate) fn rich_opening(parts: Value) -> Vec<Value> {
    let mut content = vec![json!({"type": "text", "text": "Look:"})];
    content.extend(parts.as_array().cloned().unwrap_or_default());
    vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "developer", "content": [{"type": "text", "text": "Use French."}]}),
        json!({"role": "user", "cache_control": {"type": "ephemeral"}, "content": content}),
    ]
}

/// The tool round of the rich conversations: the assistant's "Let me check." with a signed
/// thinking block and the calls `c1` (`weather`, Paris) and `c2` (`clock`, no arguments), then
/// their results `sunny` and `{"time":"12:00"}`.
pub(crate) fn rich_tool_round() -> Vec<Value> {
    vec![
        json!({"role": "assistant", "content": "Let me check.",
            "thinking_blocks": [{"type": "thinking", "thinking": "t", "signature": "sig"}],
            "tool_calls": [
                {"id": "c1", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "clock", "arguments": ""}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
        json!({"role": "tool", "tool_call_id": "c2", "content": "{\"time\":\"12:00\"}"}),
    ]
}

/// `tools`: `weather` (described, a closed object) and `clock` (no parameters).
pub(crate) fn weather_and_clock() -> Value {
    json!({"tools": [
        {"type": "function", "function": {"name": "weather", "description": "w",
            "parameters": {"type": "object", "additionalProperties": false}}},
        {"type": "function", "function": {"name": "clock"}}]})
}

/// What the `tool_choice` tests start from: one tool `w`, one user message, and the choice
/// naming `w`.
pub(crate) fn choice_setup() -> (Value, Value, Value) {
    (
        json!([{"type": "function", "function": {"name": "w"}}]),
        json!([{"role": "user", "content": "x"}]),
        json!({"type": "function", "function": {"name": "w"}}),
    )
}

/// Runs `req` against `target` through `provider` and collects every event.
pub(crate) async fn collect(
    provider: &dyn Provider,
    target: &TargetConfig,
    req: &ChatRequest,
) -> Result<Vec<Item>, ErrorInfo> {
    let up = crate::provider::Upstream {
        http: &reqwest::Client::new(),
        target,
        base_url: &target.base_url,
    };
    Ok(provider.stream_chat(up, req).await?.collect().await)
}

/// Feeds `chunks` as separate writes through the SSE parser and a fresh `T`, as `translate_sse`
/// does with a live response.
pub(crate) fn translate_chunks<T: crate::provider::SseTranslator + Default>(
    chunks: &[&str],
) -> Vec<Item> {
    let (mut parser, mut events) = (crate::sse::SseParser::new(), Vec::new());
    for chunk in chunks {
        parser.push(chunk.as_bytes(), &mut events).unwrap();
    }
    events.extend(parser.finish());
    let (mut tr, mut out) = (T::default(), std::collections::VecDeque::new());
    if !events.into_iter().any(|ev| tr.on_event(ev, &mut out)) {
        tr.on_eof(&mut out);
    }
    out.into_iter().collect()
}

/// For each `(name, class)` case, feeds the one SSE event `event(name)` through a fresh `T`:
/// it must give exactly one event, an error of `class`.
pub(crate) fn in_stream_errors<T: crate::provider::SseTranslator + Default>(
    cases: &[(&str, ErrorClass)],
    event: impl Fn(&str) -> String,
) {
    for (name, class) in cases {
        let events = translate_chunks::<T>(&[&event(name)]);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].clone().unwrap_err().class, *class, "{name}");
    }
}

/// The events of the mock's "Hello, world" in two chunks: the texts "Hello," and " world",
/// then `usage` and a `stop`.
pub(crate) fn hello_world(usage: Item) -> Vec<Item> {
    vec![
        text("Hello,"),
        text(" world"),
        usage,
        end(FinishReason::Stop),
    ]
}

/// The tool-call pieces among `events`, in order, as (index, id, name, arguments).
pub(crate) fn tool_call_pieces(
    events: &[Item],
) -> impl Iterator<Item = (usize, Option<&String>, Option<&String>, &str)> {
    events.iter().filter_map(|e| match e {
        Ok(FrameBody::ToolCall {
            index,
            id,
            name,
            arguments,
        }) => Some((
            *index as usize,
            id.as_ref(),
            name.as_ref(),
            arguments.as_str(),
        )),
        _ => None,
    })
}

/// A text event.
pub(crate) fn text(t: &str) -> Item {
    Ok(FrameBody::Text { text: t.into() })
}

/// The end event.
pub(crate) fn end(finish_reason: FinishReason) -> Item {
    Ok(FrameBody::End { finish_reason })
}

/// A usage event with these counts (the rest zero).
pub(crate) fn usage(
    prompt: u64,
    cached: u64,
    written: u64,
    completion: u64,
    reasoning: u64,
) -> Item {
    let usage = Usage {
        prompt_tokens: prompt,
        cached_tokens: cached,
        cache_write_tokens: written,
        completion_tokens: completion,
        reasoning_tokens: reasoning,
        ..Default::default()
    };
    Ok(FrameBody::Usage { usage })
}

/// The text pieces of `events`, in order; a tool call among them fails the test (a structured
/// answer must come back as text).
pub(crate) fn texts_only(events: &[Item]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Ok(FrameBody::Text { text }) => Some(text.as_str()),
            Ok(FrameBody::ToolCall { .. }) => panic!("tool call in {events:?}"),
            _ => None,
        })
        .collect()
}

/// One adapter under test: its provider, the public model and target its requests name, and the
/// rest of its target configuration.
pub(crate) struct Adapter {
    /// The provider.
    pub provider: &'static dyn Provider,
    /// The request's `model`.
    pub model: &'static str,
    /// The request's target, and the configured target's: (`id`, `provider`, `upstream_model`).
    pub target: (&'static str, &'static str, &'static str),
    /// The configured target's other fields as JSON, `{base}` standing for the base URL; they
    /// win over [`Adapter::target`]'s.
    pub config: &'static str,
}

/// The Anthropic adapter of the tests.
pub(crate) const ANTHROPIC: Adapter = Adapter {
    provider: &crate::providers::anthropic::AnthropicProvider,
    model: "demo/claude",
    target: ("a", "anthropic", "claude-test"),
    config: r#"{"base_url": "{base}/v1"}"#,
};

/// The Azure OpenAI adapter of the tests (default `api_version`).
pub(crate) const AZURE: Adapter = Adapter {
    provider: &crate::providers::azure::AzureOpenAiProvider,
    model: "demo/azure",
    target: ("az", "azure_openai", "gpt4o-dep"),
    config: r#"{"base_url": "{base}"}"#,
};

/// The Bedrock adapter of the tests (static test credentials).
pub(crate) const BEDROCK: Adapter = Adapter {
    provider: &crate::providers::bedrock::BedrockProvider,
    model: "demo/bedrock",
    target: ("b", "bedrock", "m"),
    config: r#"{"base_url": "{base}/v1",
        "upstream_model": "anthropic.claude-3-haiku-20240307-v1:0",
        "aws": {"region": "us-east-1", "access_key_id": "AKID",
            "secret_access_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}}"#,
};

/// The Gemini adapter of the tests.
pub(crate) const GEMINI: Adapter = Adapter {
    provider: &crate::providers::gemini::GeminiProvider,
    model: "demo/gemini",
    target: ("g", "gemini", "gemini-test"),
    config: r#"{"base_url": "{base}/v1beta"}"#,
};

impl Adapter {
    /// The configured target, at `base`.
    pub(crate) fn target(&self, base: &str) -> TargetConfig {
        let (id, provider, upstream_model) = self.target;
        let mut v = json!({"id": id, "provider": provider, "upstream_model": upstream_model});
        let config: Value = serde_json::from_str(&self.config.replace("{base}", base)).unwrap();
        if let (Some(obj), Value::Object(config)) = (v.as_object_mut(), config) {
            obj.extend(config);
        }
        serde_json::from_value(v).unwrap()
    }

    /// A streaming request with `messages` and `extra` top-level fields (see [`request`]).
    pub(crate) fn request(&self, messages: Value, extra: Value) -> ChatRequest {
        request(self.model, self.target, messages, extra)
    }

    /// A one-message request steering the mock with a `#mock` directive line.
    pub(crate) fn ask(&self, directives: &str) -> ChatRequest {
        self.request(directive_messages(directives), json!({}))
    }

    /// The plain-text request of the wire tests: "Be brief." as the system instruction and a
    /// user "hi" steering the mock to answer "Hello, world" in two chunks (5 prompt tokens, 2
    /// completion tokens); `temperature` 0.2, `max_tokens` 64.
    pub(crate) fn plain_text_request(&self) -> ChatRequest {
        self.request(
            json!([{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi\n#mock text=Hello,+world chunks=2 prompt_tokens=5 completion_tokens=2"}]),
            json!({"params": {"temperature": 0.2, "max_tokens": 64}}),
        )
    }

    /// A request declaring the tool `get_weather(city)` and requiring a tool call, the mock
    /// asked for two calls (9 prompt tokens).
    pub(crate) fn weather_calls_request(&self) -> ChatRequest {
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        self.request(
            json!([{"role": "user", "content": "Weather?\n#mock tool_calls=2 prompt_tokens=9"}]),
            json!({"tools": tools, "tool_choice": "required"}),
        )
    }

    /// Runs `req` against target `t` and collects every event.
    pub(crate) async fn run_with(
        &self,
        t: &TargetConfig,
        req: &ChatRequest,
    ) -> Result<Vec<Item>, ErrorInfo> {
        collect(self.provider, t, req).await
    }

    /// Runs the one-message request [`Adapter::ask`] of `directives` on `mock`.
    pub(crate) async fn run_ask(
        &self,
        mock: &MockUpstream,
        directives: &str,
    ) -> Result<Vec<Item>, ErrorInfo> {
        self.run(mock, &self.ask(directives)).await
    }

    /// Runs `req` against the adapter's target on `mock`.
    pub(crate) async fn run(
        &self,
        mock: &MockUpstream,
        req: &ChatRequest,
    ) -> Result<Vec<Item>, ErrorInfo> {
        self.run_with(&self.target(&mock.base_url()), req).await
    }
}

// ---- checks every adapter with that capability passes against the mock (see `mock_checks!`) ----

/// `cached_tokens=3 prompt_tokens=10 completion_tokens=4`: no error, and the stream ends with
/// `usage` (the provider's reading of those counts) and a `stop`. Returns the events.
pub(crate) async fn usage_values_are_exact(a: &Adapter, usage: Item) -> Vec<Item> {
    let mock = MockUpstream::start().await.unwrap();
    let events = a
        .run_ask(
            &mock,
            "cached_tokens=3 prompt_tokens=10 completion_tokens=4",
        )
        .await
        .unwrap();
    assert!(events.iter().all(Result::is_ok), "{events:?}");
    let tail = [usage, end(FinishReason::Stop)];
    assert_eq!(events[events.len() - 2..], tail);
    events
}

/// `max_tokens: 2` cuts the text after two words and finishes with `length`.
pub(crate) async fn max_tokens_finishes_with_length(a: &Adapter) {
    let mock = MockUpstream::start().await.unwrap();
    let mut req = a.ask("text=one+two+three+four");
    req.params.max_tokens = Some(2);
    let events = a.run(&mock, &req).await.unwrap();
    assert_eq!(events.last(), Some(&end(FinishReason::Length)));
    assert_eq!(events[..2], [text("one "), text("two")]);
}

/// `error_after=2`: two text chunks (after the provisional usage of a provider that reports one
/// first), then a retryable error of `class`, which is returned.
pub(crate) async fn error_after_two_chunks(
    a: &Adapter,
    provisional_usage: bool,
    class: ErrorClass,
) -> ErrorInfo {
    let mock = MockUpstream::start().await.unwrap();
    let events = a.run_ask(&mock, "error_after=2").await.unwrap();
    let lead = usize::from(provisional_usage);
    assert_eq!(events.len(), lead + 3, "{events:?}");
    if provisional_usage {
        assert!(matches!(events[0], Ok(FrameBody::Usage { .. })));
    }
    assert!(matches!(
        events[lead..lead + 2],
        [Ok(FrameBody::Text { .. }), Ok(FrameBody::Text { .. })]
    ));
    let err = events[lead + 2].clone().unwrap_err();
    assert_eq!((err.class, err.retryable), (class, true));
    err
}

/// HTTP 429 with `retry-after: 7` is `rate_limited` after 7 s, 503 a retryable `overloaded`, 400
/// a final `invalid_request`. Returns the 429 and the 400 errors.
pub(crate) async fn error_statuses(a: &Adapter) -> (ErrorInfo, ErrorInfo) {
    let mock = MockUpstream::start().await.unwrap();
    let limited = a
        .run_ask(&mock, "status=429 retry_after=7")
        .await
        .unwrap_err();
    assert_eq!(
        (
            limited.class,
            limited.upstream_status,
            limited.retry_after_ms
        ),
        (ErrorClass::RateLimited, Some(429), Some(7000))
    );
    let err = a.run_ask(&mock, "status=503").await.unwrap_err();
    assert_eq!((err.class, err.retryable), (ErrorClass::Overloaded, true));
    let invalid = a.run_ask(&mock, "status=400").await.unwrap_err();
    assert_eq!(
        (invalid.class, invalid.retryable),
        (ErrorClass::InvalidRequest, false)
    );
    (limited, invalid)
}

/// The capability matrix: for each adapter (a module of tests), one `#[tokio::test]` per line
/// `test => check(args…);`, running the check above with the adapter and its expected values.
macro_rules! mock_checks {
    ($($module:ident: $adapter:expr => { $($test:ident => $check:ident($($arg:expr),*);)* })*) => {$(
        mod $module {
            use super::*;
            $(
                #[tokio::test]
                async fn $test() {
                    super::$check(&$adapter, $($arg),*).await;
                }
            )*
        }
    )*};
}

mock_checks! {
    anthropic: ANTHROPIC => {
        in_stream_error_after_two_chunks => error_after_two_chunks(true, ErrorClass::Overloaded);
    }
    azure: AZURE => {
        usage_with_cached_tokens => usage_values_are_exact(usage(10, 3, 0, 4, 0));
        error_statuses => error_statuses();
        in_stream_error_after_two_chunks => error_after_two_chunks(false, ErrorClass::Upstream5xx);
    }
    bedrock: BEDROCK => {
        max_tokens_finishes_with_length => max_tokens_finishes_with_length();
    }
    gemini: GEMINI => {
        usage_values_are_exact => usage_values_are_exact(usage(10, 3, 0, 4, 0));
        max_tokens_finishes_with_length => max_tokens_finishes_with_length();
        in_stream_error_after_two_chunks => error_after_two_chunks(false, ErrorClass::Overloaded);
    }
}
