//! The OpenAI Responses front door (OpenAI API reference, "Responses"): `POST /v1/responses`
//! over the same normalised request as the other doors, so any provider serves it, plus the
//! stored-response routes `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}` and
//! `GET /v1/responses/{id}/input_items`.
//!
//! - [`request`]: the body → normalised messages, tools and parameters, the input items to store
//!   and the parameters the `response` object echoes.
//! - [`response`]: the `response` object and its output items.
//! - [`stream`]: the typed SSE events with `sequence_number`.
//! - [`store`]: `store: true` (the default) keeps the response tenant-scoped in the JetStream KV
//!   bucket `SY_RESPONSES` for `responses.ttl_s`; `previous_response_id` prepends the stored
//!   conversation (its input and output, not its `instructions`) to the new input, so the
//!   follow-up may go to any provider. The entry is written before the final event (or the JSON
//!   answer) reaches the client, so a follow-up sent after it — through any ingress replica —
//!   finds it; that write (one acknowledged KV put, ~1 ms locally) is the only cost on the
//!   client's path. A failed write is logged and the answer still returned.
//!
//! Errors use OpenAI's shape. Unknown or another tenant's id: 404 `No response found with id
//! '…'.`; an unknown `previous_response_id`: 400 `previous_response_not_found` (as OpenAI).

pub mod request;
pub mod response;
pub mod store;
pub mod stream;

use crate::AppState;
use crate::context::RequestContext;
use crate::error::ApiError;
use crate::front_door::{self, FrontDoor, ReplyMeta};
use crate::route::{self, Aggregate, Inbound};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::future::BoxFuture;
use request::ParsedResponses;
use response::{Answer, Ident};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use store::{ResponseStore, StoreError, StoredResponse};
use stream::{Finish, ResponsesStream};
use switchyard_schemas::now_ms;
use switchyard_schemas::request::Message;
use uuid::Uuid;

/// `POST /v1/responses`.
pub async fn create(
    State(app): State<Arc<AppState>>,
    ctx: crate::context::Ctx,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    serve(app, &ctx, &headers, &body).await
}

/// Serves one `POST /v1/responses` body for the request `ctx` (the handler's and a batch
/// item's way in).
pub async fn serve(
    app: Arc<AppState>,
    ctx: &RequestContext,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    ctx.clock.body_read();
    if let Err(e) = route::check_size(&app, body.len()) {
        return e.into_response();
    }
    let prefix = Uuid::now_v7().simple().to_string();
    let parsed = match request::parse(body, &prefix) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let tenant = ctx.caller.tenant.clone();
    let mut pin = None;
    let history = match &parsed.previous_response_id {
        None => Vec::new(),
        Some(id) => match app.responses.get(id, tenant.as_deref()).await {
            Ok(Some(prev)) => {
                pin = prev.pinned_target.map(|t| (id.clone(), t));
                prev.history
            }
            Ok(None) | Err(StoreError::Unavailable) => {
                return ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "previous_response_not_found",
                    format!("Previous response with id '{id}' not found."),
                )
                .with_param("previous_response_id")
                .into_response();
            }
            Err(e) => return store_failed(e),
        },
    };
    let inbound = inbound(&parsed, &history);
    if !history.is_empty() {
        // The stored turns travel in the request too: they must fit one NATS message.
        let stored = serde_json::to_vec(&history).map_or(0, |v| v.len());
        if let Err(e) = route::check_size(&app, body.len() + stored) {
            return e.into_response();
        }
    }
    let mut sent = history;
    sent.extend(parsed.input_messages.iter().cloned());
    let persist = parsed.store.then(|| {
        Arc::new(Persist {
            app: app.clone(),
            tenant,
            input_items: parsed.input_items.clone(),
            history: sent,
        }) as Arc<dyn Finish>
    });
    let door = Responses {
        echo: Arc::new(parsed.echo),
        namespaces: Arc::new(parsed.namespaces),
        persist,
    };
    let Some((id, target)) = pin else {
        return front_door::serve_inbound(door, app, ctx, headers, inbound).await;
    };
    let mut hints = ctx.hints.clone();
    if let Err(e) = pin_to(&app, &inbound.model, &mut hints, &id, &target) {
        return e.into_response();
    }
    let pinned = ctx.with_hints(hints);
    front_door::serve_inbound(door, app, &pinned, headers, inbound).await
}

/// Whether `history` holds an encrypted `reasoning` item (readable by one deployment only).
fn holds_encrypted_reasoning(history: &[Message]) -> bool {
    history
        .iter()
        .flat_map(|m| &m.thinking_blocks)
        .any(|b| b.is_encrypted_reasoning())
}

/// Restricts `hints` to `target`, the one deployment that can read the encrypted reasoning of
/// the stored response `id`; a 400 `pinned_target_unavailable` when the request cannot go
/// there (the model does not list it, it is disabled, or the client's `x-switchyard-only` /
/// `x-switchyard-ignore` exclude it) — never a call to a deployment that would reject the state.
fn pin_to(
    app: &AppState,
    body_model: &str,
    hints: &mut route::RequestHints,
    id: &str,
    target: &str,
) -> Result<(), ApiError> {
    let config = app.config.get();
    let model = route::routed_model(&config, body_model, hints)?;
    let why = if !model.targets.iter().any(|t| t == target) {
        Some(format!("model `{}` does not list it", model.id))
    } else if config.target(target).is_none_or(|t| !t.enabled) {
        Some("it is disabled".to_owned())
    } else if hints.ignore.iter().any(|t| t == target)
        || hints
            .only
            .as_ref()
            .is_some_and(|only| !only.iter().any(|t| t == target))
    {
        Some("the request's x-switchyard-only / x-switchyard-ignore exclude it".to_owned())
    } else {
        None
    };
    if let Some(why) = why {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "pinned_target_unavailable",
            format!(
                "Previous response '{id}' holds encrypted reasoning that only target `{target}` can read, and this request cannot go there: {why}."
            ),
        )
        .with_param("previous_response_id"));
    }
    hints.only = Some(vec![target.to_owned()]);
    Ok(())
}

/// Validates a `POST /v1/responses` body as [`create`] would (without resolving
/// `previous_response_id`); its `model` and `stream` (batch validation checks every line with it).
pub fn validate(body: &[u8]) -> Result<(String, bool), ApiError> {
    let p = request::parse(body, &Uuid::now_v7().simple().to_string())?;
    Ok((p.model, p.stream))
}

fn inbound(p: &ParsedResponses, history: &[Message]) -> Inbound {
    Inbound {
        model: p.model.clone(),
        messages: p.conversation(history),
        tools: p.tools.clone(),
        tool_choice: p.tool_choice.clone(),
        params: p.params.clone(),
        stream: p.stream,
        include_usage: false,
        passthrough: Default::default(),
    }
}

/// The Responses protocol for one request: the parameters to echo and the store step.
pub struct Responses {
    echo: Arc<Map<String, Value>>,
    namespaces: Arc<HashMap<String, String>>,
    persist: Option<Arc<dyn Finish>>,
}

impl Responses {
    /// The identity of the response answering `m`.
    fn ident(&self, m: &ReplyMeta) -> Ident {
        let hex = m.request_id.simple().to_string();
        Ident {
            id: format!("resp_{hex}"),
            hex,
            created_at: now_ms() / 1000,
            model: m.model.clone(),
            namespaces: self.namespaces.clone(),
            target: m.target.clone(),
        }
    }
}

impl FrontDoor for Responses {
    type Stream = ResponsesStream;

    /// Parses a body without a stored predecessor (the handler itself resolves
    /// `previous_response_id` and enters at [`front_door::serve_inbound`]).
    fn parse(&self, body: &[u8]) -> Result<Inbound, ApiError> {
        let p = request::parse(body, &Uuid::now_v7().simple().to_string())?;
        Ok(inbound(&p, &[]))
    }

    fn stream(&self, m: &ReplyMeta) -> ResponsesStream {
        ResponsesStream::new(self.ident(m), self.echo.clone(), self.persist.clone())
    }

    fn aggregate(&self, m: &ReplyMeta, agg: &Aggregate) -> Result<Value, ApiError> {
        let id = self.ident(m);
        let answer = Answer::from(agg);
        let output = response::output(&id, &answer);
        Ok(response::object(&id, &self.echo, &answer, output))
    }

    fn error(&self, e: ApiError) -> Response {
        e.into_response()
    }

    fn finish(&self, meta: &ReplyMeta, body: &Value) -> Option<BoxFuture<'static, ()>> {
        let answer = answer_of(body);
        self.persist
            .as_ref()?
            .finish(body.clone(), &answer, meta.target.clone())
    }
}

/// The answer a `response` object's `output` shows (text of its messages, its function calls).
pub fn answer_of(r: &Value) -> Answer {
    let mut a = Answer::default();
    for item in r["output"].as_array().into_iter().flatten() {
        match item["type"].as_str() {
            Some("message") => {
                for p in item["content"].as_array().into_iter().flatten() {
                    if let Some(t) = p["text"].as_str() {
                        a.text.push_str(t);
                    }
                }
            }
            Some("function_call") => a.calls.push(route::ToolCallAcc {
                id: item["call_id"].as_str().unwrap_or_default().into(),
                name: item["name"].as_str().unwrap_or_default().into(),
                arguments: item["arguments"].as_str().unwrap_or_default().into(),
            }),
            _ => {}
        }
    }
    a
}

/// Stores a finished response (see the module docs).
struct Persist {
    app: Arc<AppState>,
    tenant: Option<String>,
    input_items: Vec<Value>,
    history: Vec<Message>,
}

impl Finish for Persist {
    fn finish(
        &self,
        response: Value,
        answer: &Answer,
        target: Option<String>,
    ) -> Option<BoxFuture<'static, ()>> {
        let id = response["id"].as_str()?.to_owned();
        let mut history = self.history.clone();
        history.push(response::as_message(answer));
        // Only a Responses-API target read the items (the others drop them).
        let config = self.app.config.get();
        let pinned_target = target.filter(|t| {
            holds_encrypted_reasoning(&history)
                && config
                    .target(t)
                    .is_some_and(|c| c.api == switchyard_schemas::config::OpenAiApi::Responses)
        });
        let entry = StoredResponse {
            tenant: self.tenant.clone(),
            response,
            input_items: self.input_items.clone(),
            history,
            pinned_target,
        };
        let store = self.app.responses.clone();
        Some(Box::pin(async move {
            if let Err(e) = store.put(&id, &entry).await {
                tracing::warn!(id, error = %e, "response not stored; previous_response_id will not find it");
            }
        }))
    }
}

fn not_found(id: &str) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        None,
        format!("No response found with id '{id}'."),
    )
    .into_response()
}

fn store_failed(e: StoreError) -> Response {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!("The response store did not answer: {e}"),
        kind: "service_unavailable_error",
        param: None,
        code: Some("store_unavailable"),
        retry_after_s: Some(1),
        request_id: None,
    }
    .into_response()
}

async fn lookup(
    store: &ResponseStore,
    tenant: Option<&str>,
    id: &str,
) -> Result<StoredResponse, Response> {
    match store.get(id, tenant).await {
        Ok(Some(s)) => Ok(s),
        Ok(None) | Err(StoreError::Unavailable) => Err(not_found(id)),
        Err(e) => Err(store_failed(e)),
    }
}

/// `GET /v1/responses/{id}`: the stored `response` object.
pub async fn retrieve(
    State(app): State<Arc<AppState>>,
    ctx: crate::context::Ctx,
    Path(id): Path<String>,
) -> Response {
    match lookup(&app.responses, ctx.caller.tenant.as_deref(), &id).await {
        Ok(s) => axum::Json(s.response).into_response(),
        Err(r) => r,
    }
}

/// `DELETE /v1/responses/{id}`: `{"id","object":"response","deleted":true}`.
pub async fn delete(
    State(app): State<Arc<AppState>>,
    ctx: crate::context::Ctx,
    Path(id): Path<String>,
) -> Response {
    match app
        .responses
        .delete(&id, ctx.caller.tenant.as_deref())
        .await
    {
        Ok(true) => {
            axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
        }
        Ok(false) | Err(StoreError::Unavailable) => not_found(&id),
        Err(e) => store_failed(e),
    }
}

/// Query of `GET /v1/responses/{id}/input_items`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
    order: Option<String>,
    /// Accepted (OpenAI's `include[]`); nothing extra is stored to include.
    #[serde(rename = "include[]")]
    #[allow(dead_code)]
    include: Option<String>,
}

/// `GET /v1/responses/{id}/input_items?after&limit&order`: a `list` of the response's input
/// items, `order` `desc` by default (as OpenAI), `limit` 1–100 (default 20), `after` an item id.
pub async fn input_items(
    State(app): State<Arc<AppState>>,
    ctx: crate::context::Ctx,
    Path(id): Path<String>,
    Query(q): Query<ListQuery>,
) -> Response {
    let stored = match lookup(&app.responses, ctx.caller.tenant.as_deref(), &id).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return ApiError::invalid(
            format!("Invalid 'limit': integer below minimum value or above maximum value (1 to 100), got {limit}."),
            Some("limit".into()),
        )
        .into_response();
    }
    let mut items = stored.input_items;
    match q.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => {
            return ApiError::invalid(
                format!("Invalid 'order': '{other}'. Expected 'asc' or 'desc'."),
                Some("order".into()),
            )
            .into_response();
        }
    }
    let start = match &q.after {
        None => 0,
        Some(after) => match items.iter().position(|i| i["id"].as_str() == Some(after)) {
            Some(p) => p + 1,
            None => items.len(),
        },
    };
    let rest = items.len().saturating_sub(start);
    let page: Vec<Value> = items.into_iter().skip(start).take(limit).collect();
    let first = page.first().map(|i| i["id"].clone()).unwrap_or(Value::Null);
    let last = page.last().map(|i| i["id"].clone()).unwrap_or(Value::Null);
    axum::Json(
        json!({"object": "list", "data": page, "first_id": first, "last_id": last,
        "has_more": rest > limit}),
    )
    .into_response()
}
