//! `GET /metrics` of a service without its own HTTP server (`switchyard worker --metrics-listen`,
//! `switchyard billing --metrics-listen`): the Prometheus text of the service's registry, its
//! collectors run at each scrape. Ingress serves its own `/metrics`; `switchyard up` shares one
//! registry between its services, so its ingress's `/metrics` shows them all (docs/metrics.md).

use std::net::SocketAddr;
use switchyard_schemas::metrics::Registry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Binds `addr` and serves `registry` at `GET /metrics` until `shutdown`, in a task on `tasks`
/// that ends once the server stopped (wait on `tasks` at exit). Returns the bound address; fails
/// when `addr` cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    registry.scrape().await,
                )
            }
        }),
    );
    tracing::info!("metrics on http://{bound}/metrics");
    tasks.spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "metrics listener failed");
        }
    });
    Ok(bound)
}
