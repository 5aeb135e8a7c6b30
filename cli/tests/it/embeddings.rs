//! `POST /v1/embeddings` through the pipeline: ingress → NATS request/reply → worker → mock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use base64::Engine;
use switchyard_mock::embeddings::mock_vector;

/// `POST /v1/embeddings` of `body` with bearer `key`, the response not read yet.
async fn embed_as(base: &str, key: &str, body: serde_json::Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/embeddings"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn embed(base: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let resp = embed_as(base, "sk-test", body).await;
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test]
async fn floats_in_input_order_with_usage() {
    let gw = billed_gateway().await;
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

/// Embeddings go through the chat attempt engine: the same fallback headers, metrics and charge
/// event bookkeeping.
#[tokio::test]
async fn fallback_is_recorded_like_chat() {
    let gw = billed_gateway().await;
    let resp = embed_as(
        &gw.base,
        "sk-test",
        serde_json::json!({"model": "demo/fallback", "input": "x"}),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let h = resp.headers();
    assert_eq!(h["x-switchyard-target"], "mock");
    assert_eq!(h["x-switchyard-fallbacks"], "1");
    let id = h["x-request-id"].to_str().unwrap().to_owned();
    resp.bytes().await.unwrap();
    let (status, _) = embed(
        &gw.base,
        serde_json::json!({"model": "demo/dead", "input": "x"}),
    )
    .await;
    assert_eq!(status, 502);
    let text = metrics_text(&gw.base).await;
    assert_metric_lines(
        &text,
        &[
            "switchyard_requests_total{route=\"/v1/embeddings\",model=\"demo/fallback\",status=\"200\"} 1",
            "switchyard_requests_total{route=\"/v1/embeddings\",model=\"demo/dead\",status=\"502\"} 1",
            "switchyard_provider_requests_total{target=\"mock\",status=\"200\"} 1",
            "switchyard_fallbacks_total{model=\"demo/fallback\",depth=\"1\"} 1",
            "switchyard_in_flight{target=\"mock\"} 0",
            "switchyard_in_flight{target=\"dead\"} 0",
        ],
    );
    let ledger = gw.ledger.clone().unwrap();
    let id: uuid::Uuid = id.parse().unwrap();
    let charge = eventually(std::time::Duration::from_secs(10), || {
        let ledger = ledger.clone();
        async move {
            let rows = ledger.usage_for(id).await.unwrap();
            rows.into_iter()
                .find(|r| r.kind == switchyard_schemas::UsageKind::Charge)
        }
    })
    .await;
    assert_eq!(charge.target.as_deref(), Some("mock"));
    assert_eq!(charge.fallbacks, 1);
    assert_eq!(charge.status, switchyard_schemas::usage::UsageStatus::Ok);
}

/// With keys on, both usage rows of an embeddings request (`charge` and `upstream`) carry the
/// key and its tenant, so tenant reports and budgets count embeddings spend.
#[tokio::test]
async fn usage_rows_carry_tenant_and_key() {
    let gw = start(Options {
        config: test_config(serde_json::json!({
            "keys": [{"id": "emb-key", "tenant": "search", "key": "sk-embeddings-tenant-01"}]
        })),
        billing: true,
        ..Options::default()
    })
    .await;
    let resp = embed_as(
        &gw.base,
        "sk-embeddings-tenant-01",
        serde_json::json!({"model": "demo/mock", "input": "alpha beta"}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let id = request_id(resp.headers());
    let rows = ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await;
    for r in &rows {
        assert_eq!(r.tenant.as_deref(), Some("search"), "{:?}", r.kind);
        assert_eq!(r.key_id.as_deref(), Some("emb-key"), "{:?}", r.kind);
    }
}
