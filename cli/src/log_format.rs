//! `--log-format json`: one JSON object per log line on stderr, for log shippers:
//! `{"ts": RFC 3339 UTC, "level": "INFO", "target": module path, "message": …, "fields": {…},
//! "trace_id": hex, "span_id": hex, "spans": [names, outermost first]}` (`trace_id`/`span_id` of
//! the innermost exported span, only when span export is on). Field values keep their JSON type when they are
//! numbers or booleans; everything else is its `Display`/`Debug` text.

use std::fmt;
use tracing::field::{Field, Visit};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable text (tracing's default format).
    #[default]
    Text,
    /// One JSON object per line ([`JsonLines`]).
    Json,
}

/// The JSON line formatter.
pub(crate) struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = serde_json::Map::new();
        event.record(&mut Fields(&mut fields));
        let ts = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let mut line = serde_json::Map::new();
        line.insert("ts".into(), ts.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        if let Some(m) = fields.remove("message") {
            line.insert("message".into(), m);
        }
        line.insert("fields".into(), serde_json::Value::Object(fields));
        if let Some(scope) = ctx.event_scope() {
            // The innermost exported span's ids (span export on, docs/tracing.md): the log line
            // joins its trace in the tracing backend.
            let spans: Vec<_> = scope.from_root().collect();
            let ids = spans.iter().rev().find_map(|s| {
                let ext = s.extensions();
                let d = ext.get::<tracing_opentelemetry::OtelData>()?;
                Some((d.trace_id()?, d.span_id()?))
            });
            if let Some((trace, span)) = ids {
                line.insert("trace_id".into(), trace.to_string().into());
                line.insert("span_id".into(), span.to_string().into());
            }
            let names: Vec<serde_json::Value> = spans.iter().map(|s| s.name().into()).collect();
            line.insert("spans".into(), names.into());
        }
        writeln!(w, "{}", serde_json::Value::Object(line))
    }
}

/// Collects an event's fields into a JSON map.
struct Fields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().to_owned(), value.to_string().into());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_level_target_message_fields_and_spans() {
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .event_format(JsonLines)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("request");
            let _g = span.enter();
            tracing::warn!(target: "switchyard::test", status = 503u64, ok = false, who = %"ops", "attempt failed");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let mut line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let ts = line.as_object_mut().unwrap().remove("ts").unwrap();
        assert!(ts.as_str().unwrap().ends_with('Z'), "{ts}");
        assert_eq!(
            line,
            serde_json::json!({
                "level": "WARN", "target": "switchyard::test", "message": "attempt failed",
                "fields": {"status": 503, "ok": false, "who": "ops"}, "spans": ["request"]
            })
        );
    }
}
