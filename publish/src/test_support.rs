//! What the crate's tests share: a nats-server with the usage stream, and usage events.
#![allow(clippy::unwrap_used)]

use async_nats::jetstream;
use std::time::Duration;
use switchyard_schemas::subjects::Subjects;
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind};

/// An event of `kind` under a new request id (attempt 1, 7 + 3 tokens).
pub(crate) fn event(kind: UsageKind) -> UsageEvent {
    UsageEvent {
        target: Some("mock".into()),
        upstream_model: Some("mock".into()),
        usage: Usage {
            prompt_tokens: 7,
            completion_tokens: 3,
            ..Usage::default()
        },
        latency_ms: 1,
        ..UsageEvent::new(uuid::Uuid::now_v7(), kind, 1, "demo/mock")
    }
}

/// A server with the usage stream (2 min duplicate window) and a client whose JetStream
/// requests time out after 200 ms, so a publish gives up quickly while the server is down.
pub(crate) async fn server() -> (
    switchyard_natsd::NatsServer,
    jetstream::Context,
    jetstream::stream::Stream,
) {
    let server = switchyard_natsd::NatsServer::start_temp().unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut js = jetstream::new(client);
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: switchyard_schemas::subjects::USAGE_STREAM.into(),
            subjects: vec![Subjects::default().usage_all()],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
    js.set_timeout(Duration::from_millis(200));
    (server, js, stream)
}

/// Messages the stream holds.
pub(crate) async fn messages(stream: &mut jetstream::stream::Stream) -> u64 {
    stream.info().await.unwrap().state.messages
}
