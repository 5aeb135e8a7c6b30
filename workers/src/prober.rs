//! Active health probes: each worker process sends a small realistic request to every target that
//! opts in (`probe:` in its config), every `interval_ms` while healthy and every
//! `unhealthy_interval_ms` while its breaker is not closed. A probe goes through the same breaker as
//! traffic (so an open breaker is probed only once it half-opens) and its result — non-empty content
//! within `max_latency_ms` — is recorded there, which publishes any state change on
//! `<prefix>.health.<target>` for every ingress. Each probe is a real upstream call and leaves one
//! `upstream` usage event, under the tenant [`PROBE_TENANT`].

use crate::breaker::CallResult;
use crate::context::{Shared, adapter, base_url};
use crate::provider::Upstream;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::request::{Content, Message, Role, SamplingParams, TargetRef};
use switchyard_schemas::usage::UsageStatus;
use switchyard_schemas::{
    ChatRequest, ErrorClass, ErrorInfo, FrameBody, Usage, UsageEvent, UsageKind, now_ms,
};
use tokio_util::sync::CancellationToken;

/// Tenant recorded on probe usage events, so reports can tell probes from traffic.
pub use switchyard_schemas::usage::PROBE_TENANT;

/// Runs probes until `shutdown`.
pub(crate) async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut next: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let config = shared.opts.config.get();
        let now = Instant::now();
        for target in config.targets.iter().filter(|t| t.enabled) {
            // Shutdown waits for this task: at most the probe in flight, not one per target.
            if shutdown.is_cancelled() {
                return;
            }
            let Some(probe) = &target.probe else { continue };
            if next.get(&target.id).is_some_and(|at| *at > now) {
                continue;
            }
            let healthy = probe_once(&shared, &config, target, probe).await;
            let every = if healthy {
                probe.interval_ms
            } else {
                probe.unhealthy_interval_ms
            };
            next.insert(
                target.id.clone(),
                Instant::now() + Duration::from_millis(every),
            );
        }
    }
}

/// One probe; returns whether the target looked healthy (a refused admission counts as not).
async fn probe_once(
    shared: &Shared,
    config: &Arc<switchyard_schemas::config::GatewayConfig>,
    target: &switchyard_schemas::config::TargetConfig,
    probe: &switchyard_schemas::routing::Probe,
) -> bool {
    let Ok(permit) = shared.breakers.admit(config, target) else {
        return false;
    };
    let req = ChatRequest {
        prompt_tokens: None,
        id: uuid::Uuid::now_v7(),
        tenant: Some(PROBE_TENANT.into()),
        key_id: None,
        model: format!("probe/{}", target.id),
        target: TargetRef {
            id: target.id.clone(),
            provider: target.provider.as_str().to_owned(),
            upstream_model: target.upstream_model.clone(),
        },
        messages: vec![Message {
            role: Role::User,
            content: Some(Content::Text(probe.prompt.clone())),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            thinking_blocks: Vec::new(),
            cache_control: None,
        }],
        tools: Vec::new(),
        tool_choice: None,
        params: SamplingParams {
            max_tokens: Some(probe.max_tokens),
            temperature: Some(0.0),
            ..SamplingParams::default()
        },
        stream: true,
        include_usage: false,
        deadline_ms: now_ms() + probe.max_latency_ms,
        attempt: 0,
        batch_id: None,
        passthrough: Default::default(),
    };
    let started = Instant::now();
    let limit = Duration::from_millis(probe.max_latency_ms);
    let base = base_url(shared, target);
    let up = Upstream {
        http: &shared.http,
        target,
        base_url: &base,
    };
    let call = async {
        let mut stream = adapter(target.provider).stream_chat(up, &req).await?;
        let (mut text, mut usage) = (String::new(), Usage::default());
        while let Some(ev) = stream.next().await {
            match ev? {
                FrameBody::Text { text: t } => text.push_str(&t),
                FrameBody::Usage { usage: u } => usage = u,
                FrameBody::End { .. } => return Ok((text, usage)),
                _ => {}
            }
        }
        Err(ErrorInfo::new(
            ErrorClass::Protocol,
            "probe stream ended without an end event",
        ))
    };
    let outcome = match tokio::time::timeout(limit, call).await {
        Ok(Ok((text, usage))) if !text.trim().is_empty() => Ok(usage),
        Ok(Ok((_, usage))) => {
            let _ = usage;
            Err(ErrorInfo::new(
                ErrorClass::Protocol,
                "probe answer was empty",
            ))
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ErrorInfo::new(
            ErrorClass::Timeout,
            "probe exceeded max_latency_ms",
        )),
    };
    let took = started.elapsed();
    let (healthy, usage, error) = match &outcome {
        Ok(u) => (true, *u, None),
        Err(e) => (false, Usage::default(), Some(e.clone())),
    };
    let result = match &error {
        // An empty or too-slow answer is a failure of the target, whatever its class.
        Some(e) if matches!(e.class, ErrorClass::Protocol | ErrorClass::Timeout) => {
            CallResult::Failure
        }
        other => CallResult::of(other.as_ref()),
    };
    permit.record(result, took);
    tracing::debug!(target = %target.id, healthy, ms = took.as_millis() as u64, "active probe");
    let event = UsageEvent {
        tenant: req.tenant.clone(),
        target: Some(target.id.clone()),
        upstream_model: Some(target.upstream_model.clone()),
        usage,
        status: if healthy {
            UsageStatus::Ok
        } else {
            UsageStatus::Error
        },
        error_class: error.map(|e| e.class),
        latency_ms: took.as_millis() as u64,
        ..UsageEvent::new(req.id, UsageKind::Upstream, now_ms(), req.model.clone())
    };
    shared.usage.publish(event).await;
    healthy
}
