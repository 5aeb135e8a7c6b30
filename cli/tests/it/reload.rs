//! Live config reload through NATS KV: a pushed config reaches a running gateway without a
//! restart, in-flight requests finish on the snapshot they started with, and invalid pushes are
//! refused before they reach any replica.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use futures::StreamExt;
use std::time::Duration;
use switchyard_mock::DEFAULT_TEXT;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn pushed_config_applies_without_restart_and_spares_in_flight_requests() {
    let gw = start(Options::default()).await;
    let client = async_nats::connect(gw.nats.url()).await.unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(switchyard::reload::watch_kv(
        client.clone(),
        gw.config.clone(),
        stop.clone(),
        std::sync::Arc::new(|_| Ok(())),
    ));

    // A slow stream starts on the old config (version 0).
    let resp = post(
        &gw.base,
        &chat("demo/mock", "#mock chunk_delay_ms=40", true),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let mut in_flight = resp.bytes_stream();
    let _first = in_flight.next().await.unwrap().unwrap();

    // New config: `demo/mock` renamed to `demo/renamed`.
    let mut next = test_config(serde_json::json!({}));
    next.models.retain(|m| m.id != "demo/mock");
    next.models
        .push(serde_yaml_ng::from_str("{id: demo/renamed, targets: [mock]}").unwrap());
    let yaml = serde_yaml_ng::to_string(&next)
        .unwrap()
        .replace("'[redacted]'", "''");
    let version = switchyard::reload::push(&client, &yaml).await.unwrap();
    eventually(Duration::from_secs(5), || {
        let v = gw.config.version();
        async move { (v == version).then_some(()) }
    })
    .await;

    // The in-flight stream still completes with the whole answer.
    let mut rest = Vec::new();
    while let Some(chunk) = in_flight.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(rest).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(text.contains("\"finish_reason\":\"stop\""));

    // New requests see the new config.
    let (status, _, _) = post_json(&gw.base, &chat("demo/mock", "hi", false)).await;
    assert_eq!(status, 404);
    let (status, _, body) = post_json(&gw.base, &chat("demo/renamed", "hi", false)).await;
    assert_eq!(status, 200);
    assert_eq!(body["choices"][0]["message"]["content"], DEFAULT_TEXT);
    assert_eq!(body["model"], "demo/renamed");

    // An invalid config is refused at push time, naming the field, and nothing changes.
    let bad = yaml.replace("targets:\n  - mock", "targets:\n  - nope");
    let err = switchyard::reload::push(&client, &bad)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown target `nope`"), "{err}");
    assert_eq!(gw.config.version(), version);
    stop.cancel();
}
