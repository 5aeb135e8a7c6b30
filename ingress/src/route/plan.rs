//! The plan stage: the candidate targets of an admitted chat request, in the order to try them.

use super::admit::Admitted;
use super::{RequestHints, observe};
use crate::AppState;
use crate::strategy::{self, Needs};
use crate::trim;
use switchyard_schemas::ErrorInfo;
use switchyard_schemas::config::{GatewayConfig, TargetConfig};
use switchyard_schemas::request::Message;

/// The ordered candidates of one request.
pub struct Planned<'c> {
    /// Targets to try, in order; never empty.
    pub targets: Vec<&'c TargetConfig>,
    /// Set when the policy has `trim_context` and the prompt may not fit some window.
    pub trim: Option<Trimming>,
}

/// What each attempt trims from: every attempt starts again from the original conversation.
pub struct Trimming {
    /// The conversation as the client sent it.
    pub original: Vec<Message>,
    /// Its token estimate, per message.
    pub estimate: trim::Estimate,
    /// The reply's token allowance, subtracted from each target's context window.
    pub max_tokens: u64,
}

/// Plans `admitted`: its needs (capabilities, prompt estimate in tokens), [`strategy::plan`]
/// with the client's preferences, and the degraded-target probe ([`strategy::probe_first`],
/// skipped when the client fixed the order). The error is the client's answer (400 or 503).
pub async fn plan<'c>(
    app: &AppState,
    config: &'c GatewayConfig,
    admitted: &Admitted<'c>,
    hints: &RequestHints,
) -> Result<Planned<'c>, ErrorInfo> {
    let req = &admitted.req;
    let trim_on = admitted.policy.is_some_and(|p| p.trim_context);
    let mut needs = Needs::chat(&req.messages, &req.tools, &req.params);
    let estimate = prompt_estimate(config, admitted, needs.max_tokens).await;
    if let Some(e) = &estimate {
        needs.prompt_tokens = Some(e.total());
        if trim_on {
            needs.min_prompt_tokens = Some(e.floor(&req.messages));
        }
    }
    let prefs = hints.preferences(req.params.user.as_deref());
    let mut plan = strategy::plan(
        config,
        admitted.model,
        &needs,
        &prefs,
        |t| observe(app, t),
        &mut rand::rng(),
    )?;
    if prefs.order.is_empty() {
        strategy::probe_first(
            &mut plan.targets,
            |id| app.health.state(id),
            app.probe_share(),
            &mut rand::rng(),
        );
    }
    let trim = match estimate {
        Some(estimate) if trim_on => Some(Trimming {
            original: req.messages.clone(),
            estimate,
            max_tokens: needs.max_tokens,
        }),
        _ => None,
    };
    Ok(Planned {
        targets: plan.targets,
        trim,
    })
}

/// The prompt estimate, when some candidate's context window could be too small for it (the
/// byte upper bound is checked first, so most prompts are never tokenized; long ones are
/// tokenized off the executor).
async fn prompt_estimate(
    config: &GatewayConfig,
    admitted: &Admitted<'_>,
    max_tokens: u64,
) -> Option<trim::Estimate> {
    let req = &admitted.req;
    let smallest = admitted
        .model
        .targets
        .iter()
        .filter_map(|id| config.target(id))
        .filter(|t| t.enabled)
        .filter_map(|t| t.context_window)
        .min()?;
    if trim::upper_bound(&req.messages, &req.tools) + max_tokens <= smallest {
        return None;
    }
    // Admission's estimate when it made one (the same messages: nothing changed them since).
    match &admitted.estimate {
        Some(e) => Some(e.clone()),
        None => Some(trim::Estimate::of_async(&req.messages, &req.tools).await),
    }
}
