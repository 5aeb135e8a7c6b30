//! Tracing (docs/tracing.md): the request id rules, the `tracing:` config section (OpenTelemetry
//! export over OTLP, off by default) and, with feature `nats`, W3C trace context carried in NATS
//! headers between ingress, cache and worker processes.
//!
//! Spans follow the OpenTelemetry GenAI semantic conventions (attribute names below are theirs:
//! `gen_ai.*` from the GenAI registry, `error.type`, `server.address`, `http.*` from the general
//! ones). They never carry prompts, answers, keys or any header value other than the request id.

use crate::secret::Secret;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// NATS and upstream HTTP header carrying the request id ([`well_formed_request_id`]) from
/// ingress to the cache and the workers, and from the workers to the upstream provider.
pub const REQUEST_ID_HEADER: &str = "X-Request-Id";

/// Longest client request id adopted, characters.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// The client's `X-Request-Id` when it is well-formed: 1 to [`MAX_REQUEST_ID_LEN`] characters of
/// `[A-Za-z0-9._:-]` (UUIDs, ULIDs, `req_…`, `trace:42` — nothing that could break a header, a
/// log line or a query). `None` otherwise: the gateway then uses its own UUIDv7.
pub fn well_formed_request_id(value: &str) -> Option<&str> {
    let ok = (1..=MAX_REQUEST_ID_LEN).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    ok.then_some(value)
}

/// OTLP wire protocol (`OTEL_EXPORTER_OTLP_PROTOCOL`'s values over HTTP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// `http/protobuf` (default): binary protobuf, `POST <endpoint>/v1/traces`.
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// `http/json`: the same messages as JSON.
    #[serde(rename = "http/json")]
    HttpJson,
}

/// The `tracing:` config section: OpenTelemetry span export over OTLP. Off unless `endpoint` is
/// set. Read at process start (a live config push does not change it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP base URL, e.g. `http://otel-collector:4318`; spans go to
    /// `<endpoint>/v1/traces`. `None` (default): no export, no spans are even created.
    pub endpoint: Option<String>,
    /// Wire protocol, default `http/protobuf`.
    #[serde(default)]
    pub protocol: OtlpProtocol,
    /// Extra HTTP headers on every export (e.g. `authorization`, a vendor's API key header);
    /// values are secrets: never logged, printed as `[redacted]`.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Share of new traces kept, 0.0..=1.0 (default 1.0). A trace started elsewhere keeps its
    /// parent's decision (the `traceparent` sampled flag), so a trace is whole or absent.
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
    /// `service.name` of the exported resource; default `switchyard-<service>` (`switchyard-ingress`,
    /// `switchyard-worker`, `switchyard-cache`, `switchyard` for `up`).
    pub service_name: Option<String>,
    /// Export timeout per batch, ms (default 10,000).
    #[serde(default = "default_export_timeout_ms")]
    pub export_timeout_ms: u64,
}

fn default_sample_ratio() -> f64 {
    1.0
}

fn default_export_timeout_ms() -> u64 {
    10_000
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            protocol: OtlpProtocol::default(),
            headers: BTreeMap::new(),
            sample_ratio: default_sample_ratio(),
            service_name: None,
            export_timeout_ms: default_export_timeout_ms(),
        }
    }
}

impl TracingConfig {
    /// Checks the section: an `http(s)://` endpoint, a ratio within 0..=1, header names that are
    /// valid HTTP tokens. Errors name the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(e) = &self.endpoint {
            let ok = url::Url::parse(e)
                .map(|u| matches!(u.scheme(), "http" | "https"))
                .unwrap_or(false);
            if !ok {
                return Err(format!(
                    "tracing.endpoint: `{e}` is not an http:// or https:// URL"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(format!(
                "tracing.sample_ratio: {} is outside 0.0..=1.0",
                self.sample_ratio
            ));
        }
        for name in self.headers.keys() {
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token {
                return Err(format!("tracing.headers: `{name}` is not a header name"));
            }
        }
        Ok(())
    }

    /// The traces URL: `<endpoint>/v1/traces` (the OTLP/HTTP signal path).
    pub fn traces_url(&self) -> Option<String> {
        self.endpoint
            .as_deref()
            .map(|e| format!("{}/v1/traces", e.trim_end_matches('/')))
    }
}

/// The `gen_ai.provider.name` of a provider kind (GenAI registry values; an OpenAI-compatible
/// server that is not OpenAI keeps the gateway's own kind name, as the convention asks for
/// providers it does not list).
pub fn gen_ai_provider(kind: &str) -> &str {
    match kind {
        "openai" => "openai",
        "anthropic" => "anthropic",
        "gemini" => "gcp.gemini",
        "azure_openai" => "azure.ai.openai",
        "bedrock" => "aws.bedrock",
        other => other,
    }
}

#[cfg(feature = "nats")]
pub use otel::*;

#[cfg(feature = "nats")]
mod otel {
    use opentelemetry::propagation::{Extractor, Injector};
    use std::sync::atomic::{AtomicBool, Ordering};
    pub use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// Re-exported for the crates that set span attributes ([`OpenTelemetrySpanExt`]).
    pub use opentelemetry::{Context, KeyValue, StringValue, Value};

    static ENABLED: AtomicBool = AtomicBool::new(false);

    /// Marks span export as on for this process (the CLI, once its exporter is installed).
    pub fn set_enabled(on: bool) {
        ENABLED.store(on, Ordering::Relaxed);
    }

    /// Whether spans are exported. When off, code creates [`tracing::Span::none`] instead of its
    /// spans: tracing costs nothing and log lines are unchanged.
    pub fn enabled() -> bool {
        ENABLED.load(Ordering::Relaxed)
    }

    struct HeaderInjector<'a>(&'a mut async_nats::HeaderMap);

    impl Injector for HeaderInjector<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key, value.as_str());
        }
    }

    /// The W3C trace context (`traceparent`, `tracestate`) read through `get` (a header lookup);
    /// an empty context when there is none or it is malformed.
    pub fn extract<'h>(get: impl Fn(&str) -> Option<&'h str>) -> Context {
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&Borrowed(&get)))
    }

    struct Borrowed<'a, 'h>(&'a dyn Fn(&str) -> Option<&'h str>);

    impl Extractor for Borrowed<'_, '_> {
        fn get(&self, key: &str) -> Option<&str> {
            (self.0)(key)
        }
        fn keys(&self) -> Vec<&str> {
            Vec::new()
        }
    }

    /// Writes `span`'s W3C trace context (`traceparent`, `tracestate`) into NATS `headers`.
    pub fn inject(span: &tracing::Span, headers: &mut async_nats::HeaderMap) {
        if !enabled() {
            return;
        }
        let cx = span.context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut HeaderInjector(headers));
        });
    }

    /// Makes the trace context in `headers` (when there is one) `span`'s parent.
    pub fn adopt(span: &tracing::Span, headers: Option<&async_nats::HeaderMap>) {
        let Some(h) = headers.filter(|_| enabled()) else {
            return;
        };
        let _ = span.set_parent(extract(|k| h.get(k).map(|v| v.as_str())));
    }

    /// The request id in NATS `headers` ([`super::REQUEST_ID_HEADER`]), when well-formed.
    pub fn request_id(headers: Option<&async_nats::HeaderMap>) -> Option<String> {
        headers
            .and_then(|h| h.get(super::REQUEST_ID_HEADER))
            .and_then(|v| super::well_formed_request_id(v.as_str()))
            .map(str::to_owned)
    }

    /// Marks `span` failed with `error_type` (`error.type`, the gateway's error class).
    pub fn fail(span: &tracing::Span, error_type: &str) {
        if !enabled() {
            return;
        }
        span.set_attribute("error.type", error_type.to_owned());
        span.set_status(opentelemetry::trace::Status::error(error_type.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids() {
        assert_eq!(well_formed_request_id("trace-123"), Some("trace-123"));
        assert_eq!(
            well_formed_request_id("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
            Some("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(well_formed_request_id("req_A.b:9"), Some("req_A.b:9"));
        assert_eq!(well_formed_request_id(""), None);
        assert_eq!(well_formed_request_id("has space"), None);
        assert_eq!(well_formed_request_id("quote\"s"), None);
        assert_eq!(well_formed_request_id("ünicode"), None);
        assert_eq!(
            well_formed_request_id(&"a".repeat(128)).map(str::len),
            Some(128)
        );
        assert_eq!(well_formed_request_id(&"a".repeat(129)), None);
    }

    #[test]
    fn config_defaults_and_checks() {
        let c: TracingConfig = serde_json::from_str("{}").unwrap_or_default();
        assert_eq!(c, TracingConfig::default());
        assert_eq!(c.traces_url(), None);
        let c: Result<TracingConfig, _> = serde_json::from_str(
            r#"{"endpoint": "http://c:4318/", "protocol": "http/json", "sample_ratio": 0.5,
                "headers": {"authorization": "Bearer s3cret"}, "service_name": "gw"}"#,
        );
        let c = c.unwrap_or_default();
        assert_eq!(c.protocol, OtlpProtocol::HttpJson);
        assert_eq!(c.traces_url().as_deref(), Some("http://c:4318/v1/traces"));
        assert_eq!(c.validate(), Ok(()));
        assert!(!format!("{c:?}").contains("s3cret"));
        let unknown: Result<TracingConfig, _> = serde_json::from_str(r#"{"endpiont": "x"}"#);
        assert!(unknown.is_err());
        let bad = TracingConfig {
            sample_ratio: 1.5,
            ..TracingConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = TracingConfig {
            endpoint: Some("collector:4318".into()),
            ..TracingConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
