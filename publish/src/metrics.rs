//! The Prometheus collector of a producer process: its spool's size and the publish-error
//! counters. The family names stay in [`switchyard_schemas::metrics`].

use crate::publish::{PublishKind, publish_errors};
use crate::spool::Spool;
use std::sync::Arc;
use switchyard_schemas::metrics::{
    Counter, NATS_PUBLISH_ERRORS, Registry, SPOOL_BYTES, SPOOL_EVENTS,
};

/// Registers the collector of this process's usage `spool` (none: 0) and NATS publish errors
/// (process-wide counts: every registry of the process shows the same values).
pub fn add_process_collectors(registry: &Registry, spool: Option<Arc<Spool>>) {
    let r = registry.clone();
    let (events, bytes) = (r.gauge(SPOOL_EVENTS, &[]), r.gauge(SPOOL_BYTES, &[]));
    let errors: Vec<(&'static str, Counter)> = PublishKind::ALL
        .iter()
        .map(|k| {
            (
                k.as_str(),
                r.counter(NATS_PUBLISH_ERRORS, &[("subject", k.as_str())]),
            )
        })
        .collect();
    registry.add_collector(Arc::new(move || {
        let (events, bytes, errors) = (events.clone(), bytes.clone(), errors.clone());
        let spool = spool.clone();
        Box::pin(async move {
            for ((_, c), k) in errors.iter().zip(PublishKind::ALL) {
                c.absolute(publish_errors(*k));
            }
            let size = match spool {
                Some(s) => tokio::task::spawn_blocking(move || s.size())
                    .await
                    .unwrap_or_default(),
                None => (0, 0),
            };
            events.set(size.0 as f64);
            bytes.set(size.1 as f64);
        })
    }));
}
