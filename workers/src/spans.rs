//! The worker's OpenTelemetry spans (docs/tracing.md), created only when span export is on
//! ([`switchyard_schemas::trace::enabled`]; otherwise [`Span::none`], which costs nothing):
//!
//! * `switchyard.worker` (server): one request taken from NATS, child of the ingress attempt
//!   whose `traceparent` the message carries; admission (breaker, limits) and retries run in it.
//! * `"{gen_ai.operation.name} {gen_ai.request.model}"` (client), e.g. `chat gpt-4o-mini`: one
//!   upstream HTTP call, with the GenAI semantic conventions' attributes. Never a prompt, an
//!   answer, a header or a credential.

use switchyard_schemas::config::TargetConfig;
use switchyard_schemas::trace::{OpenTelemetrySpanExt, StringValue, Value, enabled};
use switchyard_schemas::{ChatRequest, FinishReason, Usage};
use tracing::Span;

/// Runs `handle(msg)` (one request message's handling) in the message's [`worker`] span and
/// with its request id for the upstream's `X-Request-Id` ([`crate::provider::with_request_id`]).
/// Not an `async fn`, for the reason given at [`crate::provider::with_request_id`].
pub fn in_request<F, Fut>(
    msg: async_nats::Message,
    handle: F,
) -> impl std::future::Future<Output = Fut::Output>
where
    F: FnOnce(async_nats::Message) -> Fut,
    Fut: std::future::Future,
{
    let span = worker(msg.headers.as_ref());
    let id = switchyard_schemas::trace::request_id(msg.headers.as_ref());
    let run = crate::provider::with_request_id(id, handle(msg));
    tracing::Instrument::instrument(run, span)
}

/// The span of one request message (`headers`: its NATS headers).
pub fn worker(headers: Option<&async_nats::HeaderMap>) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(target: "switchyard::worker", "request",
        otel.name = "switchyard.worker", otel.kind = "server");
    switchyard_schemas::trace::adopt(&span, headers);
    if let Some(id) = switchyard_schemas::trace::request_id(headers) {
        span.set_attribute("switchyard.request_id", id);
    }
    span
}

/// The client span of one upstream call for `req` on `target` (`base`: the URL called).
pub fn upstream(target: &TargetConfig, req: &ChatRequest, base: &str) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = gen_ai_client("chat", target);
    let p = &req.params;
    if let Some(m) = p.max_tokens {
        span.set_attribute("gen_ai.request.max_tokens", i64::from(m));
    }
    if let Some(t) = p.temperature {
        span.set_attribute("gen_ai.request.temperature", t);
    }
    if let Some(t) = p.top_p {
        span.set_attribute("gen_ai.request.top_p", t);
    }
    span.set_attribute("switchyard.target", target.id.clone());
    span.set_attribute("switchyard.attempt", i64::from(req.attempt));
    server(&span, base);
    span
}

/// The client span of one upstream embeddings call on `target` (`base`: the URL called).
pub fn embeddings(target: &TargetConfig, base: &str) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = gen_ai_client("embeddings", target);
    span.set_attribute("switchyard.target", target.id.clone());
    server(&span, base);
    span
}

/// The client span `"{operation} {upstream_model}"` of one upstream call on `target`, with the
/// GenAI attributes every call has: `gen_ai.operation.name`, `gen_ai.provider.name` and
/// `gen_ai.request.model`.
fn gen_ai_client(operation: &'static str, target: &TargetConfig) -> Span {
    let name = format!("{operation} {}", target.upstream_model);
    let span = tracing::info_span!(target: "switchyard::worker", "upstream",
        otel.name = name.as_str(), otel.kind = "client");
    span.set_attribute("gen_ai.operation.name", operation);
    span.set_attribute(
        "gen_ai.provider.name",
        switchyard_schemas::trace::gen_ai_provider(target.provider.as_str()).to_owned(),
    );
    span.set_attribute("gen_ai.request.model", target.upstream_model.clone());
    span
}

/// Records an embeddings call's outcome on its `span`: input tokens, or the error class.
pub fn embedded(span: &Span, result: Result<&Usage, &switchyard_schemas::ErrorInfo>) {
    if span.is_none() {
        return;
    }
    match result {
        Ok(u) => span.set_attribute("gen_ai.usage.input_tokens", u.prompt_tokens as i64),
        Err(e) => switchyard_schemas::trace::fail(span, e.class.as_str()),
    }
}

/// `server.address` and `server.port` of the upstream `base` URL.
fn server(span: &Span, base: &str) {
    if let Ok(u) = reqwest::Url::parse(base) {
        if let Some(h) = u.host_str() {
            span.set_attribute("server.address", h.to_owned());
        }
        if let Some(port) = u.port_or_known_default() {
            span.set_attribute("server.port", i64::from(port));
        }
    }
}

/// Records a completed answer on the current (upstream) span: the model that answered, the
/// call's token usage and its finish reason.
pub fn answered(model: &str, usage: Option<&Usage>, finish: FinishReason) {
    let span = Span::current();
    if span.is_none() {
        return;
    }
    span.set_attribute("gen_ai.response.model", model.to_owned());
    if let Some(u) = usage {
        span.set_attribute("gen_ai.usage.input_tokens", u.prompt_tokens as i64);
        span.set_attribute("gen_ai.usage.output_tokens", u.completion_tokens as i64);
    }
    span.set_attribute(
        "gen_ai.response.finish_reasons",
        Value::Array(vec![StringValue::from(finish.as_str())].into()),
    );
}
