//! Token-count requests (`<prefix>.req.count.<provider>`): one NATS request, one
//! [`CountReply`]. A count is not generation: no frames, no usage event, no RPM/TPM limit.

use crate::context::{Shared, adapter, base_url};
use crate::provider::Upstream;
use std::sync::Arc;
use std::time::Duration;
use switchyard_schemas::count::CountReply;
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, now_ms};

/// Serves one count request message.
pub(crate) async fn handle(shared: Arc<Shared>, msg: async_nats::Message) {
    let Some(reply) = msg.reply.clone() else {
        return;
    };
    let answer = count(&shared, &msg.payload).await;
    let answer = match answer {
        Ok(input_tokens) => CountReply::Ok {
            input_tokens,
            worker: shared.opts.worker_id.clone(),
        },
        Err(error) => CountReply::Error { error },
    };
    if let Ok(bytes) = serde_json::to_vec(&answer)
        && let Err(e) = shared.nats.publish(reply, bytes.into()).await
    {
        tracing::warn!(error = %e, "count reply failed");
    }
}

async fn count(shared: &Shared, payload: &[u8]) -> Result<u64, ErrorInfo> {
    let req: ChatRequest = serde_json::from_slice(payload).map_err(|e| {
        ErrorInfo::new(
            ErrorClass::Internal,
            format!("worker cannot decode request: {e}"),
        )
    })?;
    let config = shared.opts.config.get();
    let target = config.target(&req.target.id).cloned().ok_or_else(|| {
        ErrorInfo::new(
            ErrorClass::NotFound,
            format!("target `{}` is not configured", req.target.id),
        )
    })?;
    let limit = Duration::from_millis(
        config
            .timeouts
            .first_byte_ms
            .min(req.deadline_ms.saturating_sub(now_ms())),
    );
    let base = base_url(shared, &target);
    let up = Upstream {
        http: &shared.http,
        target: &target,
        base_url: &base,
    };
    let call = adapter(target.provider).count_tokens(up, &req);
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(ErrorInfo::new(
            ErrorClass::Timeout,
            "timed out waiting for the token count",
        ))
    })
}
