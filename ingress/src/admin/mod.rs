//! The admin API under `/admin/…` (docs/security.md, "Admin API"; the OpenAPI document at
//! `GET /openapi.json` lists every route and shape).
//!
//! Guarded by admin keys (`admin.keys` in the config: SHA-256 hashes or `env:NAME` references),
//! separate from client keys: `Authorization: Bearer <admin key>`. The presented key's SHA-256 is
//! compared with every configured hash in constant time. A key with `tenant:` sees and changes
//! only that tenant's keys, tenant and usage (another tenant's are 404) and gets 403 on the
//! gateway-wide routes (config, health, cache purge).
//!
//! Key and config changes are written to the live config bucket (`SY_CONFIG`, compare-and-set on
//! its revision) over the config-writer connection ([`AdminState::set_writer`]: the `admin` NATS
//! identity under `switchyard up`), exactly as `switchyard config push` stores them; every
//! replica's watch applies them. Errors are in the OpenAI error shape: 401 missing or invalid
//! admin key, 403 out of a tenant key's scope, 404 unknown id, 400 naming the field, 409 an id
//! that exists, 503 when the bucket cannot be written.

mod balance;
mod dashboard;
mod dashboard_page;
mod keys;
mod ops;
mod requests;
mod store;
pub use store::config_bucket;

pub use dashboard_page::page_routes as dashboard_routes;

use crate::AppState;
use crate::error::ApiError;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
use switchyard_schemas::tenancy::sha256_hex;

/// The admin API's process state.
#[derive(Debug, Default)]
pub struct AdminState {
    writer: OnceLock<async_nats::Client>,
    startup_text: OnceLock<String>,
    table: Mutex<Option<(u64, Arc<AdminTable>)>>,
    /// The dashboard's spend history, reused while fresh ([`dashboard::SPEND_REUSE_FACTOR`]).
    spend: dashboard::SpendCache,
}

impl AdminState {
    /// The NATS connection config writes and cache purges go through (must be allowed to write
    /// `$KV.SY_CONFIG.>`); without one, the ingress's own connection is used (an open NATS).
    pub fn set_writer(&self, client: async_nats::Client) {
        let _ = self.writer.set(client);
    }

    /// The YAML text this process started from: the base of the first key change when no live
    /// config has been pushed yet.
    pub fn set_startup_text(&self, text: String) {
        let _ = self.startup_text.set(text);
    }

    fn writer<'a>(&'a self, app: &'a AppState) -> &'a async_nats::Client {
        self.writer.get().unwrap_or(&app.nats)
    }
}

/// Admin key hash → caller, for one config version.
type AdminTable = Vec<(String, AdminCaller)>;

/// Who called: an admin key's id and, for a tenant admin, its tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminCaller {
    /// The admin key's id.
    pub id: String,
    /// `Some(t)`: limited to tenant `t`.
    pub tenant: Option<String>,
}

impl AdminCaller {
    /// Whether this caller may see tenant `tenant`'s things.
    fn sees(&self, tenant: &str) -> bool {
        self.tenant.as_deref().is_none_or(|t| t == tenant)
    }

    /// 403 unless the caller is a gateway-wide admin.
    fn require_global(&self) -> Result<(), ApiError> {
        match &self.tenant {
            None => Ok(()),
            Some(t) => Err(ApiError::permission_denied(
                format!(
                    "This admin key is limited to tenant `{t}`; this route needs a gateway-wide \
                     admin key."
                ),
                None,
            )),
        }
    }
}

/// A handler extractor: the admin the admin middleware authenticated (put in the request's
/// extensions); outside it, an admin of the empty tenant, which sees nothing.
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for AdminCaller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<AdminCaller>()
            .cloned()
            .unwrap_or(AdminCaller {
                id: String::new(),
                tenant: Some(String::new()),
            }))
    }
}

/// The `/admin` routes (merged into [`crate::router`]).
pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    Router::new()
        .route("/admin/keys", get(keys::list).post(keys::create))
        .route(
            "/admin/keys/{id}",
            get(keys::get_one).patch(keys::update).delete(keys::delete),
        )
        .route("/admin/keys/{id}/revoke", post(keys::revoke))
        .route("/admin/keys/{id}/rotate", post(keys::rotate))
        .route("/admin/tenants", get(keys::tenants))
        .route("/admin/tenants/{id}", get(keys::tenant))
        .route("/admin/tenants/{id}/balance", get(balance::show))
        .route("/admin/tenants/{id}/balance/topups", post(balance::top_up))
        .route(
            "/admin/config",
            get(ops::config_show).put(ops::config_apply),
        )
        .route("/admin/config/validate", post(ops::config_validate))
        .route("/admin/health", get(ops::health))
        .route("/admin/cache/purge", post(ops::cache_purge))
        .route("/admin/usage", get(ops::usage))
        .route("/admin/requests", get(requests::list))
        .route("/admin/dashboard.json", get(dashboard::json))
        .route("/admin/{*rest}", axum::routing::any(unknown))
        .layer(axum::middleware::from_fn_with_state(state, authenticate))
}

async fn unknown() -> ApiError {
    not_found("route", "Unknown admin route; see GET /openapi.json.")
}

/// Middleware: resolves the admin key or answers 401. The key comes from `Authorization: Bearer`
/// (or `x-api-key`); only `GET /admin/dashboard.json` also takes the dashboard's session cookie
/// (docs/dashboard.md: a read-only route, so a forged cross-site request can change nothing).
async fn authenticate(State(app): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let dashboard_data =
        req.method() == axum::http::Method::GET && req.uri().path() == "/admin/dashboard.json";
    let cookie = dashboard_data
        .then(|| dashboard_page::cookie_session(req.headers()))
        .flatten();
    let caller = match (crate::auth::presented_key(req.headers()), cookie) {
        (Some(key), _) => resolve(&app, key).ok_or_else(|| {
            unauthorized(
                "invalid_admin_key",
                format!(
                    "Incorrect admin key provided: {}.",
                    crate::auth::masked(key)
                ),
            )
        }),
        (None, Some(token)) => resolve_session(&app, &token).ok_or_else(|| {
            unauthorized(
                "invalid_admin_key",
                "The dashboard session has expired or its admin key is no longer valid; sign \
                 in again at /dashboard."
                    .into(),
            )
        }),
        (None, None) => Err(unauthorized(
            "missing_admin_key",
            "The admin API needs an admin key: send it as `Authorization: Bearer <admin key>`."
                .into(),
        )),
    };
    match caller {
        Ok(c) => {
            req.extensions_mut().insert(c);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// The admin a dashboard session token ([`dashboard_page::session_token`]) was issued to, while
/// that admin key is still configured with the same hash and the token has not expired.
fn resolve_session(app: &AppState, token: &str) -> Option<AdminCaller> {
    let session = dashboard_page::Session::parse(token)?;
    let now_s = dashboard_page::unix_now_s();
    table(app)
        .iter()
        .find(|(hash, c)| c.id == session.id() && session.valid(hash, now_s))
        .map(|(_, c)| c.clone())
}

/// The admin key `key` is, if any: its SHA-256 compared with every configured hash in constant
/// time (no early exit, so timing does not tell how much of a hash matched).
fn resolve(app: &AppState, key: &str) -> Option<AdminCaller> {
    let hash = sha256_hex(key);
    table(app)
        .iter()
        .fold(None, |found, (h, c)| match ct_eq(h, &hash) {
            true => Some(c.clone()),
            false => found,
        })
}

/// The configured admin keys' hashes, rebuilt when the config version changes.
fn table(app: &AppState) -> Arc<AdminTable> {
    let version = app.config.version();
    let mut built = app.admin.table.lock();
    if let Some((v, t)) = built.as_ref()
        && *v == version
    {
        return t.clone();
    }
    let env = |k: &str| std::env::var(k).ok();
    let t: AdminTable = app
        .config
        .get()
        .admin
        .keys
        .iter()
        .filter_map(|k| {
            let caller = AdminCaller {
                id: k.id.clone(),
                tenant: k.tenant.clone(),
            };
            k.sha256(&env).map(|h| (h, caller))
        })
        .collect();
    let t = Arc::new(t);
    *built = Some((version, t.clone()));
    t
}

/// Constant-time equality of two hex digests (every byte is compared; no early exit).
fn ct_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unauthorized(code: &'static str, message: String) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        code,
        message,
    )
}

fn not_found(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        message,
    )
    .with_param(param)
}

fn unavailable(message: impl Into<String>) -> ApiError {
    ApiError::unavailable("admin_unavailable", message)
}

/// Parses a JSON body into `T`, a 400 naming the offending field otherwise.
fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        ApiError::invalid(format!("Invalid request body: {}", e.into_inner()), param)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_compare_equal_only_when_equal() {
        let a = sha256_hex("a");
        assert!(ct_eq(&a, &sha256_hex("a")));
        assert!(!ct_eq(&a, &sha256_hex("b")));
        assert!(!ct_eq(&a, "short"));
    }
}
