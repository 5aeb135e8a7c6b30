//! Publishes the breaker and cooldown state changes of this worker on `<prefix>.health.<target>`
//! (JSON [`HealthEvent`], plain NATS, in the order they happened).

use switchyard_schemas::health::HealthEvent;
use switchyard_schemas::subjects::Subjects;
use tokio::sync::mpsc;

/// Spawns the task that publishes every event of `events` until the channel closes, counting
/// each in `metrics` ([`switchyard_schemas::metrics::BREAKER`]).
pub fn spawn_publisher(
    nats: async_nats::Client,
    subjects: Subjects,
    mut events: mpsc::UnboundedReceiver<HealthEvent>,
    metrics: switchyard_schemas::metrics::Registry,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            metrics
                .counter(
                    switchyard_schemas::metrics::BREAKER,
                    &[("target", &event.target), ("state", event.state.as_str())],
                )
                .increment(1);
            let subject = subjects.health(&event.target);
            match serde_json::to_vec(&event) {
                Ok(bytes) => {
                    if let Err(e) = nats.publish(subject, bytes.into()).await {
                        tracing::warn!(error = %e, "publishing a health event failed");
                    }
                }
                Err(e) => tracing::error!(error = %e, "encoding a health event failed"),
            }
        }
    })
}
