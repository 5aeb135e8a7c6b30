//! The `charge` usage event ingress writes for every admitted request: exactly one, whether the
//! request completed, failed, or the client went away (then it is written on drop, with usage
//! estimated from the text seen if the worker's usage had not arrived yet).

use crate::AppState;
use crate::budget::{self, Demand, Reservation};
use crate::context::Caller;
use crate::context::RequestContext;
use crate::rate_limit::RateHold;
use std::sync::Arc;
use std::time::Instant;
use switchyard_schemas::audit::{AuditAttempt, AuditInfo, clip};
use switchyard_schemas::secret::redact_credentials;
use switchyard_schemas::usage::{BudgetOwed, UsageStatus};
use switchyard_schemas::{
    ChatRequest, ErrorClass, ErrorInfo, FinishReason, Usage, UsageEvent, UsageKind, now_ms,
};

/// Longest failed-attempt error message kept in the audit log, bytes.
const MAX_ATTEMPT_ERROR_BYTES: usize = 512;

/// Accumulates what the tenant is charged for one request; publishes once.
pub struct Charge {
    app: Arc<AppState>,
    event: Option<UsageEvent>,
    admitted: Instant,
    prompt_bytes: usize,
    /// Bytes of generated text seen so far, for the estimate on abort.
    output_bytes: usize,
    /// The budget reservation settled with this record's charge when it is published.
    reservation: Option<Reservation>,
    /// The key/tenant rate-limit hold, settled (and refunded after a 429) when it is published.
    rate: Option<RateHold>,
    /// A batch item's: the event goes to its runner, not to JetStream ([`crate::context::ChargeSlot`]).
    sink: Option<tokio::sync::oneshot::Sender<UsageEvent>>,
    /// The audit log's fields (docs/audit.md), moved into the event when it is published
    /// (boxed: every request future holding a `Charge` stays small).
    audit: Box<AuditInfo>,
    /// `audit.capture.max_bytes` when the request's bodies are captured.
    capture: Option<usize>,
    /// The request's server span ([`crate::spans::root`]): the outcome is recorded on it when
    /// the event is published, which ends it.
    span: tracing::Span,
}

impl Charge {
    /// Starts the record for `req` at admission time `admitted`.
    pub fn new(
        app: Arc<AppState>,
        ctx: &RequestContext,
        req: &ChatRequest,
        admitted: Instant,
    ) -> Self {
        let who = Caller {
            tenant: req.tenant.clone(),
            key_id: req.key_id.clone(),
            ..Caller::default()
        };
        let charge = Self::start(
            app,
            ctx,
            req.id,
            &req.model,
            who,
            req.prompt_text().len(),
            admitted,
        );
        if let Some(max) = req.params.max_tokens
            && !charge.span.is_none()
        {
            use switchyard_schemas::trace::OpenTelemetrySpanExt;
            charge
                .span
                .set_attribute("gen_ai.request.max_tokens", i64::from(max));
        }
        charge
    }

    /// Starts the record of any request of `ctx`: `prompt_bytes` feeds the estimate used on
    /// abort.
    pub fn start(
        app: Arc<AppState>,
        ctx: &RequestContext,
        request_id: uuid::Uuid,
        model: &str,
        who: Caller,
        prompt_bytes: usize,
        admitted: Instant,
    ) -> Self {
        ctx.note_admitted();
        let client = &ctx.client;
        let audit = Box::new(AuditInfo {
            front_door: client.front_door.map(str::to_owned),
            client_ip: client.client_ip.clone(),
            user_agent: client.user_agent.clone(),
            client_request_id: client.request_id.clone(),
            ..AuditInfo::default()
        });
        let capture = {
            let config = app.config.get();
            let c = &config.audit.capture;
            c.captures(who.key_id.as_deref(), model)
                .then_some(c.max_bytes)
        };
        let event = UsageEvent {
            tenant: who.tenant,
            key_id: who.key_id,
            status: UsageStatus::Cancelled,
            error_class: Some(ErrorClass::Cancelled),
            // Every charge of a batch item (live answer, cache hit, embeddings) is marked.
            batch_id: ctx.batch_id(),
            ..UsageEvent::new(request_id, UsageKind::Charge, now_ms(), model)
        };
        Self {
            app,
            event: Some(event),
            admitted,
            prompt_bytes,
            output_bytes: 0,
            reservation: None,
            rate: None,
            sink: ctx.take_batch_charge(),
            audit,
            capture,
            span: ctx.span.clone(),
        }
    }

    /// Keeps the request body `body()` (redacted, size-capped) when capture is on for it.
    pub fn capture_request(&mut self, body: impl FnOnce() -> String) {
        if let Some(max) = self.capture {
            self.audit.request_body = Some(clip(&redact_credentials(&body()), max));
        }
    }

    /// Appends generated `text` to the captured response when capture is on (up to the cap).
    pub fn capture_response(&mut self, text: &str) {
        if let Some(max) = self.capture {
            let kept = self.audit.response_body.get_or_insert_with(String::new);
            if kept.len() < max {
                kept.push_str(&clip(&redact_credentials(text), max - kept.len()));
            }
        }
    }

    /// Records a failed attempt (the target of the latest [`Charge::attempt`]) and its error.
    pub fn attempt_failed(&mut self, error: &ErrorInfo) {
        let Some(e) = self.event.as_ref() else { return };
        self.audit.attempts.push(AuditAttempt {
            target: e.target.clone().unwrap_or_default(),
            upstream_model: e.upstream_model.clone().unwrap_or_default(),
            error_class: error.class,
            error: clip(&redact_credentials(&error.message), MAX_ATTEMPT_ERROR_BYTES),
        });
    }

    /// Records the answer's finish reason (`stop`, `length`, `tool_calls`, `content_filter`) in
    /// the audit record and the charge row's `finish_reason` column.
    pub fn finish_reason(&mut self, reason: FinishReason) {
        self.audit.finish_reason = Some(reason.as_str().to_owned());
        if let Some(e) = self.event.as_mut() {
            e.finish_reason = Some(reason);
        }
    }

    /// Records the HTTP status the client got (else it is derived from the error class).
    pub fn http_status(&mut self, status: u16) {
        self.audit.http_status = Some(status);
    }

    /// The request's id (`None` once published).
    pub fn request_id(&self) -> Option<uuid::Uuid> {
        self.event.as_ref().map(|e| e.request_id)
    }

    /// Attaches the request's budget reservation: it is settled with the final charge (or
    /// released with $0 when the request fails before any upstream usage).
    pub fn reserved(&mut self, reservation: Reservation) {
        self.reservation = Some(reservation);
    }

    /// Attaches the request's rate-limit hold: released with the actual tokens when the record
    /// is published, its request and tokens given back when the request ended as a 429.
    pub fn rate_limited(&mut self, hold: RateHold) {
        self.rate = Some(hold);
    }

    /// Records the attempt now being tried.
    pub fn attempt(&mut self, target: &str, upstream_model: &str, fallbacks: u32) {
        if self.audit.overhead_ms.is_none() {
            self.audit.overhead_ms = Some(self.admitted.elapsed().as_millis() as u64);
        }
        if let Some(e) = self.event.as_mut() {
            e.target = Some(target.to_owned());
            e.upstream_model = Some(upstream_model.to_owned());
            e.fallbacks = fallbacks;
        }
    }

    /// Records `bytes` of generated content (and the TTFT on the first call).
    pub fn content(&mut self, bytes: usize) {
        self.output_bytes += bytes;
        self.first_content();
    }

    /// Marks the first content (TTFT from admission).
    fn first_content(&mut self) {
        let ms = self.admitted.elapsed().as_millis() as u64;
        if let Some(e) = self.event.as_mut()
            && e.ttft_ms.is_none()
        {
            e.ttft_ms = Some(ms);
        }
    }

    /// Marks the request as answered from the cache: no target, no upstream call, `usage` is the
    /// original upstream usage of the stored answer (kept for the savings figure; what the tenant
    /// pays for a hit is billing's cache pricing policy on `cache_hit` rows).
    pub fn cache_hit(&mut self, usage: Usage) {
        if let Some(e) = self.event.as_mut() {
            e.cache_hit = true;
            e.usage = usage;
            e.target = None;
            e.upstream_model = None;
        }
        self.first_content();
    }

    /// Records the answer cache's outcome in the audit record
    /// ([`switchyard_schemas::audit::CACHE_OUTCOMES`]).
    pub fn cache_outcome(&mut self, outcome: &'static str) {
        self.audit.cache_outcome = Some(outcome.to_owned());
    }

    /// Records the upstream-reported usage.
    pub fn usage(&mut self, usage: Usage) {
        if let Some(e) = self.event.as_mut() {
            e.usage = usage;
        }
    }

    /// Publishes the event with its final status. `error` is `None` on success.
    pub fn finish(mut self, error: Option<ErrorClass>) {
        let status = match error {
            None => UsageStatus::Ok,
            Some(ErrorClass::Cancelled) => UsageStatus::Cancelled,
            Some(_) => UsageStatus::Error,
        };
        self.publish(status, error);
    }

    fn publish(&mut self, status: UsageStatus, error: Option<ErrorClass>) {
        let Some(mut e) = self.event.take() else {
            return;
        };
        e.status = status;
        e.error_class = error;
        e.latency_ms = self.admitted.elapsed().as_millis() as u64;
        let mut audit = std::mem::take(&mut self.audit);
        audit.http_status = audit.http_status.or(Some(match error {
            None => 200,
            // The client went away: nginx's "client closed request".
            Some(ErrorClass::Cancelled) => 499,
            Some(class) => crate::error::class_to_http(class).0.as_u16(),
        }));
        e.audit = Some(audit);
        let delivered = self.output_bytes.div_ceil(4) as u64;
        if e.usage == Usage::default() && self.output_bytes > 0 {
            // Aborted before the worker's usage arrived: estimate at 4 bytes per token.
            e.usage.prompt_tokens = self.prompt_bytes.div_ceil(4) as u64;
            e.usage.completion_tokens = delivered;
            e.estimated = true;
        } else if status != UsageStatus::Ok && delivered > e.usage.completion_tokens {
            // Ended early after a provisional report (the upstream's input counts at the start
            // of the stream): its input counts stand, the output is what was delivered.
            e.usage.completion_tokens = delivered;
            e.estimated = true;
        }
        if !self.span.is_none() {
            let config = self.app.config.get();
            let provider = e
                .target
                .as_deref()
                .and_then(|t| config.target(t))
                .map(|t| t.provider.as_str());
            crate::spans::finish(&self.span, &e, provider);
            // Ends the server span now (the request is over), not when the charge is dropped.
            self.span = tracing::Span::none();
        }
        let app = self.app.clone();
        // Priced once: the settlement's amount and the unpriced alarm both come from this.
        let charge = if e.cache_hit {
            None
        } else {
            let policy = app.config.get().unpriced.clone();
            let batch = e.batch_id.is_some();
            budget::priced(
                app.catalog().as_deref(),
                &e.model,
                &e.usage,
                batch,
                policy.as_ref(),
            )
        };
        self.alarm_unpriced(&e, charge.as_ref());
        let reservation = self.reservation.take();
        let rate = self.rate.take();
        let sink = self.sink.take();
        // Tracked: shutdown waits for the settlement and the acknowledged publish.
        // Boxed: the future holds the whole event (~3 KB); a box is moved instead.
        self.app.tasks.spawn(Box::pin(async move {
            if let Some(h) = rate {
                let refund = e.error_class == Some(ErrorClass::RateLimited);
                h.settle(e.usage.prompt_tokens + e.usage.completion_tokens, refund)
                    .await;
            }
            if let Some(r) = reservation {
                // Cache hits are free (billing charges them $0), so they settle at zero too.
                let actual = if e.cache_hit {
                    Demand::default()
                } else {
                    Demand {
                        usd: charge.map_or(rust_decimal::Decimal::ZERO, |c| c.total),
                        tokens: e.usage.total_tokens(),
                    }
                };
                if let Some(owed) = r.settle(actual).await {
                    // The charge event is durable (acknowledged publish or the spool): billing
                    // applies what the store did not take.
                    e.budget_owed = Some(BudgetOwed {
                        scopes: owed.scopes,
                        usd: owed.actual.usd,
                        tokens: owed.actual.tokens,
                    });
                }
            }
            match sink {
                // Never published from here: only the item's last try may write its charge key.
                Some(tx) => {
                    if tx.send(e).is_err() {
                        tracing::warn!("batch item charge not taken (its runner gave up on the try; the item runs again)");
                    }
                }
                None => {
                    app.usage.publish(e).await;
                }
            }
        }));
    }
}

impl Charge {
    /// The `unpriced_component` alarm (metric [`crate::metrics::UNPRICED`] and a warning) for
    /// what of `e`'s usage has no sale price (`charge`: `e` priced at sale price, computed once
    /// by the caller) or no cost price on its upstream model (`cost`); billing records the same
    /// in the ledger.
    ///
    /// Also records the metrics of the usage: tokens by kind, charge and cost in USD (a cache
    /// hit used no upstream tokens and is charged $0: none).
    fn alarm_unpriced(&self, e: &UsageEvent, charge: Option<&switchyard_schemas::pricing::Cost>) {
        if e.cache_hit || e.usage.total_tokens() == 0 {
            return;
        }
        let catalog = self.app.catalog();
        let Some(catalog) = catalog.as_deref() else {
            let target = e.target.as_deref();
            self.app.metrics.usage(&e.model, target, &e.usage, 0.0, 0.0);
            return;
        };
        let batch = e.batch_id.is_some();
        let usd = |cost: &Option<switchyard_schemas::pricing::Cost>| {
            use rust_decimal::prelude::ToPrimitive as _;
            cost.as_ref().and_then(|c| c.total.to_f64()).unwrap_or(0.0)
        };
        let missing = |cost: Option<switchyard_schemas::pricing::Cost>| match cost {
            Some(c) => c.unpriced,
            None => vec!["model"],
        };
        let charge = charge.cloned();
        let upstream = e
            .upstream_model
            .as_deref()
            .map(|m| (m, catalog.upstream_cost(m, &e.usage, batch)));
        let cost_usd = upstream.as_ref().map_or(0.0, |(_, c)| usd(c));
        self.app.metrics.usage(
            &e.model,
            e.target.as_deref(),
            &e.usage,
            usd(&charge),
            cost_usd,
        );
        let charge = missing(charge);
        let cost = upstream.map(|(m, c)| (m, missing(c)));
        let sides = std::iter::once(("charge", e.model.as_str(), charge))
            .chain(cost.map(|(m, c)| ("cost", m, c)));
        for (side, model, components) in sides {
            for c in &components {
                self.app.metrics.unpriced(side, model, c);
            }
            if !components.is_empty() {
                tracing::warn!(request_id = %e.request_id, side, model,
                    components = %components.join(","), "usage with no price (unpriced_component)");
            }
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.event.is_some() {
            self.publish(UsageStatus::Cancelled, Some(ErrorClass::Cancelled));
        }
    }
}
