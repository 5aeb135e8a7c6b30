//! `GET /v1/usage`: aggregated usage from the billing ledger, asked over NATS.
//!
//! Query parameters (all optional):
//! - `from`, `to`: RFC 3339 timestamps (`2025-11-05T10:00:00Z`, `…+02:00`, fractions of a second
//!   allowed) or UTC dates `YYYY-MM-DD`; `from` as a date is that day's midnight, `to` as a date
//!   the *end* of that day (the next midnight, exclusive), so `from=2025-11-05&to=2025-11-05` is
//!   that whole day. The range is half-open `[from, to)`. Defaults: `from` = start of today
//!   (UTC), `to` = now.
//! - `group_by`: comma-separated dimensions, `tenant`, `key`, `model`, `provider`, `target`,
//!   `day`, `hour` (default `model`; empty = totals only). May be repeated.
//! - `tenant`, `key`: only that tenant's / key's requests.
//!
//! Scoping: an admin key, or any caller while authentication is off, may name any tenant and key.
//! Any other key sees its own tenant only: `tenant=` naming another one is 404 `not_found` (param
//! `tenant`), the same answer whether that tenant exists or not (issue 13: tenant isolation, as
//! the admin API answers another tenant's key or tenant); `key=` narrows within the caller's own
//! tenant (another tenant's key id yields no rows). A key without a tenant sees its own key only
//! (403 `permission_denied` for `tenant=` or another `key=`).
//!
//! Ingress sends a [`UsageQuery`] to `<prefix>.billing.usage` and waits up to
//! [`BILLING_RPC_TIMEOUT`](crate::billing_rpc::BILLING_RPC_TIMEOUT) for one billing instance; the 200 answer is
//! `{"object":"usage","from":RFC3339,"to":RFC3339,"group_by":[...],"data":[rows],"totals":{...}}`
//! with rows as in [`UsageRow`] (money as exact decimal strings, USD). No billing instance, or no
//! answer in time: 503.

use crate::AppState;
use crate::billing_rpc::{self, Purpose};
use crate::context::Caller;
use crate::error::ApiError;
pub use crate::query_string::rfc3339;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;
use switchyard_schemas::usage_query::{GroupBy, UsageAnswer, UsageQuery, UsageReply};

#[cfg(doc)]
use switchyard_schemas::usage_query::UsageRow;

/// How usage queries name themselves in billing errors.
const USAGE: Purpose = Purpose {
    what: "answer usage queries",
    unavailable_code: "billing_unavailable",
    failed_code: "usage_query_failed",
};
/// One day, ms.
const DAY_MS: u64 = 86_400_000;

/// The parameters of one `GET /v1/usage`, defaults applied, before scoping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageParams {
    /// Range start, inclusive, ms since the Unix epoch.
    pub from_ms: u64,
    /// Range end, exclusive, ms since the Unix epoch.
    pub to_ms: u64,
    /// Grouping dimensions, in the order asked.
    pub group_by: Vec<GroupBy>,
    /// `tenant=`, if given.
    pub tenant: Option<String>,
    /// `key=`, if given.
    pub key_id: Option<String>,
}

/// Answers `GET /v1/usage?<query>` for `caller`; `query` is the raw (still percent-encoded) query
/// string, without the `?`.
pub async fn handle(app: &AppState, caller: &Caller, query: &str) -> Response {
    match answer(app, caller, query).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn answer(app: &AppState, caller: &Caller, query: &str) -> Result<Response, ApiError> {
    let params = parse_query(query, switchyard_schemas::now_ms())?;
    let (tenant, key_id) = scope(caller, params.tenant, params.key_id)?;
    let providers: BTreeMap<String, String> = if params.group_by.contains(&GroupBy::Provider) {
        let config = app.config.get();
        config
            .targets
            .iter()
            .map(|t| (t.id.clone(), t.provider.as_str().to_owned()))
            .collect()
    } else {
        BTreeMap::new()
    };
    let query = UsageQuery {
        from_ms: params.from_ms,
        to_ms: params.to_ms,
        group_by: params.group_by.clone(),
        tenant,
        key_id,
        providers,
    };
    let reply = ask_billing(app, &query).await?;
    let body = serde_json::json!({
        "object": "usage",
        "from": rfc3339(params.from_ms),
        "to": rfc3339(params.to_ms),
        "group_by": params.group_by,
        "data": reply.rows,
        "totals": reply.totals,
    });
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// Sends `query` to billing (`<prefix>.billing.usage`) and returns its rows: 503 when no billing
/// instance answers within [`BILLING_RPC_TIMEOUT`](crate::billing_rpc::BILLING_RPC_TIMEOUT), 500 when its answer is an error. Shared by
/// `GET /v1/usage`, `GET /admin/usage` and the dashboard.
pub(crate) async fn ask_billing(
    app: &AppState,
    query: &UsageQuery,
) -> Result<UsageReply, ApiError> {
    match billing_rpc::ask(&app.nats, app.subjects.usage_query(), query, USAGE).await? {
        UsageAnswer::Ok(reply) => Ok(reply),
        UsageAnswer::Err { error } => Err(billing_rpc::billing_error(USAGE, &error)),
    }
}

/// The (tenant, key) filters `caller` may use: see the module docs.
fn scope(
    caller: &Caller,
    tenant: Option<String>,
    key_id: Option<String>,
) -> Result<(Option<String>, Option<String>), ApiError> {
    if caller.admin || caller.key_id.is_none() {
        return Ok((tenant, key_id));
    }
    match &caller.tenant {
        Some(own) => {
            if let Some(asked) = &tenant
                && asked != own
            {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    "not_found",
                    format!(
                        "No tenant `{}` visible to this key (it reads tenant `{own}`).",
                        short(asked)
                    ),
                )
                .with_param("tenant"));
            }
            Ok((Some(own.clone()), key_id))
        }
        // A key of no tenant: its own requests only.
        None => {
            if tenant.is_some() {
                return Err(forbidden(
                    "This key belongs to no tenant; it may read its own usage only.".into(),
                    "tenant",
                ));
            }
            if let Some(asked) = &key_id
                && Some(asked) != caller.key_id.as_ref()
            {
                return Err(forbidden(
                    "This key may read its own usage only.".into(),
                    "key",
                ));
            }
            Ok((None, caller.key_id.clone()))
        }
    }
}

/// Parses the raw query string with `now_ms` for the defaults; errors name the parameter.
pub fn parse_query(query: &str, now_ms: u64) -> Result<UsageParams, ApiError> {
    let mut p = crate::query_string::params(
        query,
        "/v1/usage",
        &["from", "to", "tenant", "key"],
        &["group_by"],
    )?;
    let mut group_by: Vec<GroupBy> = Vec::new();
    for item in p
        .get("group_by")
        .map(String::as_str)
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let g: GroupBy =
            item.parse()
                .map_err(|e: switchyard_schemas::usage_query::UnknownGroupBy| {
                    invalid("group_by", format!("{e}."))
                })?;
        if group_by.contains(&g) {
            return Err(invalid(
                "group_by",
                format!("group_by names `{g}` more than once."),
            ));
        }
        group_by.push(g);
    }
    let (from, to) = crate::query_string::time_range(&p)?;
    let from_ms = from.unwrap_or(now_ms - now_ms % DAY_MS);
    let to_ms = to.unwrap_or(now_ms);
    if from_ms > to_ms {
        return Err(crate::query_string::after(from_ms, to_ms));
    }
    // No `group_by` groups by model; an empty one (`group_by=`) asks for totals.
    if !p.contains_key("group_by") {
        group_by.push(GroupBy::Model);
    }
    Ok(UsageParams {
        from_ms,
        to_ms,
        group_by,
        tenant: p.remove("tenant"),
        key_id: p.remove("key"),
    })
}

/// `s`, cut to 64 characters (a caller-chosen value is never echoed whole).
fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

fn invalid(param: &str, message: String) -> ApiError {
    ApiError::invalid(message, Some(param.to_owned()))
}

fn forbidden(message: String, param: &str) -> ApiError {
    ApiError::permission_denied(message, Some(param))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// 2025-11-05T13:14:15.678Z.
    const NOW: u64 = 1_762_300_800_000 + 13 * 3_600_000 + 14 * 60_000 + 15_678;
    const DAY: u64 = 1_762_300_800_000;

    fn err(query: &str) -> ApiError {
        parse_query(query, NOW).unwrap_err()
    }

    /// Dates at the edges of the calendar are a 400, never a panic (issue 13: a handler panicked
    /// on `to=9999-12-31`).
    #[test]
    fn calendar_edges_are_errors_not_panics() {
        for q in [
            "from=9999-12-31&to=9999-12-31",
            "to=9999-12-31",
            "from=0000-01-01",
            "from=-9999-01-01",
            "from=9999-12-31T23:59:59Z&to=+10000-01-01",
            "from=%F0%9F%98%80%F0%9F%98%80%F0%9F%98%80 01:00",
        ] {
            assert_eq!(err(q).status, axum::http::StatusCode::BAD_REQUEST, "{q}");
        }
    }

    #[test]
    fn defaults() {
        let p = parse_query("", NOW).unwrap();
        assert_eq!(
            p,
            UsageParams {
                from_ms: DAY,
                to_ms: NOW,
                group_by: vec![GroupBy::Model],
                tenant: None,
                key_id: None,
            }
        );
        assert_eq!(rfc3339(p.from_ms), "2025-11-05T00:00:00Z");
        assert_eq!(rfc3339(p.to_ms), "2025-11-05T13:14:15.678Z");
    }

    #[test]
    fn times_dates_and_lists() {
        let p = parse_query(
            "from=2025-11-04&to=2025-11-04&group_by=tenant,%20day&group_by=hour&tenant=acme&key=k%2F1",
            NOW,
        )
        .unwrap();
        assert_eq!((p.from_ms, p.to_ms), (DAY - DAY_MS, DAY));
        assert_eq!(
            p.group_by,
            vec![GroupBy::Tenant, GroupBy::Day, GroupBy::Hour]
        );
        assert_eq!(p.tenant.as_deref(), Some("acme"));
        assert_eq!(p.key_id.as_deref(), Some("k/1"));

        const HOUR: u64 = 3_600_000;
        // An empty `group_by=` asks for totals; none groups by model.
        for (query, from, to, group_by) in [
            (
                "from=2025-11-05T10:00:00Z&to=2025-11-05T12:00:00.5%2B02:00&group_by=",
                DAY + 10 * HOUR,
                DAY + 10 * HOUR + 500,
                vec![],
            ),
            // An unencoded `+` decodes to a space; it still means a positive offset.
            (
                "from=2025-11-05T10:00:00+01:00&to=2025-11-05t09:30:00.123456-00:30",
                DAY + 9 * HOUR,
                DAY + 10 * HOUR + 123,
                vec![GroupBy::Model],
            ),
        ] {
            let p = parse_query(query, NOW).unwrap();
            assert_eq!(
                (p.from_ms, p.to_ms, p.group_by),
                (from, to, group_by),
                "{query}"
            );
        }
    }

    #[test]
    fn errors_name_the_parameter() {
        for (query, param) in [
            ("from=yesterday", "from"),
            ("from=2025-02-29", "from"),
            ("to=2025-11-05T25:00:00Z", "to"),
            ("to=2025-11-05T10:00:00", "to"),
            ("to=2025-11-05T10:00:00.Z", "to"),
            ("from=2025-11-06&to=2025-11-05T00:00:00Z", "from"),
            ("group_by=week", "group_by"),
            ("group_by=day,day", "group_by"),
            ("tenant=", "tenant"),
            ("key=a&key=b", "key"),
            ("limit=5", "limit"),
        ] {
            let e = err(query);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{query}");
            assert_eq!(e.kind, "invalid_request_error");
            assert_eq!(e.param.as_deref(), Some(param), "{query}: {}", e.message);
        }
        assert!(err("group_by=week").message.contains("`week`"));
    }

    #[test]
    fn scoping() {
        let tenant_key = Caller {
            tenant: Some("acme".into()),
            key_id: Some("k1".into()),
            ..Caller::default()
        };
        assert_eq!(
            scope(&tenant_key, None, Some("k2".into())).unwrap(),
            (Some("acme".into()), Some("k2".into()))
        );
        assert_eq!(
            scope(&tenant_key, Some("acme".into()), None).unwrap(),
            (Some("acme".into()), None)
        );
        let e = scope(&tenant_key, Some("globex".into()), None).unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.code, Some("not_found"));
        assert_eq!(e.param.as_deref(), Some("tenant"));

        let admin = Caller {
            admin: true,
            ..tenant_key.clone()
        };
        assert_eq!(
            scope(&admin, Some("globex".into()), None).unwrap(),
            (Some("globex".into()), None)
        );
        // Authentication off: anything goes.
        assert_eq!(
            scope(&Caller::default(), Some("x".into()), Some("y".into())).unwrap(),
            (Some("x".into()), Some("y".into()))
        );
        let lone = Caller {
            key_id: Some("k9".into()),
            ..Caller::default()
        };
        assert_eq!(scope(&lone, None, None).unwrap(), (None, Some("k9".into())));
        assert!(scope(&lone, None, Some("k1".into())).is_err());
        assert!(scope(&lone, Some("acme".into()), None).is_err());
    }
}
