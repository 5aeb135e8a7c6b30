//! The OpenAI front door for embeddings, `POST /v1/embeddings` (OpenAI API reference, "Create
//! embeddings"): one NATS request/reply per attempt, fallback across the model's targets — ordered
//! like chat ([`crate::strategy`]; only providers with an embeddings API qualify) — by the same
//! attempt engine as chat ([`route::attempt::attempts`]), vectors as floats or base64 (little-endian f32, the encoding the OpenAI SDKs
//! ask for by default and decode themselves).

use crate::AppState;
use crate::charge::Charge;
use crate::context::RequestContext;
use crate::error::ApiError;
use crate::metrics::Outcome;
use crate::route::{self, Ledger, attempt};
use crate::strategy::{self, Needs};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::config::{GatewayConfig, ModelConfig, TargetConfig};
use switchyard_schemas::embed::{EmbedInput, EmbedReply, EmbedRequest};
use switchyard_schemas::request::TargetRef;
use switchyard_schemas::subjects::CAP_EMBED;
use switchyard_schemas::{ErrorClass, ErrorInfo, now_ms};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsBody {
    model: String,
    input: RawInput,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<u32>,
    #[serde(default)]
    user: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawInput {
    One(String),
    Many(Vec<String>),
    Ids(Vec<u32>),
    ManyIds(Vec<Vec<u32>>),
}

/// The handler.
/// The caller's key rate-limit headers (`x-ratelimit-*`, [`crate::rate_limit`]) ride on every
/// answer, refusals included, as on the chat door.
pub async fn embeddings(
    State(app): State<Arc<AppState>>,
    ctx: crate::context::Ctx,
    body: Bytes,
) -> Response {
    serve(app, &ctx, &body).await
}

/// Serves one embeddings body for the request `ctx` (the handler's and a batch item's way in).
pub async fn serve(app: Arc<AppState>, ctx: &RequestContext, body: &[u8]) -> Response {
    ctx.clock.body_read();
    let out = Box::pin(handle(app.clone(), ctx, body)).await;
    let mut resp = match out {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    if let Some(r) = ctx.rates() {
        r.apply(&mut resp);
    }
    crate::front_door::response_head(&app, ctx, None, &mut resp);
    resp
}

/// Validates an embeddings body as [`embeddings`] would and returns its `model` (batch
/// validation checks every line with it).
pub fn model_of(body: &[u8]) -> Result<String, ApiError> {
    parse(body).map(|(b, _, _)| b.model)
}

fn parse(body: &[u8]) -> Result<(EmbeddingsBody, EmbedInput, bool), ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let b: EmbeddingsBody = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let param = (path != ".").then(|| path.clone());
        ApiError::invalid(format!("Invalid request body at `{path}`: {inner}"), param)
    })?;
    let input = match &b.input {
        RawInput::One(s) => EmbedInput::Texts(vec![s.clone()]),
        RawInput::Many(v) => EmbedInput::Texts(v.clone()),
        RawInput::Ids(v) => EmbedInput::Tokens(vec![v.clone()]),
        RawInput::ManyIds(v) => EmbedInput::Tokens(v.clone()),
    };
    let empty = match &input {
        EmbedInput::Texts(t) => t.is_empty() || t.iter().any(String::is_empty),
        EmbedInput::Tokens(t) => t.is_empty() || t.iter().any(Vec::is_empty),
    };
    if empty {
        return Err(ApiError::invalid(
            "`input` must be non-empty, and so must each of its items.",
            Some("input".into()),
        ));
    }
    // OpenAI's limit: at most 2048 inputs per request.
    if input.len() > 2048 {
        return Err(ApiError::invalid(
            "`input` may hold at most 2048 items.",
            Some("input".into()),
        ));
    }
    let base64 = match b.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("`encoding_format` must be `float` or `base64`, not `{other}`."),
                Some("encoding_format".into()),
            ));
        }
    };
    Ok((b, input, base64))
}

async fn handle(
    app: Arc<AppState>,
    ctx: &RequestContext,
    body: &[u8],
) -> Result<Response, ApiError> {
    // Parse.
    route::check_size(&app, body.len())?;
    let (b, input, base64) = parse(body)?;
    let config = app.config.get();
    let asked = b.model.clone();
    // Admit.
    let Admitted {
        model,
        mut ledger,
        mut dispatch,
    } = admit(&app, ctx, &config, b, input).await?;
    // Plan: only providers with an embeddings API qualify.
    let prefs = ctx.hints.preferences(dispatch.req.user.as_deref());
    let plan = match strategy::plan(
        &config,
        model,
        &Needs::embeddings(),
        &prefs,
        |t| route::observe(&app, t),
        &mut rand::rng(),
    ) {
        Ok(p) => p,
        Err(e) => return Err(ledger.fail(e)),
    };
    // Attempts.
    let id = dispatch.req.id;
    let won = match attempt::attempts(&app, ctx, id, &mut ledger, plan.targets, &mut dispatch).await
    {
        Ok(w) => w,
        Err(e) => return Err(ledger.fail(e)),
    };
    // Settle, then answer.
    let Reply {
        vectors,
        usage,
        worker,
    } = won.committed;
    let Ledger {
        mut charge,
        mut outcome,
    } = ledger;
    charge.usage(usage);
    charge.finish(None);
    outcome.finish(200);
    let served = route::Served {
        request_id: id,
        target: won.target.id.clone(),
        worker,
        fallbacks: won.fallbacks,
        trimmed: None,
        downgraded_from: None,
        upstream_headers: Vec::new(),
    };
    // The response echoes the body's model, also when `x-switchyard-route` routed it.
    let mut resp =
        axum::Json(render(&asked, &vectors, usage.prompt_tokens, base64)).into_response();
    served.apply(&mut resp);
    Ok(resp)
}

/// An embeddings request the gateway accepted.
struct Admitted<'a> {
    /// The model routed by.
    model: &'a ModelConfig,
    /// Charge event and metrics outcome.
    ledger: Ledger,
    /// The request, ready for its attempts.
    dispatch: Embed<'a>,
}

/// The routed model, the timeouts and the budget reservation: input only, estimated at 4 bytes
/// per token (no tokenizer on this path). A refusal leaves no usage record.
async fn admit<'a>(
    app: &'a Arc<AppState>,
    ctx: &RequestContext,
    config: &'a GatewayConfig,
    b: EmbeddingsBody,
    input: EmbedInput,
) -> Result<Admitted<'a>, ApiError> {
    let model = route::routed_model(config, &b.model, &ctx.hints)?;
    let admitted = Instant::now();
    let id = ctx.new_request_id();
    let policy = model.policy.as_deref().and_then(|p| config.policy(p));
    let t = &config.timeouts;
    let total = policy
        .and_then(|p| p.timeouts.total_ms)
        .unwrap_or(t.total_ms);
    let deadline = admitted + Duration::from_millis(total);
    let first_byte = Duration::from_millis(
        policy
            .and_then(|p| p.timeouts.first_byte_ms)
            .unwrap_or(t.first_byte_ms),
    );
    let prompt_bytes: usize = match &input {
        EmbedInput::Texts(v) => v.iter().map(String::len).sum(),
        EmbedInput::Tokens(v) => v.iter().map(|x| x.len() * 4).sum(),
    };
    let caller = ctx.caller.clone();
    let prompt_tokens = prompt_bytes.div_ceil(4) as u64;
    // Key and tenant RPM/TPM/concurrency as on the chat door (no output tokens).
    let rate = crate::rate_limit::admit(
        app,
        ctx,
        config,
        Some(prompt_tokens),
        Some(0),
        1,
        now_ms() + total + config.budgets.hold_grace_ms,
        ctx.batch.is_some(),
    )
    .await?;
    let reservation = match crate::budget::reserve_tokens(
        app,
        config,
        model,
        crate::budget::scopes(config, &caller),
        prompt_tokens,
        0,
        now_ms() + total,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => {
            // Refused by the budget: the rate limits' charge is given back.
            if let Some(h) = rate {
                h.settle(0, true).await;
            }
            return Err(e);
        }
    };
    let (tenant, key_id) = (caller.tenant.clone(), caller.key_id.clone());
    let mut charge = Charge::start(
        app.clone(),
        ctx,
        id,
        &model.id,
        caller,
        prompt_bytes,
        admitted,
    );
    if let Some(r) = reservation {
        charge.reserved(r);
    }
    if let Some(h) = rate {
        charge.rate_limited(h);
    }
    let ledger = Ledger {
        charge,
        outcome: Outcome::new(&app.metrics, &ctx.clock, &model.id, admitted),
    };
    let req = EmbedRequest {
        id,
        // The worker's `upstream` usage row is attributed like the `charge` row.
        tenant,
        key_id,
        model: model.id.clone(),
        target: TargetRef {
            id: String::new(),
            provider: String::new(),
            upstream_model: String::new(),
        },
        input,
        dimensions: b.dimensions,
        user: b.user,
        deadline_ms: now_ms() + total,
        attempt: 0,
        batch_id: ctx.batch_id(),
    };
    let shown = ctx.shown_request_id(id);
    Ok(Admitted {
        model,
        ledger,
        dispatch: Embed {
            app,
            req,
            shown,
            first_byte,
            deadline,
        },
    })
}

/// A successful embeddings answer.
struct Reply {
    vectors: Vec<Vec<f32>>,
    usage: switchyard_schemas::Usage,
    worker: String,
}

/// The embeddings dispatch for the attempt engine: one NATS request/reply per attempt on
/// `sy.req.embed.<provider>`, waiting at most the policy's `first_byte_ms` (or what is left of
/// the request's deadline).
struct Embed<'a> {
    app: &'a AppState,
    req: EmbedRequest,
    /// The request id its NATS headers carry ([`RequestContext::shown_request_id`]).
    shown: String,
    first_byte: Duration,
    deadline: Instant,
}

impl attempt::Dispatch for Embed<'_> {
    type Committed = Reply;

    async fn attempt(&mut self, target: &TargetConfig, attempt: u32) -> Result<Reply, ErrorInfo> {
        self.req.target = TargetRef {
            id: target.id.clone(),
            provider: target.provider.as_str().to_owned(),
            upstream_model: target.upstream_model.clone(),
        };
        self.req.attempt = attempt;
        let limit = self
            .first_byte
            .min(self.deadline.saturating_duration_since(Instant::now()));
        call(self.app, &self.req, &self.shown, limit).await
    }
}

async fn call(
    app: &AppState,
    req: &EmbedRequest,
    shown: &str,
    limit: Duration,
) -> Result<Reply, ErrorInfo> {
    let payload =
        serde_json::to_vec(req).map_err(|e| ErrorInfo::new(ErrorClass::Internal, e.to_string()))?;
    let subject = app.subjects.request(CAP_EMBED, &req.target.provider);
    let mut headers = async_nats::HeaderMap::new();
    crate::spans::nats_headers(&mut headers, shown);
    let request = async_nats::Request::new()
        .payload(payload.into())
        .headers(headers)
        .timeout(Some(limit));
    let msg = app.nats.send_request(subject, request).await.map_err(|e| {
        use async_nats::RequestErrorKind::*;
        match e.kind() {
            NoResponders => {
                ErrorInfo::new(ErrorClass::NoCapacity, "no worker is serving this provider")
            }
            TimedOut => ErrorInfo::new(
                ErrorClass::Timeout,
                "timed out waiting for the embeddings answer",
            ),
            _ => ErrorInfo::new(ErrorClass::NoCapacity, format!("NATS request failed: {e}")),
        }
    })?;
    match serde_json::from_slice::<EmbedReply>(&msg.payload) {
        Ok(EmbedReply::Ok {
            vectors,
            usage,
            worker,
        }) => Ok(Reply {
            vectors,
            usage,
            worker,
        }),
        Ok(EmbedReply::Error { error }) => Err(error),
        Err(e) => Err(ErrorInfo::new(
            ErrorClass::Internal,
            format!("bad embeddings reply: {e}"),
        )),
    }
}

/// The OpenAI `list` of `embedding` objects.
fn render(model: &str, vectors: &[Vec<f32>], prompt_tokens: u64, base64: bool) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}
