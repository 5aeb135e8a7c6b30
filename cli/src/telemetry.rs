//! The process's tracing subscriber: log lines on stderr (`--log-format`, filtered by
//! `RUST_LOG`) and, when the config's `tracing.endpoint` is set, an OpenTelemetry layer that
//! exports Switchyard's spans over OTLP/HTTP (docs/tracing.md).
//!
//! The exporter runs behind the SDK's batch span processor (its own thread, a bounded queue of
//! 2,048 spans that drops when full): a request never waits on the collector. [`Telemetry::shutdown`]
//! flushes what is queued when the process stops.

use crate::log_format::{JsonLines, LogFormat};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use switchyard_schemas::trace::{OtlpProtocol, TracingConfig};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The installed exporter; [`Telemetry::shutdown`] flushes it.
#[derive(Default)]
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still queued (waits for the collector, bounded by the export timeout)
    /// and stops the exporter thread.
    pub(crate) fn shutdown(self) {
        if let Some(p) = self.provider {
            if let Err(e) = p.force_flush() {
                eprintln!("switchyard: flushing spans failed: {e}");
            }
            if let Err(e) = p.shutdown() {
                eprintln!("switchyard: stopping the span exporter failed: {e}");
            }
        }
    }
}

type Boxed = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

/// Installs the global subscriber: logs in `format` at `RUST_LOG`, else at `default_level`,
/// plus span export when `tracing` has an endpoint (`service` names the resource unless
/// `tracing.service_name` does). An exporter that cannot be built is reported on stderr and the
/// process runs without it.
pub(crate) fn init(
    format: LogFormat,
    default_level: &str,
    tracing: Option<&TracingConfig>,
    service: &str,
) -> Telemetry {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs: Boxed = match format {
        LogFormat::Json => Box::new(
            logs.with_ansi(false)
                .event_format(JsonLines)
                .with_filter(filter),
        ),
        // Colours only on a terminal (and never with NO_COLOR): log files stay plain text.
        LogFormat::Text => Box::new(
            logs.with_ansi(
                std::io::IsTerminal::is_terminal(&std::io::stderr())
                    && std::env::var_os("NO_COLOR").is_none(),
            )
            .with_filter(filter),
        ),
    };
    let (otel, telemetry) = match tracing.filter(|t| t.endpoint.is_some()) {
        Some(t) => match exporter(t, service) {
            Ok((layer, provider)) => (
                Some(layer),
                Telemetry {
                    provider: Some(provider),
                },
            ),
            Err(e) => {
                eprintln!("switchyard: span export off: {e}");
                (None, Telemetry::default())
            }
        },
        None => (None, Telemetry::default()),
    };
    let on = otel.is_some();
    let layers: Vec<Boxed> = std::iter::once(logs).chain(otel).collect();
    tracing_subscriber::registry().with(layers).init();
    switchyard_schemas::trace::set_enabled(on);
    telemetry
}

/// The OTLP/HTTP exporter behind a batch processor, and the layer feeding it Switchyard's spans
/// only (targets `switchyard*`; no events, so no log line — and no prompt — becomes a span event).
fn exporter(t: &TracingConfig, service: &str) -> Result<(Boxed, SdkTracerProvider), String> {
    let url = t.traces_url().unwrap_or_default();
    let headers = t
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.expose().to_owned()))
        .collect();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .with_protocol(match t.protocol {
            OtlpProtocol::HttpProtobuf => Protocol::HttpBinary,
            OtlpProtocol::HttpJson => Protocol::HttpJson,
        })
        .with_timeout(std::time::Duration::from_millis(t.export_timeout_ms))
        .with_headers(headers)
        .build()
        .map_err(|e| format!("OTLP exporter: {e}"))?;
    let name = t.service_name.clone().unwrap_or_else(|| service.to_owned());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            t.sample_ratio,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(name)
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("switchyard");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_target(false)
        .with_level(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.is_span() && m.target().starts_with("switchyard")
        }));
    Ok((Box::new(layer), provider))
}
