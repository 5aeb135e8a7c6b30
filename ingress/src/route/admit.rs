//! The admit stage: which model serves the request, and whether the caller's rate limits
//! ([`crate::rate_limit`]) and budgets admit it.

use super::timeouts::RequestTimeouts;
use super::{Inbound, routed_model};
use crate::AppState;
use crate::budget;
use crate::charge::Charge;
use crate::context::RequestContext;
use crate::error::ApiError;
use crate::metrics::Outcome;
use std::sync::Arc;
use std::time::Instant;
use switchyard_schemas::config::{GatewayConfig, ModelConfig};
use switchyard_schemas::request::TargetRef;
use switchyard_schemas::routing::Policy;
use switchyard_schemas::{ChatRequest, ErrorInfo, now_ms};

/// The records every admitted request keeps until its outcome: the `charge` usage event (which
/// also settles the budget reservation) and the metrics outcome. Chat and embeddings both use it.
pub struct Ledger {
    /// The charge event.
    pub charge: Charge,
    /// The request's metrics record.
    pub outcome: Outcome,
}

impl Ledger {
    /// Records `error` as the request's outcome (the charge with its class, the metrics with its
    /// HTTP status) and returns it as the client's error.
    pub fn fail(self, error: ErrorInfo) -> ApiError {
        let Self {
            mut charge,
            mut outcome,
        } = self;
        let request_id = charge.request_id();
        let class = error.class;
        let mut api = ApiError::from(error);
        charge.http_status(api.status.as_u16());
        charge.finish(Some(class));
        api.request_id = request_id;
        outcome.finish(api.status.as_u16());
        api
    }
}

/// A chat request the gateway accepted: what the plan and attempt stages work from.
pub struct Admitted<'c> {
    /// The model that serves (the cheaper one after a budget downgrade).
    pub model: &'c ModelConfig,
    /// Its routing policy, if it names one.
    pub policy: Option<&'c Policy>,
    /// The model the client asked for, when the downgrade served a cheaper one.
    pub downgraded_from: Option<String>,
    /// The normalised request; `target` is empty and `attempt` 0 until an attempt fills them.
    pub req: ChatRequest,
    /// The request's timeouts (global, with the policy's overrides).
    pub timeouts: RequestTimeouts,
    /// When the whole request expires (admission + `timeouts.total`).
    pub deadline: Instant,
    /// Charge event and metrics outcome.
    pub ledger: Ledger,
    /// The prompt's token estimate per message, when admission tokenized it (its total is
    /// `req.prompt_tokens`); planning reuses it instead of tokenizing again.
    pub estimate: Option<crate::trim::Estimate>,
}

/// Admits `inbound`: the routed model (`x-switchyard-route` or the body's), the cost-priority
/// downgrade ([`budget::choose_model`]), the key/tenant rate limits ([`crate::rate_limit::admit`])
/// and the budget reservation ([`budget::reserve_tokens`]).
/// A refusal is counted in the metrics but leaves no usage record.
pub async fn admit<'c>(
    app: &Arc<AppState>,
    ctx: &RequestContext,
    config: &'c GatewayConfig,
    inbound: Inbound,
) -> Result<Admitted<'c>, ApiError> {
    let model = routed_model(config, &inbound.model, &ctx.hints)?;
    let admitted = Instant::now();
    let id = ctx.new_request_id();
    let caller = &ctx.caller;
    let scopes = budget::scopes(config, caller);
    let reject = |model: &ModelConfig, e: ApiError| {
        if let Some(kind) = crate::metrics::refusal_kind(e.code) {
            app.metrics.refusal(kind);
        }
        Outcome::new(&app.metrics, &ctx.clock, &model.id, admitted).finish(e.status.as_u16());
        e
    };
    let (model, downgraded_from) = budget::choose_model(app, config, model, &scopes)
        .await
        .map_err(|e| reject(model, e))?;
    let policy = model.policy.as_deref().and_then(|p| config.policy(p));
    let timeouts = RequestTimeouts::of(config, policy);
    let deadline = admitted + timeouts.total;
    let deadline_ms = now_ms() + timeouts.total.as_millis() as u64;
    // Tokenized once, only for a caller with a budget or a TPM limit or a model with a
    // TPM-limited target; the estimate travels with the request, so workers need no tokenizer
    // (o200k is ~37 MB resident) for their TPM limits.
    let estimate = if scopes.is_empty()
        && !crate::rate_limit::counts_tokens(config, caller)
        && !targets_count_tokens(config, model)
    {
        None
    } else {
        Some(crate::trim::Estimate::of_async(&inbound.messages, &inbound.tools).await)
    };
    let prompt_tokens = estimate.as_ref().map(crate::trim::Estimate::total);
    let rate = crate::rate_limit::admit(
        app,
        ctx,
        config,
        prompt_tokens,
        inbound.params.max_tokens,
        inbound.params.n.unwrap_or(1),
        deadline_ms + config.budgets.hold_grace_ms,
        ctx.batch.is_some(),
    )
    .await
    .map_err(|e| reject(model, e))?;
    // Each choice (`n`) is billed its own output.
    let output = inbound
        .params
        .max_tokens
        .map_or(config.budgets.default_max_tokens, u64::from)
        * u64::from(inbound.params.n.unwrap_or(1).max(1));
    let reservation = match budget::reserve_tokens(
        app,
        config,
        model,
        scopes,
        prompt_tokens.unwrap_or(0),
        output,
        deadline_ms,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => {
            // Refused by the budget: the rate limits' charge is given back.
            if let Some(h) = rate {
                h.settle(0, true).await;
            }
            return Err(reject(model, e));
        }
    };
    let req = ChatRequest {
        id,
        tenant: caller.tenant.clone(),
        key_id: caller.key_id.clone(),
        // The configured model routed by: usage and prices key on it.
        model: model.id.clone(),
        target: TargetRef {
            id: String::new(),
            provider: String::new(),
            upstream_model: String::new(),
        },
        messages: inbound.messages,
        tools: inbound.tools,
        tool_choice: inbound.tool_choice,
        params: inbound.params,
        stream: inbound.stream,
        include_usage: inbound.include_usage,
        deadline_ms,
        attempt: 0,
        batch_id: ctx.batch_id(),
        passthrough: inbound.passthrough,
        prompt_tokens,
    };
    let mut charge = Charge::new(app.clone(), ctx, &req, admitted);
    charge.capture_request(|| {
        // A marker, never an empty capture that reads as an empty request.
        serde_json::to_string(&req.messages).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "audit capture: request messages not encodable");
            format!("<request not encodable: {e}>")
        })
    });
    if let Some(r) = reservation {
        charge.reserved(r);
    }
    if let Some(h) = rate {
        charge.rate_limited(h);
    }
    let outcome = Outcome::new(&app.metrics, &ctx.clock, &model.id, admitted);
    Ok(Admitted {
        model,
        policy,
        downgraded_from,
        req,
        timeouts,
        deadline,
        ledger: Ledger { charge, outcome },
        estimate,
    })
}

/// Whether an enabled target of `model` has a TPM limit (its worker charges the prompt estimate).
fn targets_count_tokens(config: &GatewayConfig, model: &ModelConfig) -> bool {
    model
        .targets
        .iter()
        .filter_map(|id| config.target(id))
        .any(|t| t.enabled && t.limits.tpm.is_some())
}
