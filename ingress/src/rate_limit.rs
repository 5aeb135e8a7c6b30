//! Request-rate limits per key and per tenant (`limits: {rpm, tpm, max_concurrent}` of a
//! `keys:` / `tenants:` entry), enforced at admission across every ingress replica, and the
//! OpenAI-style `x-ratelimit-*` response headers.
//!
//! # Admission
//! Before the budget reservation, a request of a limited key is admitted in the key's scope,
//! then in its tenant's: one operation per scope on the shared entry (see
//! [`switchyard_budgets::rate`] for the group-commit protocol and its exactness argument)
//! checking concurrency, RPM and TPM together — all or nothing, so a request refused by one
//! limit (the concurrency one included) consumes nothing of the others. A refusal in the tenant
//! scope, or by the budget, gives the key's charge back. RPM and TPM count per UTC clock minute;
//! the TPM charge is the o200k prompt estimate plus `max_tokens`
//! ([`switchyard_schemas::tokens::DEFAULT_MAX_TOKENS`] when absent), as for the workers' target
//! limits, and is corrected to the tokens the upstream reported when the request ends in the
//! same minute. A request that ends as a 429 (any limit refused it: a target's, the upstream's)
//! gives its request and tokens back. Refusals: 429 `rate_limit_exceeded`, bare `Retry-After`
//! (seconds to the next minute; 1 for concurrency). Batch items are not counted (batches have
//! their own pacing). When the store cannot be reached the request is admitted (fail-open,
//! logged), like the target limits.
//!
//! # Headers
//! Every answer of the chat, completions, responses and messages doors to a key with `rpm`
//! and/or `tpm` carries, for that key (OpenAI's names and formats, OpenAI API docs, "Rate
//! limits" → "Rate limits in headers"): `x-ratelimit-limit-requests`,
//! `x-ratelimit-remaining-requests`, `x-ratelimit-reset-requests` (with `rpm`) and
//! `x-ratelimit-limit-tokens`, `x-ratelimit-remaining-tokens`, `x-ratelimit-reset-tokens` (with
//! `tpm`); streams carry them in their initial headers. Remaining counts are the scope's after
//! this request's admission; resets are the time to the end of the minute, formatted like
//! OpenAI's (`20ms`, `1.5s`, `6m0s`).

use crate::AppState;
pub use crate::context::RateHeaders;
use crate::context::{Caller, RequestContext};
use crate::error::ApiError;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use std::sync::Arc;
use switchyard_budgets::{RateError, RateStore, Refusal, Window};
use switchyard_schemas::config::GatewayConfig;
use switchyard_schemas::now_ms;
use switchyard_schemas::tenancy::RateLimits;
use switchyard_schemas::tokens::DEFAULT_MAX_TOKENS;

pub use switchyard_budgets::RATES_BUCKET;

/// A key or tenant with `limits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateScope {
    /// `key` or `tenant`.
    pub kind: &'static str,
    /// Its id.
    pub id: String,
    /// Its limits.
    pub limits: RateLimits,
}

impl RateScope {
    /// The scope's KV key, `key.<id>` or `tenant.<id>`.
    pub fn kv_key(&self) -> String {
        format!("{}.{}", self.kind, self.id)
    }
}

/// The limited scopes of `caller` under `config` (key first, then tenant).
pub fn scopes(config: &GatewayConfig, caller: &Caller) -> Vec<RateScope> {
    let (key, tenant) = caller.entries(config);
    [
        ("key", key.map(|k| (&k.id, k.limits))),
        ("tenant", tenant.map(|t| (&t.id, t.limits))),
    ]
    .into_iter()
    .filter_map(|(kind, entry)| {
        let (id, limits) = entry.filter(|(_, l)| !l.is_none())?;
        Some(RateScope {
            kind,
            id: id.clone(),
            limits,
        })
    })
    .collect()
}

/// The shared rate store of this ingress process (a handle to [`RATES_BUCKET`]).
#[derive(Debug, Clone)]
pub struct Rates {
    store: Arc<RateStore>,
}

impl Rates {
    /// Opens (or creates) [`RATES_BUCKET`] for this process, `holder` being its ingress id.
    pub async fn connect(js: &async_nats::jetstream::Context, holder: &str) -> Self {
        Self {
            store: Arc::new(RateStore::connect(js, holder).await),
        }
    }

    /// The underlying store (tests, shutdown).
    pub fn store(&self) -> &RateStore {
        &self.store
    }
}

/// What one admitted request holds in each scope until it ends ([`RateHold::settle`]).
#[derive(Debug)]
pub struct RateHold {
    store: Arc<RateStore>,
    /// `(kv key, minute admitted in)` of every scope that counted the request.
    taken: Vec<(String, u64)>,
    /// Tokens charged in each of them.
    tokens: u64,
}

impl RateHold {
    /// Ends the request: releases its in-flight slots and corrects its token charge to
    /// `actual_tokens`; `refund` (it ended as a 429) gives its request and tokens back.
    pub async fn settle(mut self, actual_tokens: u64, refund: bool) {
        for (key, minute) in std::mem::take(&mut self.taken) {
            if let Err(e) = self
                .store
                .settle(&key, minute, refund, self.tokens, actual_tokens)
                .await
            {
                tracing::warn!(scope = %key, error = %e, "rate-limit settlement lost; the in-flight count lapses at the request's deadline");
            }
        }
    }
}

impl RateHeaders {
    fn of(limits: &RateLimits, w: &Window) -> Option<Self> {
        let requests = limits.rpm.map(|l| (l, l.saturating_sub(w.requests)));
        let tokens = limits.tpm.map(|l| (l, l.saturating_sub(w.tokens)));
        (requests.is_some() || tokens.is_some()).then(|| Self {
            requests,
            tokens,
            reset_ms: w.resets_at_ms().saturating_sub(now_ms()),
        })
    }

    /// Adds the headers to `resp`.
    pub fn apply(&self, resp: &mut Response) {
        let h = resp.headers_mut();
        let mut put = |k: &'static str, v: String| {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.insert(k, v);
            }
        };
        let reset = openai_duration(self.reset_ms);
        if let Some((limit, remaining)) = self.requests {
            put("x-ratelimit-limit-requests", limit.to_string());
            put("x-ratelimit-remaining-requests", remaining.to_string());
            put("x-ratelimit-reset-requests", reset.clone());
        }
        if let Some((limit, remaining)) = self.tokens {
            put("x-ratelimit-limit-tokens", limit.to_string());
            put("x-ratelimit-remaining-tokens", remaining.to_string());
            put("x-ratelimit-reset-tokens", reset);
        }
    }
}

/// A duration as OpenAI's `x-ratelimit-reset-*` headers write it (Go's duration format):
/// `20ms` below a second, else `[<h>h][<m>m]<s>s` with up to three decimals, e.g. `1s`, `1.5s`,
/// `6m0s`, `1h0m0s`.
pub fn openai_duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m) = (ms / 3_600_000, (ms / 60_000) % 60);
    let rest = ms % 60_000;
    let secs = if rest.is_multiple_of(1000) {
        (rest / 1000).to_string()
    } else {
        let s = format!("{}.{:03}", rest / 1000, rest % 1000);
        s.trim_end_matches('0').to_owned()
    };
    match (h, m) {
        (0, 0) => format!("{secs}s"),
        (0, m) => format!("{m}m{secs}s"),
        (h, m) => format!("{h}h{m}m{secs}s"),
    }
}

/// Whether `caller`'s key or tenant has a TPM limit, i.e. whether [`admit`] needs the prompt
/// estimate (tokens) it takes.
pub fn counts_tokens(config: &GatewayConfig, caller: &Caller) -> bool {
    scopes(config, caller)
        .iter()
        .any(|s| s.limits.tpm.is_some())
}

/// Admits a request of `ctx`'s caller in its limited scopes ([`scopes`]): `Ok(None)` when none
/// apply (or it is a batch item), else the hold to settle when it ends; a refusal is the 429 to
/// answer. `until_ms` bounds how long its in-flight slot may outlive a dead ingress. The key's
/// `x-ratelimit-*` values are recorded in `ctx` ([`RequestContext::report_rates`]).
#[allow(clippy::too_many_arguments)]
pub async fn admit(
    app: &AppState,
    ctx: &RequestContext,
    config: &GatewayConfig,
    prompt_tokens: Option<u64>,
    max_tokens: Option<u32>,
    choices: u32,
    until_ms: u64,
    batch: bool,
) -> Result<Option<RateHold>, ApiError> {
    let scopes = scopes(config, &ctx.caller);
    if scopes.is_empty() || batch {
        return Ok(None);
    }
    let tokens = if scopes.iter().any(|s| s.limits.tpm.is_some()) {
        prompt_tokens.unwrap_or(0)
            + max_tokens.map_or(DEFAULT_MAX_TOKENS, u64::from) * u64::from(choices.max(1))
    } else {
        0
    };
    let mut hold = RateHold {
        store: app.rates.store.clone(),
        taken: Vec::new(),
        tokens,
    };
    // The key's headers, as its admission left them (a later refusal gives its charge back).
    let mut key_window: Option<(RateLimits, Window)> = None;
    for scope in &scopes {
        let key = scope.kv_key();
        match app
            .rates
            .store
            .admit(&key, scope.limits, tokens, until_ms)
            .await
        {
            Ok(w) => {
                if scope.kind == "key" {
                    key_window = Some((scope.limits, w));
                }
                hold.taken.push((key, w.minute));
            }
            Err(RateError::Unavailable(e)) => {
                tracing::warn!(scope = %key, error = %e, "rate limit not checked (admitting)");
            }
            Err(RateError::Refused {
                refusal,
                window,
                retry_after_ms,
            }) => {
                let shown = match key_window {
                    _ if scope.kind == "key" => RateHeaders::of(&scope.limits, &window),
                    Some((limits, w)) => RateHeaders::of(
                        &limits,
                        &Window {
                            requests: w.requests.saturating_sub(1),
                            tokens: w.tokens.saturating_sub(tokens),
                            ..w
                        },
                    ),
                    None => None,
                };
                if let Some(h) = shown {
                    ctx.report_rates(h);
                }
                hold.settle(0, true).await;
                app.metrics.refusal(match refusal {
                    Refusal::Concurrent { .. } => "rate_limit_concurrency",
                    Refusal::Requests { .. } => "rate_limit_rpm",
                    Refusal::Tokens { .. } => "rate_limit_tpm",
                });
                return Err(refused(scope, refusal, &window, retry_after_ms));
            }
        }
    }
    if let Some(h) = key_window.and_then(|(l, w)| RateHeaders::of(&l, &w)) {
        ctx.report_rates(h);
    }
    Ok(Some(hold))
}

/// The 429 of a refusal (OpenAI `rate_limit_error` / `rate_limit_exceeded`, Anthropic
/// `rate_limit_error` by status).
fn refused(scope: &RateScope, refusal: Refusal, w: &Window, retry_after_ms: u64) -> ApiError {
    let who = format!("{} `{}`", scope.kind, scope.id);
    let message = match refusal {
        Refusal::Concurrent { limit } => format!(
            "Rate limit reached for {who} on concurrent requests: limit {limit}, in flight {}. \
             Retry when one ends.",
            w.in_flight
        ),
        Refusal::Requests { limit } => format!(
            "Rate limit reached for {who} on requests per minute (RPM): limit {limit}, used {}, \
             requested 1.",
            w.requests
        ),
        Refusal::Tokens { limit, need } => format!(
            "Rate limit reached for {who} on tokens per minute (TPM): limit {limit}, used {}, \
             requested {need}.",
            w.tokens
        ),
    };
    ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        message,
        kind: "rate_limit_error",
        param: None,
        code: Some("rate_limit_exceeded"),
        retry_after_s: Some(retry_after_ms.div_ceil(1000).max(1)),
        request_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_openai() {
        assert_eq!(openai_duration(20), "20ms");
        assert_eq!(openai_duration(1000), "1s");
        assert_eq!(openai_duration(1500), "1.5s");
        assert_eq!(openai_duration(360_000), "6m0s");
        assert_eq!(openai_duration(59_999), "59.999s");
        assert_eq!(openai_duration(3_600_000), "1h0m0s");
    }

    #[test]
    fn headers_show_what_is_left() {
        let limits = RateLimits {
            rpm: Some(100),
            tpm: None,
            max_concurrent: Some(3),
        };
        let w = Window {
            minute: now_ms() / 60_000,
            requests: 1,
            tokens: 40,
            in_flight: 1,
        };
        let h = RateHeaders::of(&limits, &w).unwrap_or(RateHeaders {
            requests: None,
            tokens: None,
            reset_ms: 0,
        });
        assert_eq!(h.requests, Some((100, 99)));
        assert_eq!(h.tokens, None);
        assert!(h.reset_ms <= 60_000);
        let only_concurrency = RateLimits {
            max_concurrent: Some(3),
            ..RateLimits::default()
        };
        assert_eq!(RateHeaders::of(&only_concurrency, &w), None);
    }
}
