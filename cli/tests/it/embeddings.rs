//! `POST /v1/embeddings` through the pipeline: ingress → NATS request/reply → worker → mock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use base64::Engine;
use switchyard_workers::mock_upstream::embeddings::mock_vector;

async fn embed(base: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/embeddings"))
        .bearer_auth("sk-test")
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test]
async fn floats_in_input_order_with_usage() {
    let gw = start(Options {
        billing: true,
        ..Options::default()
    })
    .await;
    let (status, body) =
        embed(&gw.base, serde_json::json!({"model": "demo/mock", "input": ["alpha beta", "gamma"], "dimensions": 4})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "demo/mock");
    assert_eq!(
        body["usage"],
        serde_json::json!({"prompt_tokens": 3, "total_tokens": 3})
    );
    let got: Vec<Vec<f32>> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    assert_eq!(
        got,
        vec![mock_vector("alpha beta", 4), mock_vector("gamma", 4)]
    );
    assert_eq!(body["data"][1]["index"], 1);
    // The upstream was asked for floats and the upstream model id.
    let up = &gw.mock.requests()[0];
    assert_eq!(up.path, "/v1/embeddings");
    assert_eq!(up.body["encoding_format"], "float");
    assert_eq!(up.body["model"], "mock");
}

#[tokio::test]
async fn base64_is_little_endian_f32() {
    let gw = start(Options::default()).await;
    let (status, body) = embed(
        &gw.base,
        serde_json::json!({"model": "demo/mock", "input": "hello", "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let b64 = body["data"][0]["embedding"].as_str().unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let v: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(v, mock_vector("hello", 8));
}

#[tokio::test]
async fn bad_input_and_unsupported_provider() {
    let gw = start(Options::default()).await;
    let (status, body) = embed(
        &gw.base,
        serde_json::json!({"model": "demo/mock", "input": []}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "input");
    let (status, body) = embed(
        &gw.base,
        serde_json::json!({"model": "demo/mock", "input": "x", "encoding_format": "hex"}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "encoding_format");
    let (status, body) = embed(&gw.base, serde_json::json!({"model": "nope", "input": "x"})).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "model_not_found");
    // The Anthropic Messages API has no embeddings: a 400 naming `model`, no upstream call.
    let (status, body) = embed(
        &gw.base,
        serde_json::json!({"model": "demo/claude", "input": "x"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "model");
    assert_eq!(gw.mock.request_count(), 0);
    // Fallback: the dead target first, then the mock.
    let (status, _) = embed(
        &gw.base,
        serde_json::json!({"model": "demo/fallback", "input": "x"}),
    )
    .await;
    assert_eq!(status, 200);
}
