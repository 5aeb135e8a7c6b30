//! Stateful follow-ups across deployments (issue 12, Deliver 2): a `/v1/responses` conversation
//! holding an encrypted `reasoning` item (readable by one upstream deployment only) is pinned,
//! in its `SY_RESPONSES` entry, to the Responses-API target that accepted it; a
//! `previous_response_id` follow-up goes there from any ingress replica (a fresh one holds no
//! memory of it), and one that cannot go there gets a documented 400 without any upstream call.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};

const MODEL: &str = "demo/pinned";

/// Two Responses-API targets of one model on the mock: `resp-a` (tried first) accepts only
/// encrypted reasoning starting `enc-a`, `resp-b` only `enc-b`.
async fn gateway() -> Gateway {
    let mut config = test_config(json!({}));
    for (id, prefix) in [("resp-a", "enc-a"), ("resp-b", "enc-b")] {
        config.targets.push(
            serde_json::from_value(json!({"id": id, "provider": "openai",
                "base_url": format!("builtin:mock/x/accept_encrypted={prefix}"),
                "upstream_model": "o4-mini", "api": "responses"}))
            .unwrap(),
        );
    }
    config.models.push(
        serde_json::from_value(json!({"id": MODEL, "targets": ["resp-a", "resp-b"]})).unwrap(),
    );
    config.validate().unwrap();
    start_config(config).await
}

async fn create(base: &str, headers: &[(&str, &str)], body: &Value) -> (u16, String, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/responses"))
        .bearer_auth("sk-x")
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let target = resp
        .headers()
        .get("x-switchyard-target")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, target, resp.json().await.unwrap())
}

fn reasoning_item() -> Value {
    json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc-b:opaque"})
}

#[tokio::test]
async fn encrypted_reasoning_pins_follow_ups_to_its_deployment() {
    let gw = gateway().await;
    // Without encrypted state the model's first target serves.
    let (status, target, v) = create(&gw.base, &[], &json!({"model": MODEL, "input": "hi"})).await;
    assert_eq!((status, target.as_str()), (200, "resp-a"), "{v}");

    // The client replays a reasoning item deployment b produced; it reaches b unchanged.
    let first = json!({"model": MODEL, "input": [
        {"role": "user", "content": "Think about it"},
        reasoning_item(),
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Thought."}]},
        {"role": "user", "content": "Go on"}]});
    let (status, target, r1) = create(&gw.base, &[("x-switchyard-only", "resp-b")], &first).await;
    assert_eq!((status, target.as_str()), (200, "resp-b"), "{r1}");
    let sent = gw.mock.requests().last().unwrap().body.clone();
    assert_eq!(sent["input"][1], reasoning_item());
    assert_eq!(
        sent["input"][2],
        json!({"role": "assistant", "content": "Thought."})
    );

    // A follow-up through another ingress replica (no memory of the first) goes to b, which
    // reads the item; a would have answered 400 invalid_encrypted_content.
    let (replica, _) = spawn_ingress(&gw).await;
    let follow = json!({"model": MODEL, "previous_response_id": r1["id"], "input": "And then?"});
    let (status, target, r2) = create(&replica, &[], &follow).await;
    assert_eq!((status, target.as_str()), (200, "resp-b"), "{r2}");
    let sent = gw.mock.requests().last().unwrap().body.clone();
    assert!(
        sent["input"]
            .as_array()
            .unwrap()
            .contains(&reasoning_item()),
        "{sent}"
    );

    // The pin carries down the chain; a follow-up that may not go to b is a clear 400 and
    // reaches no upstream.
    let calls = gw.mock.request_count();
    let next = json!({"model": MODEL, "previous_response_id": r2["id"], "input": "More"});
    let (status, _, e) = create(&gw.base, &[("x-switchyard-only", "resp-a")], &next).await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["code"], "pinned_target_unavailable");
    assert_eq!(e["error"]["param"], "previous_response_id");
    assert_eq!(
        e["error"]["message"],
        format!(
            "Previous response '{}' holds encrypted reasoning that only target `resp-b` can \
             read, and this request cannot go there: the request's x-switchyard-only / \
             x-switchyard-ignore exclude it.",
            r2["id"].as_str().unwrap()
        )
    );
    assert_eq!(gw.mock.request_count(), calls);
    let (status, target, r3) = create(&gw.base, &[], &next).await;
    assert_eq!((status, target.as_str()), (200, "resp-b"), "{r3}");

    // A conversation without encrypted reasoning is not pinned.
    let (_, _, plain) = create(
        &gw.base,
        &[("x-switchyard-only", "resp-b")],
        &json!({"model": MODEL, "input": "hi"}),
    )
    .await;
    let follow = json!({"model": MODEL, "previous_response_id": plain["id"], "input": "again"});
    let (status, target, v) = create(&replica, &[], &follow).await;
    assert_eq!((status, target.as_str()), (200, "resp-a"), "{v}");
}
