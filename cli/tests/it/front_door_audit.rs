//! Issue 12, Deliver 3 and 4, as one table: every field Claude Code, the current Anthropic SDK
//! and the official OpenAI SDKs send is accepted by `/v1/messages` and `/v1/chat/completions`,
//! against an Anthropic-style and an OpenAI-style upstream (the built-in mock), with the real
//! API's 400 where it gives one; `GET /v1/models/{id}`; legacy `POST /v1/completions` with
//! `n > 1` (one `choices[]` entry per choice, streamed with its own `index` and finish chunk).
//! Every mismatch of the table is reported at once.

use crate::common::*;
use serde_json::{Value, json};

const ANTHROPIC: &[(&str, &str)] = &[("x-api-key", "sk-x"), ("anthropic-version", "2023-06-01")];
const MODELS: [&str; 2] = ["demo/mock", "demo/claude"];

async fn send(base: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> (u16, String) {
    let (status, _, text) = post_to(base, path, headers, body).await;
    (status, text)
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// Chat Completions bodies: (case, body without `model`, expected status).
fn openai_cases() -> Vec<(&'static str, Value, u16)> {
    let weather = json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    let call = json!({"id": "call_1", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
    vec![
        (
            "store true + metadata",
            json!({"store": true, "metadata": {"run": "a"}}),
            200,
        ),
        ("store false", json!({"store": false}), 200),
        ("service_tier auto", json!({"service_tier": "auto"}), 200),
        (
            "service_tier default",
            json!({"service_tier": "default"}),
            200,
        ),
        ("service_tier flex", json!({"service_tier": "flex"}), 200),
        (
            "service_tier priority",
            json!({"service_tier": "priority"}),
            200,
        ),
        (
            "reasoning_effort minimal",
            json!({"reasoning_effort": "minimal"}),
            200,
        ),
        (
            "reasoning_effort low",
            json!({"reasoning_effort": "low"}),
            200,
        ),
        (
            "reasoning_effort medium",
            json!({"reasoning_effort": "medium", "max_completion_tokens": 4000}),
            200,
        ),
        (
            "reasoning_effort high",
            json!({"reasoning_effort": "high"}),
            200,
        ),
        (
            "logprobs + top_logprobs",
            json!({"logprobs": true, "top_logprobs": 5}),
            200,
        ),
        (
            "logprobs false",
            json!({"logprobs": false, "top_logprobs": null}),
            200,
        ),
        (
            "prediction",
            json!({"prediction": {"type": "content", "content": "Paris is sunny."}}),
            200,
        ),
        ("prediction null", json!({"prediction": null}), 200),
        ("modalities text", json!({"modalities": ["text"]}), 200),
        (
            "stream_options include_obfuscation",
            json!({"stream": true, "stream_options": {"include_usage": true, "include_obfuscation": true}}),
            200,
        ),
        ("user", json!({"user": "user-1234"}), 200),
        (
            "metadata",
            json!({"metadata": {"team": "x", "trace": "y"}}),
            200,
        ),
        (
            "parallel_tool_calls",
            json!({"tools": [weather], "parallel_tool_calls": false}),
            200,
        ),
        (
            "tool_calls null (model_dump history)",
            json!({"messages": [user("hi"), {"role": "assistant", "content": "Hello.",
                "tool_calls": null, "function_call": null, "refusal": null, "audio": null,
                "annotations": []}, user("again")]}),
            200,
        ),
        (
            "tool call without type",
            json!({"tools": [weather], "messages": [user("Weather in Paris?"),
                {"role": "assistant", "content": null, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}),
            200,
        ),
        (
            "legacy functions + function_call + function role",
            json!({"functions": [weather["function"]], "function_call": {"name": "get_weather"},
                "messages": [user("Weather in Paris?"),
                {"role": "assistant", "content": null,
                 "function_call": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"role": "function", "name": "get_weather", "content": "sunny"}]}),
            200,
        ),
        (
            "function_call none",
            json!({"functions": [weather["function"]], "function_call": "none"}),
            200,
        ),
        // Where the real API answers 400.
        ("unknown field", json!({"bogus": true}), 400),
        (
            "top_logprobs > 20",
            json!({"logprobs": true, "top_logprobs": 21}),
            400,
        ),
        ("n = 0", json!({"n": 0}), 400),
        ("temperature > 2", json!({"temperature": 2.5}), 400),
        (
            "tool message without tool_call_id",
            json!({"messages": [user("x"), {"role": "tool", "content": "y"}]}),
            400,
        ),
    ]
}

/// Messages bodies: (case, query, extra headers, body without `model`, expected status).
#[allow(clippy::type_complexity)]
fn anthropic_cases() -> Vec<(
    &'static str,
    &'static str,
    Vec<(&'static str, &'static str)>,
    Value,
    u16,
)> {
    let cc = json!({"type": "ephemeral"});
    let tool = json!({"name": "Bash", "description": "Run a shell command",
        "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {"command": {"type": "string"}}, "required": ["command"],
            "additionalProperties": false}});
    let base = |extra: Value| {
        let mut b = json!({"max_tokens": 2048, "messages": [user("hi")]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let beta = vec![(
        "anthropic-beta",
        "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
    )];
    vec![
        (
            "context_management",
            "",
            vec![],
            base(
                json!({"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}),
            ),
            200,
        ),
        (
            "output_config",
            "",
            vec![],
            base(json!({"output_config": {"effort": "high"}})),
            200,
        ),
        (
            "thinking enabled",
            "",
            vec![],
            base(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})),
            200,
        ),
        (
            "thinking adaptive",
            "",
            vec![],
            base(json!({"thinking": {"type": "adaptive"}})),
            200,
        ),
        (
            "thinking disabled",
            "",
            vec![],
            base(json!({"thinking": {"type": "disabled"}})),
            200,
        ),
        (
            "top_k",
            "",
            vec![],
            base(json!({"top_k": 40, "temperature": 1, "top_p": 0.9})),
            200,
        ),
        (
            "service_tier auto",
            "",
            vec![],
            base(json!({"service_tier": "auto"})),
            200,
        ),
        (
            "service_tier standard_only",
            "",
            vec![],
            base(json!({"service_tier": "standard_only"})),
            200,
        ),
        (
            "metadata",
            "",
            vec![],
            base(json!({"metadata": {"user_id": "user_abc"}})),
            200,
        ),
        (
            "stop_sequences",
            "",
            vec![],
            base(json!({"stop_sequences": ["\n\nHuman:"]})),
            200,
        ),
        (
            "system role mid-conversation",
            "",
            vec![],
            base(
                json!({"messages": [user("hi"), {"role": "assistant", "content": "Hello."},
                {"role": "system", "content": "Be brief."}, user("again")]}),
            ),
            200,
        ),
        (
            "anthropic-beta + ?beta=true",
            "?beta=true",
            beta.clone(),
            base(json!({"stream": true})),
            200,
        ),
        (
            "cache_control everywhere",
            "",
            vec![],
            base(json!({
                "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": cc}],
                "tools": [{"name": "Bash", "input_schema": tool["input_schema"], "cache_control": cc}],
                "messages": [
                    {"role": "user", "content": [
                        {"type": "text", "text": "run ls", "cache_control": cc},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                            "data": "iVBORw0KGgo="}, "cache_control": cc},
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                            "data": "notes"}, "cache_control": cc}]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "Bash",
                         "input": {"command": "ls"}, "cache_control": cc}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1",
                         "content": [{"type": "text", "text": "a.txt", "cache_control": cc}],
                         "cache_control": cc}]}]})),
            200,
        ),
        (
            "thinking blocks replayed",
            "",
            vec![],
            base(
                json!({"thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": [
                user("2+2?"),
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Add them.", "signature": "EqQBCkYIBRgCKkA1"},
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
                    {"type": "text", "text": "4"}]},
                user("and 3+3?")]}),
            ),
            200,
        ),
        (
            "tool_choice auto, no parallel",
            "",
            vec![],
            base(
                json!({"tools": [tool], "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}}),
            ),
            200,
        ),
        (
            "tool_choice any",
            "",
            vec![],
            base(json!({"tools": [tool], "tool_choice": {"type": "any"}})),
            200,
        ),
        (
            "tool_choice tool",
            "",
            vec![],
            base(json!({"tools": [tool], "tool_choice": {"type": "tool", "name": "Bash"}})),
            200,
        ),
        (
            "tool_choice none",
            "",
            vec![],
            base(json!({"tools": [tool], "tool_choice": {"type": "none"}})),
            200,
        ),
        // Where the real API answers 400.
        (
            "no max_tokens",
            "",
            vec![],
            json!({"messages": [user("hi")]}),
            400,
        ),
        ("unknown field", "", vec![], base(json!({"bogus": 1})), 400),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_the_sdks_send_is_accepted_on_both_doors_and_providers() {
    let gw = start(Options::default()).await;
    let mut failures = Vec::new();
    for model in MODELS {
        for (case, extra, want) in openai_cases() {
            let mut body = json!({"model": model, "messages": [user("Weather in Paris?")]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let (status, text) = send(&gw.base, "/v1/chat/completions", &[], &body).await;
            let shaped = if status == 200 {
                text.contains("chat.completion")
            } else {
                serde_json::from_str::<Value>(&text).is_ok_and(|v| {
                    v["error"]["type"] == "invalid_request_error"
                        && v["error"]["message"].is_string()
                })
            };
            if status != want || !shaped {
                failures.push(format!(
                    "chat {model} {case}: {status} (want {want}) {text}"
                ));
            }
        }
        for (case, query, headers, mut body, want) in anthropic_cases() {
            body["model"] = json!(model);
            let h = [ANTHROPIC, headers.as_slice()].concat();
            let (status, text) = send(&gw.base, &format!("/v1/messages{query}"), &h, &body).await;
            let shaped = if status == 200 {
                text.contains("\"message\"") || text.contains("message_start")
            } else {
                serde_json::from_str::<Value>(&text).is_ok_and(|v| {
                    v["type"] == "error" && v["error"]["type"] == "invalid_request_error"
                })
            };
            if status != want || !shaped {
                failures.push(format!(
                    "messages {model} {case}: {status} (want {want}) {text}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `GET /v1/models/{id}` and legacy `/v1/completions`, `n` = 2 included.
#[tokio::test]
async fn models_by_id_and_legacy_completions_with_n() {
    let gw = start(Options::default()).await;
    for model in MODELS {
        let r = reqwest::get(format!("{}/v1/models/{model}", gw.base))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            (v["id"].as_str(), v["object"].as_str()),
            (Some(model), Some("model"))
        );
    }
    let prompt = "Colors?\n#mock texts=Red|Blue+sky";
    let body = json!({"model": "demo/mock", "prompt": prompt, "n": 2, "max_tokens": 5,
        "user": "u-1", "echo": false, "best_of": 1, "logprobs": null, "suffix": null});
    let (status, text) = send(&gw.base, "/v1/completions", &[], &body).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["choices"],
        json!([
            {"text": "Red", "index": 0, "logprobs": null, "finish_reason": "stop"},
            {"text": "Blue sky", "index": 1, "logprobs": null, "finish_reason": "stop"}
        ])
    );
    assert_eq!(gw.mock.requests()[0].body["n"], 2);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, text) = send(&gw.base, "/v1/completions", &[], &streamed).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events = data_events(&text);
    let mut texts = [String::new(), String::new()];
    let mut finishes = Vec::new();
    for e in &events {
        assert_eq!(e["object"], "text_completion", "{e}");
        let Some(c) = e["choices"].as_array().and_then(|c| c.first()) else {
            continue;
        };
        let i = c["index"].as_u64().unwrap() as usize;
        texts[i].push_str(c["text"].as_str().unwrap());
        if let Some(f) = c["finish_reason"].as_str() {
            finishes.push((i, f.to_owned()));
        }
    }
    assert_eq!(texts, ["Red".to_owned(), "Blue sky".to_owned()]);
    assert_eq!(finishes, [(0, "stop".to_owned()), (1, "stop".to_owned())]);
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert!(
        last["usage"]["completion_tokens"].as_u64().unwrap() >= 3,
        "{last}"
    );

    // n beyond the chat door's maximum, and n to a provider without native n: 400 naming `n`.
    for (model, n) in [("demo/mock", 1000), ("demo/claude", 2)] {
        let body = json!({"model": model, "prompt": "x", "n": n});
        let (status, text) = send(&gw.base, "/v1/completions", &[], &body).await;
        assert_eq!(status, 400, "{model} {n}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], "n", "{text}");
    }
}

/// Documents: an Anthropic `document` block (base64 PDF) reaches an Anthropic upstream as that
/// block and an OpenAI-style one as a `file` part; a text-source document as text; OpenAI's own
/// `file` part is accepted too, and a non-PDF file is the 400 naming the field.
#[tokio::test]
async fn documents_reach_every_provider_in_its_own_form() {
    let gw = start(Options::default()).await;
    let pdf = "JVBERi0xLjQKJcfsj6IK";
    let body = |model: &str| {
        json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": [
            {"type": "document", "title": "spec.pdf", "cache_control": {"type": "ephemeral"},
             "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain",
             "data": "Plain notes."}, "citations": {"enabled": true}},
            {"type": "text", "text": "Summarise."}]}]})
    };
    let (status, text) = send(&gw.base, "/v1/messages", ANTHROPIC, &body("demo/claude")).await;
    assert_eq!(status, 200, "{text}");
    let sent = &gw.mock.requests()[0].body["messages"][0]["content"];
    assert_eq!(
        sent[0],
        json!({"type": "document", "title": "spec.pdf",
               "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}})
    );
    assert_eq!(sent[1], json!({"type": "text", "text": "Plain notes."}));
    let (status, text) = send(&gw.base, "/v1/messages", ANTHROPIC, &body("demo/mock")).await;
    assert_eq!(status, 200, "{text}");
    let file = json!({"type": "file", "file": {"filename": "spec.pdf",
        "file_data": format!("data:application/pdf;base64,{pdf}")}});
    let sent = &gw.mock.requests()[1].body["messages"][0]["content"];
    assert_eq!(sent[0], file, "{sent}");

    let chat = |part: Value| {
        json!({"model": "demo/claude", "messages": [{"role": "user", "content": [
            part, {"type": "text", "text": "Summarise."}]}]})
    };
    let (status, text) = send(&gw.base, "/v1/chat/completions", &[], &chat(file.clone())).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        gw.mock.requests()[2].body["messages"][0]["content"][0]["type"],
        "document"
    );
    let png = json!({"type": "file", "file": {"file_data": "data:image/png;base64,iVBORw0KGgo="}});
    let (status, text) = send(&gw.base, "/v1/chat/completions", &[], &chat(png)).await;
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["param"], "messages[0].content[0].file.file_data");
    assert_eq!(gw.mock.requests().len(), 3);

    // A document by URL (Anthropic "PDF support", `source.type: url`) reaches an Anthropic
    // upstream unchanged — fetched by the provider, never by the gateway —; a private address
    // is the 400 naming the field, with no upstream call.
    let by_url = |url: &str| {
        json!({"model": "demo/claude", "max_tokens": 64, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "url", "url": url}},
            {"type": "text", "text": "Summarise."}]}]})
    };
    let url = "https://example.com/spec.pdf";
    let (status, text) = send(&gw.base, "/v1/messages", ANTHROPIC, &by_url(url)).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        gw.mock.requests()[3].body["messages"][0]["content"][0],
        json!({"type": "document", "source": {"type": "url", "url": url}})
    );
    let (status, text) = send(
        &gw.base,
        "/v1/messages",
        ANTHROPIC,
        &by_url("http://169.254.169.254/latest/meta-data.pdf"),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["type"], "error", "{text}");
    assert!(
        error_message(&v).contains("messages[0].content[0].source.url"),
        "{text}"
    );
    assert_eq!(gw.mock.requests().len(), 4);

    // A provider's own file reference (Anthropic Files API `source.type: file`; OpenAI
    // `file.file_id`) reaches that provider unchanged.
    let by_id = json!({"model": "demo/claude", "max_tokens": 64, "messages": [{"role": "user",
        "content": [{"type": "document", "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}},
                    {"type": "text", "text": "Summarise."}]}]});
    let (status, text) = send(&gw.base, "/v1/messages", ANTHROPIC, &by_id).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        gw.mock.requests()[4].body["messages"][0]["content"][0],
        json!({"type": "document", "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}})
    );
    let oai = json!({"model": "demo/mock", "messages": [{"role": "user", "content": [
        {"type": "file", "file": {"file_id": "file-abc123"}}, {"type": "text", "text": "Summarise."}]}]});
    let (status, text) = send(&gw.base, "/v1/chat/completions", &[], &oai).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        gw.mock.requests()[5].body["messages"][0]["content"][0],
        json!({"type": "file", "file": {"file_id": "file-abc123"}})
    );
}
