//! OpenAI targets with `api: responses` (the upstream speaks `POST /v1/responses`), end to end:
//! the request the upstream gets, both front doors over it, and FC-31 (BerriAI/litellm #25429,
//! #26179): a terminal `response.completed` with `"output": []` or `null` after the content came
//! in item events; a terminal `response.incomplete` (`max_output_tokens`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};
use switchyard_mock::DEFAULT_TEXT;

const MODEL: &str = "demo/responses-api";
const AZURE: &str = "demo/azure-responses";

async fn gateway() -> Gateway {
    let mut config = test_config(json!({}));
    config.targets.push(
        serde_json::from_value(json!({"id": "oai-responses", "provider": "openai",
            "base_url": "builtin:mock", "upstream_model": "gpt-4.1-mini", "api": "responses"}))
        .unwrap(),
    );
    config.targets.push(
        serde_json::from_value(json!({"id": "azure-responses", "provider": "azure_openai",
            "base_url": "builtin:mock", "upstream_model": "my-deployment", "api": "responses",
            "api_key": "az-key-123"}))
        .unwrap(),
    );
    config
        .models
        .push(serde_json::from_value(json!({"id": MODEL, "targets": ["oai-responses"]})).unwrap());
    config.models.push(
        serde_json::from_value(json!({"id": AZURE, "targets": ["azure-responses"]})).unwrap(),
    );
    config.validate().unwrap();
    start_config(config).await
}

async fn responses(base: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/responses"))
        .bearer_auth("sk-x")
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The `(name, data)` events of a streamed Responses answer.
async fn responses_events(base: &str, body: &Value) -> Vec<(String, Value)> {
    let text = responses(base, body).await.text().await.unwrap();
    named_events(&text)
}

#[tokio::test]
async fn chat_and_tools_through_a_responses_upstream() {
    let gw = gateway().await;
    for stream in [false, true] {
        let body = json!({"model": MODEL, "stream": stream, "max_tokens": 50, "temperature": 0.2,
            "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
            "messages": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello please"}]});
        if stream {
            let r = post_sse(&gw.base, &body).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.content(), DEFAULT_TEXT);
            assert_eq!(r.finish_reason().as_deref(), Some("stop"));
            let usage = r.json_events().last().unwrap()["usage"].clone();
            assert_eq!(
                (
                    usage["prompt_tokens"].clone(),
                    usage["completion_tokens"].clone()
                ),
                (json!(5), json!(13))
            );
        } else {
            let (status, _, b) = post_json(&gw.base, &body).await;
            assert_eq!(status, 200, "{b}");
            assert_eq!(b["choices"][0]["message"]["content"], DEFAULT_TEXT);
            assert_eq!(b["usage"]["total_tokens"], 18);
        }
        let sent = gw.mock.requests().last().unwrap().clone();
        assert_eq!(sent.path, "/v1/responses");
        let mut expected = json!({"model": "gpt-4.1-mini", "store": false, "max_output_tokens": 50,
            "temperature": 0.2, "input": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello please"}]});
        if stream {
            expected["stream"] = json!(true);
        }
        assert_eq!(sent.body, expected);
    }

    // A tool round trip: calls come back as chat tool_calls, results go up as items.
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let body = json!({"model": MODEL, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "messages": [{"role": "user", "content": "Weather?\n#mock tool_calls=2"}]});
    let (status, _, b) = post_json(&gw.base, &body).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["choices"][0]["finish_reason"], "tool_calls");
    let calls = b["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["id"], "call_mock_0");
    assert_eq!(calls[1]["function"]["arguments"], "{\"city\":\"London\"}");
    let sent = gw.mock.requests().last().unwrap().body.clone();
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "function", "name": "get_weather"})
    );
    assert_eq!(sent["tools"][0]["name"], "get_weather");
    assert_eq!(sent["tools"][0]["strict"], false);
    let mut messages = body["messages"].as_array().unwrap().clone();
    messages.push(b["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": "call_mock_0", "content": "sunny"}));
    messages.push(json!({"role": "tool", "tool_call_id": "call_mock_1", "content": "rain"}));
    let follow = json!({"model": MODEL, "tools": tools, "messages": messages});
    let (status, _, b) = post_json(&gw.base, &follow).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["choices"][0]["message"]["content"], DEFAULT_TEXT);
    let sent = gw.mock.requests().last().unwrap().body.clone();
    assert_eq!(
        sent["input"],
        json!([{"role": "user", "content": "Weather?\n#mock tool_calls=2"},
            {"type": "function_call", "call_id": "call_mock_0", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "call_mock_1", "name": "get_weather", "arguments": "{\"city\":\"London\"}"},
            {"type": "function_call_output", "call_id": "call_mock_0", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_mock_1", "output": "rain"}])
    );
}

/// FC-31: the chat bridge returns the content streamed in item events although the terminal
/// event's `output` is `[]` (deltas and item events) or `null` (item events only).
#[tokio::test]
async fn fc31_chat_bridge_keeps_item_event_content() {
    let gw = gateway().await;
    for fixture in ["fc31_responses_empty_output", "fc31_responses_null_output"] {
        let prompt = format!("#mock fixture={fixture}");
        let (status, _, b) = post_json(&gw.base, &chat(MODEL, &prompt, false)).await;
        assert_eq!(status, 200, "{fixture}: {b}");
        assert_eq!(
            b["choices"][0]["message"]["content"], "Hi! How can I help?",
            "{fixture}"
        );
        assert_eq!(b["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            (
                b["usage"]["prompt_tokens"].clone(),
                b["usage"]["completion_tokens"].clone(),
                b["usage"]["total_tokens"].clone()
            ),
            (json!(17), json!(6), json!(23))
        );
        let mut body = chat(MODEL, &prompt, true);
        body["stream_options"] = json!({"include_usage": true});
        let r = post_sse(&gw.base, &body).await;
        assert_eq!(r.content(), "Hi! How can I help?", "{fixture}");
        assert_eq!(r.finish_reason().as_deref(), Some("stop"));
        assert_eq!(r.json_events().last().unwrap()["usage"]["total_tokens"], 23);
    }
    // A terminal response.incomplete (max_output_tokens): finish `length`, partial text kept.
    let (status, _, b) = post_json(
        &gw.base,
        &chat(MODEL, "#mock fixture=fc31_responses_incomplete", false),
    )
    .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["choices"][0]["message"]["content"], "Hi! How");
    assert_eq!(b["choices"][0]["finish_reason"], "length");
    assert_eq!(b["usage"]["completion_tokens"], 2);
    // A call whose arguments only arrive in output_item.done, terminal output null.
    let (status, _, b) = post_json(
        &gw.base,
        &chat(MODEL, "#mock fixture=fc31_responses_call_in_done", false),
    )
    .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        b["choices"][0]["message"]["tool_calls"],
        json!([{"id": "call_fc31", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}])
    );
}

/// FC-31 on the Responses path: the final event's `output` and the stored copy are rebuilt from
/// the item events; `response.incomplete` keeps the partial item.
#[tokio::test]
async fn fc31_responses_path_rebuilds_output() {
    let gw = gateway().await;
    for fixture in ["fc31_responses_empty_output", "fc31_responses_null_output"] {
        let body =
            json!({"model": MODEL, "stream": true, "input": format!("#mock fixture={fixture}")});
        let events = responses_events(&gw.base, &body).await;
        let (name, last) = events.last().unwrap();
        assert_eq!(name, "response.completed", "{fixture}");
        let r = &last["response"];
        let id = r["id"].as_str().unwrap();
        assert_eq!(r["output"].as_array().unwrap().len(), 1, "{fixture}: {r}");
        assert_eq!(r["output"][0]["content"][0]["text"], "Hi! How can I help?");
        assert_eq!(r["output"][0]["status"], "completed");
        assert_eq!(
            (
                r["usage"]["input_tokens"].clone(),
                r["usage"]["output_tokens"].clone(),
                r["usage"]["total_tokens"].clone()
            ),
            (json!(17), json!(6), json!(23))
        );
        let url = format!("{}/v1/responses/{id}", gw.base);
        let (_, stored) = call(reqwest::Method::GET, url, None, None).await;
        assert_eq!(stored["output"], r["output"], "{fixture}");
        let deltas: String = events
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect();
        assert_eq!(deltas, "Hi! How can I help?", "{fixture}");
    }
    for stream in [false, true] {
        let body = json!({"model": MODEL, "stream": stream,
            "input": "#mock fixture=fc31_responses_incomplete"});
        let r = if stream {
            let events = responses_events(&gw.base, &body).await;
            let (name, last) = events.last().unwrap();
            assert_eq!(name, "response.incomplete");
            last["response"].clone()
        } else {
            responses(&gw.base, &body)
                .await
                .json::<Value>()
                .await
                .unwrap()
        };
        assert_eq!(r["status"], "incomplete");
        assert_eq!(
            r["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(r["output"][0]["status"], "incomplete");
        assert_eq!(r["output"][0]["content"][0]["text"], "Hi! How");
    }
}

/// Azure OpenAI's Responses surface: `/openai/v1/responses`, `api-key`, the deployment as `model`.
#[tokio::test]
async fn azure_target_through_the_responses_api() {
    let gw = gateway().await;
    for stream in [false, true] {
        let body = chat(AZURE, "Say hello please", stream);
        if stream {
            let r = post_sse(&gw.base, &body).await;
            assert_eq!(r.content(), DEFAULT_TEXT);
        } else {
            let (status, _, b) = post_json(&gw.base, &body).await;
            assert_eq!(status, 200, "{b}");
            assert_eq!(b["choices"][0]["message"]["content"], DEFAULT_TEXT);
        }
        let sent = gw.mock.requests().last().unwrap().clone();
        assert_eq!(sent.path, "/v1/openai/v1/responses");
        assert_eq!(sent.query, None);
        assert_eq!(sent.header("api-key"), Some("az-key-123"));
        assert_eq!(sent.header("authorization"), None);
        assert_eq!(sent.body["model"], "my-deployment");
        assert_eq!(sent.body["store"], false);
    }
}
