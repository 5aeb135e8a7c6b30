//! Embeddings requests: one NATS request, one [`EmbedReply`], one `upstream` usage event.

use crate::context::{Shared, adapter, base_url};
use crate::provider::Upstream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::embed::{EmbedReply, EmbedRequest};
use switchyard_schemas::usage::UsageStatus;
use switchyard_schemas::{ErrorClass, ErrorInfo, Usage, UsageEvent, UsageKind, now_ms};

/// Serves one embeddings request message, in its span ([`crate::spans::worker`]) and with its
/// request id for the upstream's `X-Request-Id` ([`crate::spans::in_request`]).
pub(crate) fn handle(
    shared: Arc<Shared>,
    msg: async_nats::Message,
) -> impl std::future::Future<Output = ()> {
    crate::spans::in_request(msg, |msg| handle_request(shared, msg))
}

async fn handle_request(shared: Arc<Shared>, msg: async_nats::Message) {
    let Some(reply) = msg.reply.clone() else {
        return;
    };
    let answer = |r: EmbedReply| {
        let nats = shared.nats.clone();
        let reply = reply.clone();
        async move {
            if let Ok(bytes) = serde_json::to_vec(&r)
                && let Err(e) = nats.publish(reply, bytes.into()).await
            {
                tracing::warn!(error = %e, "embeddings reply failed");
            }
        }
    };
    let req: EmbedRequest = match serde_json::from_slice(&msg.payload) {
        Ok(r) => r,
        Err(e) => {
            let error = ErrorInfo::new(
                ErrorClass::Internal,
                format!("worker cannot decode request: {e}"),
            );
            answer(EmbedReply::Error { error }).await;
            return;
        }
    };
    let config = shared.opts.config.get();
    let Some(target) = config.target(&req.target.id).cloned() else {
        let error = ErrorInfo::new(
            ErrorClass::NotFound,
            format!("target `{}` is not configured", req.target.id),
        );
        answer(EmbedReply::Error { error }).await;
        return;
    };
    let started = Instant::now();
    let limit = Duration::from_millis(
        config
            .timeouts
            .first_byte_ms
            .min(req.deadline_ms.saturating_sub(now_ms())),
    );
    let base = base_url(&shared, &target);
    let span = crate::spans::embeddings(&target, &base);
    let up = Upstream {
        http: &shared.http,
        target: &target,
        base_url: &base,
    };
    let call = adapter(target.provider).embed(up, &req);
    let timed = tracing::Instrument::instrument(tokio::time::timeout(limit, call), span.clone());
    let result = match timed.await {
        Ok(r) => r,
        Err(_) => Err(ErrorInfo::new(
            ErrorClass::Timeout,
            "timed out waiting for the embeddings answer",
        )),
    };
    crate::spans::embedded(&span, result.as_ref().map(|e| &e.usage));
    drop(span);
    let (usage, status, error_class, reply) = match result {
        Ok(e) => {
            let usage = e.usage;
            let worker = shared.opts.worker_id.clone();
            (
                usage,
                UsageStatus::Ok,
                None,
                EmbedReply::Ok {
                    vectors: e.vectors,
                    usage,
                    worker,
                },
            )
        }
        Err(error) => (
            Usage::default(),
            UsageStatus::Error,
            Some(error.class),
            EmbedReply::Error { error },
        ),
    };
    answer(reply).await;
    let event = UsageEvent {
        attempt: req.attempt,
        tenant: req.tenant,
        key_id: req.key_id,
        target: Some(target.id),
        upstream_model: Some(target.upstream_model),
        usage,
        status,
        error_class,
        latency_ms: started.elapsed().as_millis() as u64,
        batch_id: req.batch_id,
        ..UsageEvent::new(req.id, UsageKind::Upstream, now_ms(), req.model)
    };
    shared.usage.publish(event).await;
}
