//! Publishes the breaker and cooldown state changes of this worker on `<prefix>.health.<target>`
//! (JSON [`HealthEvent`], plain NATS, in the order they happened).

use switchyard_schemas::health::HealthEvent;
use switchyard_schemas::subjects::Subjects;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Spawns on `tasks` the task that publishes every event of `events`, counting each in `metrics`
/// ([`switchyard_schemas::metrics::BREAKER`]), until the channel closes or `stop` fires (events
/// already queued then are still published).
pub fn spawn_publisher(
    tasks: &TaskTracker,
    stop: CancellationToken,
    nats: async_nats::Client,
    subjects: Subjects,
    mut events: mpsc::UnboundedReceiver<HealthEvent>,
    metrics: switchyard_schemas::metrics::Registry,
) {
    tasks.spawn(async move {
        loop {
            let event = tokio::select! {
                // Queued events first, so none sent before `stop` is lost.
                biased;
                event = events.recv() => match event {
                    Some(event) => event,
                    None => break,
                },
                _ = stop.cancelled() => break,
            };
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
    });
}
