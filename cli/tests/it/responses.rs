//! The OpenAI Responses front door, `POST /v1/responses`, end to end: exact wire shapes of the
//! `response` object and of the typed SSE events (order, `sequence_number`, usage numbers), and
//! stored responses (`SY_RESPONSES`): tenant isolation, visibility from another ingress right
//! after the final event, `previous_response_id` (OpenAI API reference, "Responses",
//! "Streaming events").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};
use switchyard_mock::DEFAULT_TEXT;

const KEY_A: &str = "sk-tenant-a-0123456789";
const KEY_A2: &str = "sk-tenant-a2-0123456789";
const KEY_B: &str = "sk-tenant-b-0123456789";

async fn send(
    base: &str,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<&Value>,
) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(key);
    if let Some(b) = body {
        req = req.json(b);
    }
    req.send().await.unwrap()
}

/// `POST /v1/responses` with `body`, the response not read yet.
async fn post_response(base: &str, key: &str, body: &Value) -> reqwest::Response {
    send(
        base,
        key,
        reqwest::Method::POST,
        "/v1/responses",
        Some(body),
    )
    .await
}

/// `GET /v1/responses/{id}` as `key`: the status and body.
async fn retrieve(base: &str, key: &str, id: &str) -> (u16, Value) {
    get(base, key, &format!("/v1/responses/{id}")).await
}

/// `DELETE /v1/responses/{id}`, the response not read yet.
async fn delete(base: &str, key: &str, id: &str) -> reqwest::Response {
    let path = format!("/v1/responses/{id}");
    send(base, key, reqwest::Method::DELETE, &path, None).await
}

async fn create(base: &str, key: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    read_json(post_response(base, key, body).await).await
}

async fn get(base: &str, key: &str, path: &str) -> (u16, Value) {
    let resp = send(base, key, reqwest::Method::GET, path, None).await;
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// `(event name, data)` of a streamed answer; each name equals its data's `type`.
async fn stream(base: &str, key: &str, body: &Value) -> Vec<(String, Value)> {
    let resp = post_response(base, key, body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    typed_events(&text)
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

fn weather_tool() -> Value {
    json!([{"type": "function", "name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])
}

#[tokio::test]
async fn non_streamed_response_object_is_exact() {
    let gw = start(Options::default()).await;
    for model in ["demo/mock", "demo/claude"] {
        let body = json!({"model": model, "input": "Say hello please", "instructions": "Be brief.",
            "max_output_tokens": 100, "metadata": {"k": "v"}});
        let (status, headers, r) = create(&gw.base, "sk-x", &body).await;
        assert_eq!(status, 200, "{r}");
        let hex = request_id(&headers).simple().to_string();
        assert_eq!(r["id"], format!("resp_{hex}"));
        assert_eq!(r["object"], "response");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["model"], model);
        assert_eq!(r["error"], Value::Null);
        assert_eq!(r["incomplete_details"], Value::Null);
        assert!(r["completed_at"].as_u64().unwrap() >= r["created_at"].as_u64().unwrap());
        assert_eq!(
            r["output"],
            json!([{"id": format!("msg_{hex}"), "type": "message", "status": "completed",
                "role": "assistant", "content": [{"type": "output_text", "annotations": [],
                    "logprobs": [], "text": DEFAULT_TEXT}]}])
        );
        // "Be brief." + "Say hello please" = 5 words; the text is 13.
        assert_eq!(
            r["usage"],
            json!({"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 13, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 18})
        );
        for (k, v) in [
            ("instructions", json!("Be brief.")),
            ("max_output_tokens", json!(100)),
            ("metadata", json!({"k": "v"})),
            ("parallel_tool_calls", json!(true)),
            ("previous_response_id", Value::Null),
            ("store", json!(true)),
            ("temperature", json!(1.0)),
            ("top_p", json!(1.0)),
            ("tool_choice", json!("auto")),
            ("tools", json!([])),
            (
                "text",
                json!({"format": {"type": "text"}, "verbosity": "medium"}),
            ),
            ("truncation", json!("disabled")),
        ] {
            assert_eq!(r[k], v, "{k}");
        }
    }
}

#[tokio::test]
async fn streamed_text_events_in_documented_order() {
    let gw = start(Options::default()).await;
    for model in ["demo/mock", "demo/claude"] {
        let body = json!({"model": model, "input": "Say hello please", "stream": true});
        let events = stream(&gw.base, "sk-x", &body).await;
        let n = words(DEFAULT_TEXT);
        let mut expected = vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ];
        expected.extend(std::iter::repeat_n("response.output_text.delta", n));
        expected.extend([
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]);
        assert_eq!(names(&events), expected, "{model}");
        let seqs: Vec<u64> = events
            .iter()
            .map(|(_, d)| d["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
        let created = &events[0].1["response"];
        assert_eq!(created["status"], "in_progress");
        assert_eq!(created["output"], json!([]));
        assert_eq!(created["usage"], Value::Null);
        let id = created["id"].as_str().unwrap();
        let hex = id.strip_prefix("resp_").unwrap();
        let item_id = format!("msg_{hex}");
        assert_eq!(
            events[2].1,
            json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
                "item": {"id": item_id, "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}})
        );
        assert_eq!(
            events[3].1,
            json!({"type": "response.content_part.added", "sequence_number": 3,
                "item_id": item_id, "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}})
        );
        assert_eq!(
            events[4].1,
            json!({"type": "response.output_text.delta", "sequence_number": 4,
                "item_id": item_id, "output_index": 0, "content_index": 0,
                "delta": "Hello ", "logprobs": []})
        );
        let text: String = events
            .iter()
            .filter_map(|(_, d)| d["delta"].as_str())
            .collect();
        assert_eq!(text, DEFAULT_TEXT);
        assert_eq!(events[4 + n].1["text"], DEFAULT_TEXT);
        let done = &events[events.len() - 2].1;
        assert_eq!(done["item"]["status"], "completed");
        assert_eq!(done["item"]["content"][0]["text"], DEFAULT_TEXT);
        let last = &events.last().unwrap().1["response"];
        assert_eq!(last["id"], id);
        assert_eq!(last["status"], "completed");
        assert_eq!(last["output"], json!([done["item"]]));
        assert_eq!(
            last["usage"],
            json!({"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 13, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 16})
        );
    }
}

#[tokio::test]
async fn streamed_function_calls_one_item_each() {
    let gw = start(Options::default()).await;
    for model in ["demo/mock", "demo/claude"] {
        let body = json!({"model": model, "stream": true, "tools": weather_tool(),
            "input": [{"role": "user", "content": "Two cities?\n#mock tool_calls=2"}]});
        let events = stream(&gw.base, "sk-x", &body).await;
        let names = names(&events);
        assert_eq!(
            &names[..3],
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added"
            ]
        );
        assert_eq!(names.last(), Some(&"response.completed"));
        // Per call: added, deltas, arguments.done, item.done — the second after the first.
        let positions = |name: &str| -> Vec<usize> {
            events
                .iter()
                .enumerate()
                .filter(|(_, (n, _))| n == name)
                .map(|(i, _)| i)
                .collect()
        };
        let added = positions("response.output_item.added");
        let dones = positions("response.output_item.done");
        assert_eq!(added.len(), 2, "{model}: {names:?}");
        assert!(added[0] < dones[0] && dones[0] < added[1] && added[1] < dones[1]);
        let last = &events.last().unwrap().1["response"];
        let hex = last["id"]
            .as_str()
            .unwrap()
            .strip_prefix("resp_")
            .unwrap()
            .to_owned();
        let out = last["output"].as_array().unwrap();
        assert_eq!(out.len(), 2);
        for (i, item) in out.iter().enumerate() {
            assert_eq!(item["type"], "function_call");
            assert_eq!(item["id"], format!("fc_{hex}_{i}"));
            assert_eq!(item["name"], "get_weather");
            assert_eq!(item["status"], "completed");
            let args: String = events
                .iter()
                .filter(|(n, d)| {
                    n == "response.function_call_arguments.delta" && d["output_index"] == i
                })
                .map(|(_, d)| d["delta"].as_str().unwrap())
                .collect();
            assert_eq!(item["arguments"], args.as_str());
            serde_json::from_str::<Value>(&args).unwrap();
            assert_eq!(events[dones[i]].1["item"], *item);
            assert_eq!(events[dones[i] - 1].1["arguments"], args.as_str());
        }
    }
}

#[tokio::test]
async fn stream_failure_after_content_is_error_then_response_failed() {
    let gw = start(Options::default()).await;
    let body = json!({"model": "demo/mock", "stream": true, "input": "hi\n#mock error_after=2"});
    let events = stream(&gw.base, "sk-x", &body).await;
    let names = names(&events);
    assert_eq!(
        &names[names.len() - 5..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "error",
            "response.failed"
        ]
    );
    let failed = &events.last().unwrap().1["response"];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], "server_error");
    assert_eq!(failed["output"][0]["status"], "incomplete");
    assert_eq!(failed["output"][0]["content"][0]["text"], "Hello from ");
}

fn tenants_config() -> switchyard_schemas::config::GatewayConfig {
    test_config(json!({"keys": [
        {"id": "a", "tenant": "acme", "key": KEY_A},
        {"id": "a2", "tenant": "acme", "key": KEY_A2},
        {"id": "b", "tenant": "globex", "key": KEY_B}
    ]}))
}

#[tokio::test]
async fn stored_responses_are_tenant_scoped_and_shared_by_replicas() {
    let gw = start_config(tenants_config()).await;
    let (other, _) = spawn_ingress(&gw).await;

    // Streamed and stored through ingress 1; the follow-up goes to ingress 2 right after the
    // final event, with another key of the same tenant.
    let body = json!({"model": "demo/mock", "stream": true, "input": "My name is Ada."});
    let events = stream(&gw.base, KEY_A, &body).await;
    let final_response = events.last().unwrap().1["response"].clone();
    let id = final_response["id"].as_str().unwrap().to_owned();
    let (status, got) = retrieve(&other, KEY_A2, &id).await;
    assert_eq!(status, 200);
    assert_eq!(got, final_response);
    let follow =
        json!({"model": "demo/claude", "input": "And my name?", "previous_response_id": id});
    let (status, _, r2) = create(&other, KEY_A2, &follow).await;
    assert_eq!(status, 200, "{r2}");
    assert_eq!(r2["previous_response_id"], id.as_str());
    let sent = gw.mock.requests().last().unwrap().body.clone();
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "My name is Ada."}]},
            {"role": "assistant", "content": [{"type": "text", "text": DEFAULT_TEXT}]},
            {"role": "user", "content": [{"type": "text", "text": "And my name?"}]}])
    );
    assert_eq!(r2["usage"]["input_tokens"], 4 + 13 + 3);

    // Another tenant sees nothing.
    let not_found = json!({"error": {"message": format!("No response found with id '{id}'."),
        "type": "invalid_request_error", "param": null, "code": null}});
    for path in [
        format!("/v1/responses/{id}"),
        format!("/v1/responses/{id}/input_items"),
    ] {
        let (status, b) = get(&gw.base, KEY_B, &path).await;
        assert_eq!((status, &b), (404, &not_found), "{path}");
    }
    let resp = delete(&gw.base, KEY_B, &id).await;
    assert_eq!(resp.status(), 404);
    let (status, _, b) = create(
        &gw.base,
        KEY_B,
        &json!({"model": "demo/mock", "input": "x",
        "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        b,
        json!({"error": {"message": format!("Previous response with id '{id}' not found."),
            "type": "invalid_request_error", "param": "previous_response_id",
            "code": "previous_response_not_found"}})
    );

    // The owner's input items, then deletion (visible to the other replica).
    let (status, items) = get(&other, KEY_A, &format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(status, 200);
    assert_eq!(items["object"], "list");
    assert_eq!(items["has_more"], false);
    let data = items["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["type"], "message");
    assert_eq!(data[0]["role"], "user");
    assert_eq!(
        data[0]["content"],
        json!([{"type": "input_text", "text": "My name is Ada."}])
    );
    assert_eq!(items["first_id"], data[0]["id"]);
    let resp = delete(&gw.base, KEY_A, &id).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"id": id, "object": "response", "deleted": true})
    );
    let (status, _) = retrieve(&other, KEY_A, &id).await;
    assert_eq!(status, 404);
    // The follow-up stays retrievable; `store: false` leaves nothing.
    let (status, _) = retrieve(&gw.base, KEY_A, r2["id"].as_str().unwrap()).await;
    assert_eq!(status, 200);
    let (_, _, r3) = create(
        &gw.base,
        KEY_A,
        &json!({"model": "demo/mock", "input": "x", "store": false}),
    )
    .await;
    let (status, _) = retrieve(&gw.base, KEY_A, r3["id"].as_str().unwrap()).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn hosted_tools_and_unknown_parameters_are_named() {
    let gw = start(Options::default()).await;
    for (extra, param, needle) in [
        (
            json!({"tools": [{"type": "web_search_preview"}]}),
            "tools[0].type",
            "web_search_preview",
        ),
        (
            json!({"tools": [{"type": "mcp", "server_label": "x"}]}),
            "tools[0].type",
            "mcp",
        ),
        (
            json!({"tools": [{"type": "image_generation"}]}),
            "tools[0].type",
            "image_generation",
        ),
        (
            json!({"tools": [{"type": "computer_use_preview"}]}),
            "tools[0].type",
            "computer_use_preview",
        ),
        (json!({"bogus": 1}), "bogus", "bogus"),
        (
            json!({"conversation": "conv_1"}),
            "conversation",
            "conversation",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0].type",
            "item_reference",
        ),
        (json!({"temperature": 3}), "temperature", "temperature"),
    ] {
        let mut body = json!({"model": "demo/mock", "input": "hi"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, _, b) = create(&gw.base, "sk-x", &body).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(b["error"]["param"], param, "{b}");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert!(error_message(&b).contains(needle), "{b}");
    }
    // Accepted as the real API accepts them, even when null.
    let body = json!({"model": "demo/mock", "input": "hi", "store": null, "service_tier": "auto",
        "reasoning": {"effort": "low", "summary": "auto"}, "include": [], "truncation": "auto",
        "stream_options": null, "user": "u", "prompt_cache_key": "k", "safety_identifier": "s",
        "parallel_tool_calls": false, "top_logprobs": null, "background": false});
    let (status, _, b) = create(&gw.base, "sk-x", &body).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["reasoning"], json!({"effort": "low", "summary": "auto"}));
    assert_eq!(b["service_tier"], "default");
    assert_eq!(b["store"], true);
}

/// Codex-style `namespace` tools: flattened upstream, each call marked with its namespace.
#[tokio::test]
async fn namespace_tool_calls_carry_their_namespace() {
    let gw = start(Options::default()).await;
    let body = json!({"model": "demo/mock", "input": "Go\n#mock tool_calls=2",
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents",
                "tools": [{"type": "function", "name": "close_agent", "parameters": {"type": "object"}}]}]});
    let (status, _, r) = create(&gw.base, "sk-x", &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output"][0]["name"], "exec_command");
    assert_eq!(r["output"][0].get("namespace"), None);
    assert_eq!(r["output"][1]["name"], "close_agent");
    assert_eq!(r["output"][1]["namespace"], "multi_agent_v1");
    let sent = gw.mock.requests().last().unwrap().body.clone();
    let names: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["exec_command", "close_agent"]);
    assert_eq!(r["tools"][1]["type"], "namespace");
}

/// `responses.ttl_s` is the bucket's age limit, also when the bucket already existed.
#[tokio::test]
async fn ttl_is_the_buckets_max_age() {
    let config = test_config(json!({"responses": {"ttl_s": 3600}}));
    config.validate().unwrap();
    let gw = start_config(config).await;
    let js = async_nats::jetstream::new(async_nats::connect(gw.nats.url()).await.unwrap());
    let max_age = |js: async_nats::jetstream::Context| async move {
        let s = js.get_stream("KV_SY_RESPONSES").await.unwrap();
        s.cached_info().config.max_age
    };
    assert_eq!(
        max_age(js.clone()).await,
        std::time::Duration::from_secs(3600)
    );
    // A second ingress with another TTL updates the existing bucket.
    let mut c = gw.config.get().as_ref().clone();
    c.responses.ttl_s = 7200;
    assert!(gw.config.set(gw.config.version() + 1, c));
    let (_, state) = spawn_ingress(&gw).await;
    assert!(state.responses.is_available());
    assert_eq!(max_age(js).await, std::time::Duration::from_secs(7200));
}
