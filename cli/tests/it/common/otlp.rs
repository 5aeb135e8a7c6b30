//! An OTLP collector stand-in: an OTLP/HTTP receiver (`POST /v1/traces`, protobuf) that keeps
//! every span it is sent, with its resource's `service.name`.

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use prost::Message;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// One received span.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    /// `service.name` of the exporting process.
    pub service: String,
    pub span: opentelemetry_proto::tonic::trace::v1::Span,
}

impl Received {
    pub(crate) fn name(&self) -> &str {
        &self.span.name
    }
    pub(crate) fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
    pub(crate) fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }
    pub(crate) fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }
    /// The span's attributes as JSON values (strings, integers, doubles, booleans, arrays).
    pub(crate) fn attrs(&self) -> BTreeMap<String, Value> {
        self.span
            .attributes
            .iter()
            .map(|kv| (kv.key.clone(), json(kv.value.as_ref())))
            .collect()
    }
    pub(crate) fn attr(&self, key: &str) -> Value {
        self.attrs().remove(key).unwrap_or(Value::Null)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn json(v: Option<&AnyValue>) -> Value {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => Value::from(s.clone()),
        Some(any_value::Value::IntValue(i)) => Value::from(*i),
        Some(any_value::Value::DoubleValue(d)) => Value::from(*d),
        Some(any_value::Value::BoolValue(b)) => Value::from(*b),
        Some(any_value::Value::ArrayValue(a)) => {
            Value::Array(a.values.iter().map(|v| json(Some(v))).collect())
        }
        _ => Value::Null,
    }
}

#[derive(Clone, Default)]
struct Store {
    spans: Arc<parking_lot::Mutex<Vec<Received>>>,
    changed: Arc<tokio::sync::Notify>,
    /// Export requests received.
    posts: Arc<std::sync::atomic::AtomicUsize>,
}

/// The running receiver; dropping it stops the server.
pub(crate) struct Collector {
    /// `http://127.0.0.1:<port>` (the exporter's endpoint; spans arrive on `/v1/traces`).
    pub url: String,
    store: Store,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn traces(axum::extract::State(store): axum::extract::State<Store>, body: Bytes) -> Vec<u8> {
    let req = ExportTraceServiceRequest::decode(body).unwrap();
    let mut got = Vec::new();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .map(|kv| {
                json(kv.value.as_ref())
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                got.push(Received {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    store.spans.lock().extend(got);
    store
        .posts
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    store.changed.notify_waiters();
    ExportTraceServiceResponse::default().encode_to_vec()
}

impl Collector {
    pub(crate) async fn start() -> Self {
        let store = Store::default();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(traces))
            .with_state(store.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            url,
            store,
            _stop: stop,
        }
    }

    /// Every span received so far.
    pub(crate) fn spans(&self) -> Vec<Received> {
        self.store.spans.lock().clone()
    }

    /// Waits (woken by each export, at most `limit`) until `done` holds for the spans received,
    /// and returns them.
    pub(crate) async fn wait_until(
        &self,
        limit: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.store.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!(
                    "collector: condition not met within {limit:?}; {} spans: {:?}",
                    spans.len(),
                    spans
                        .iter()
                        .map(|s| (&s.service, s.name()))
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}
