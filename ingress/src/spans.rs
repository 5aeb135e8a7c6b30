//! Ingress's OpenTelemetry spans (docs/tracing.md). Created only when span export is on
//! ([`switchyard_schemas::trace::enabled`]); otherwise every helper returns
//! [`tracing::Span::none`] and costs nothing.
//!
//! Per HTTP request: the server span `"{method} {route}"` (its parent the client's
//! `traceparent`, when sent), and under it `switchyard.cache.lookup` (client: a NATS request to
//! the cache service), `switchyard.admit` and one `switchyard.attempt` per candidate tried; each
//! attempt's context rides to the worker in the NATS headers. Attribute names are the
//! OpenTelemetry GenAI and HTTP semantic conventions' own.

use switchyard_schemas::UsageEvent;
use switchyard_schemas::trace::{OpenTelemetrySpanExt, Value, enabled};
use tracing::Span;

/// An internal span named `name` under the current one; none outside a request's span (a batch
/// item's attempts make no trace of their own).
pub fn internal(name: &'static str) -> Span {
    if !enabled() || Span::current().is_none() {
        return Span::none();
    }
    tracing::info_span!(target: "switchyard::ingress", "span", otel.name = name, otel.kind = "internal")
}

/// A client span named `name` (a NATS request this process makes) under the current one; none
/// outside a request's span.
pub fn client(name: &'static str) -> Span {
    if !enabled() || Span::current().is_none() {
        return Span::none();
    }
    tracing::info_span!(target: "switchyard::ingress", "span", otel.name = name, otel.kind = "client")
}

/// Adds the request id `shown` (`X-Request-Id`: the client's, else the gateway's, see
/// [`crate::context::RequestContext::shown_request_id`]) and the current span's `traceparent`
/// to the NATS headers of a message sent on the request's behalf.
pub fn nats_headers(headers: &mut async_nats::HeaderMap, shown: &str) {
    headers.insert(switchyard_schemas::trace::REQUEST_ID_HEADER, shown);
    switchyard_schemas::trace::inject(&Span::current(), headers);
}

/// `gen_ai.operation.name` of a front-door path (`None` for the other routes).
pub fn operation(path: &str) -> Option<&'static str> {
    match path {
        "/v1/chat/completions" | "/v1/messages" | "/v1/responses" => Some("chat"),
        "/v1/completions" => Some("text_completion"),
        "/v1/embeddings" => Some("embeddings"),
        _ => None,
    }
}

/// The server span of one HTTP request: `"{method} {route}"`, child of the client's
/// `traceparent` when it sent a valid one; carries the request ids from the start.
pub fn request(req: &axum::extract::Request, request_id: &str, gateway_id: &str) -> Span {
    if !enabled() {
        return Span::none();
    }
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| req.uri().path().to_owned(), |m| m.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let name = format!("{method} {route}");
    let span = tracing::info_span!(target: "switchyard::ingress", "request",
        otel.name = name.as_str(), otel.kind = "server");
    let headers = req.headers();
    let cx = opentelemetry_cx(headers);
    let _ = span.set_parent(cx);
    span.set_attribute("http.request.method", method);
    span.set_attribute("http.route", route);
    span.set_attribute("switchyard.request_id", request_id.to_owned());
    span.set_attribute("switchyard.gateway_request_id", gateway_id.to_owned());
    if let Some(op) = operation(req.uri().path()) {
        span.set_attribute("gen_ai.operation.name", op);
    }
    span
}

fn opentelemetry_cx(headers: &axum::http::HeaderMap) -> switchyard_schemas::trace::Context {
    switchyard_schemas::trace::extract(|k| headers.get(k).and_then(|v| v.to_str().ok()))
}

/// Records the request's outcome on its server span from its charge event `e`: the GenAI
/// attributes (models, provider, tokens, finish reason) and the gateway's (target, fallbacks,
/// cache hit, status). No prompt, answer or credential is ever set.
pub fn finish(span: &Span, e: &UsageEvent, provider: Option<&str>) {
    if span.is_none() {
        return;
    }
    span.set_attribute("gen_ai.request.model", e.model.clone());
    if let Some(m) = &e.upstream_model {
        span.set_attribute("gen_ai.response.model", m.clone());
    }
    if let Some(p) = provider {
        span.set_attribute(
            "gen_ai.provider.name",
            switchyard_schemas::trace::gen_ai_provider(p).to_owned(),
        );
    }
    span.set_attribute("gen_ai.usage.input_tokens", e.usage.prompt_tokens as i64);
    span.set_attribute(
        "gen_ai.usage.output_tokens",
        e.usage.completion_tokens as i64,
    );
    if let Some(audit) = &e.audit {
        if let Some(r) = &audit.finish_reason {
            span.set_attribute(
                "gen_ai.response.finish_reasons",
                Value::Array(vec![switchyard_schemas::trace::StringValue::from(r.clone())].into()),
            );
        }
        if let Some(s) = audit.http_status {
            span.set_attribute("http.response.status_code", i64::from(s));
        }
    }
    if let Some(t) = &e.target {
        span.set_attribute("switchyard.target", t.clone());
    }
    span.set_attribute("switchyard.fallbacks", i64::from(e.fallbacks));
    span.set_attribute("switchyard.cache_hit", e.cache_hit);
    let status = match e.status {
        switchyard_schemas::usage::UsageStatus::Ok => "ok",
        switchyard_schemas::usage::UsageStatus::Error => "error",
        switchyard_schemas::usage::UsageStatus::Cancelled => "cancelled",
    };
    span.set_attribute("switchyard.status", status);
    if let Some(class) = e.error_class {
        switchyard_schemas::trace::fail(span, class.as_str());
    }
}
