//! `GET /admin/requests`: the audit log (docs/audit.md), one page per call, newest first.
//!
//! Query parameters (each at most once): `from`, `to` (RFC 3339 or `YYYY-MM-DD`; `to` is
//! exclusive, a date meaning its next midnight), `key`, `tenant`, `model`, `status` (`ok`,
//! `error`, `cancelled` or an HTTP status such as `429`), `cursor` (the previous page's
//! `next_cursor`) and `limit` (1..=1000, default 100). A tenant admin key sees its own tenant's
//! records only (another tenant is 403). Ingress asks billing over NATS
//! (`<prefix>.billing.audit`, [`switchyard_schemas::audit::AuditQuery`]); no billing running → 503.

use super::AdminCaller;
use crate::AppState;
use crate::billing_rpc::{self, Purpose};
use crate::error::ApiError;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use switchyard_schemas::audit::{AuditAnswer, AuditPage, AuditQuery, MAX_PAGE};

/// How audit queries name themselves in billing errors.
const AUDIT: Purpose = Purpose {
    what: "answer audit queries",
    unavailable_code: "admin_unavailable",
    failed_code: "audit_query_failed",
};

/// The handler.
pub(super) async fn list(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    uri: axum::http::Uri,
) -> Response {
    match answer(&app, &admin, uri.query().unwrap_or("")).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn answer(app: &AppState, admin: &AdminCaller, query: &str) -> Result<Response, ApiError> {
    let mut q = parse(query)?;
    if let Some(own) = admin.tenant.clone() {
        if q.tenant.as_deref().is_some_and(|t| t != own) {
            return Err(ApiError::permission_denied(
                format!("This admin key may read the requests of tenant `{own}` only."),
                Some("tenant"),
            ));
        }
        q.tenant = Some(own);
    }
    let page = page(app, &q).await?;
    let body = serde_json::json!({
        "object": "list",
        "data": page.data,
        "has_more": page.next_cursor.is_some(),
        "next_cursor": page.next_cursor,
    });
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// Asks billing for one page of `q` (`<prefix>.billing.audit`): 503 when no billing instance
/// answers within [`BILLING_RPC_TIMEOUT`](crate::billing_rpc::BILLING_RPC_TIMEOUT), 400 for a query billing calls invalid, else 500.
pub(super) async fn page(app: &AppState, q: &AuditQuery) -> Result<AuditPage, ApiError> {
    match billing_rpc::ask(&app.nats, app.subjects.audit_query(), q, AUDIT).await? {
        AuditAnswer::Ok(page) => Ok(page),
        AuditAnswer::Err { error } if error.starts_with("invalid audit query") => {
            Err(ApiError::invalid(error, None))
        }
        AuditAnswer::Err { error } => Err(billing_rpc::billing_error(AUDIT, &error)),
    }
}

/// Parses the query string; errors name the parameter.
pub(super) fn parse(query: &str) -> Result<AuditQuery, ApiError> {
    let mut p = crate::query_string::params(
        query,
        "/admin/requests",
        &[
            "from", "to", "key", "tenant", "model", "status", "cursor", "limit",
        ],
        &[],
    )?;
    let (from_ms, to_ms) = crate::query_string::time_range(&p)?;
    let limit = crate::query_string::int(&p, "limit", MAX_PAGE)?;
    Ok(AuditQuery {
        from_ms,
        to_ms,
        key_id: p.remove("key"),
        tenant: p.remove("tenant"),
        model: p.remove("model"),
        status: p.remove("status"),
        cursor: p.remove("cursor"),
        limit,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_filters_and_rejects_bad_ones() {
        let q = parse("from=2026-01-01&to=2026-01-01&key=k1&status=429&limit=5").unwrap();
        assert_eq!(q.from_ms, Some(1_767_225_600_000));
        assert_eq!(q.to_ms, Some(1_767_225_600_000 + 86_400_000));
        assert_eq!(q.key_id.as_deref(), Some("k1"));
        assert_eq!(q.status.as_deref(), Some("429"));
        assert_eq!(q.limit, Some(5));
        for bad in ["limit=0", "limit=1001", "key=a&key=b", "nope=1", "from=x"] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
