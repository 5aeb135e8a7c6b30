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
//! Any other key sees its own tenant only (`tenant=` naming another one is 403
//! `permission_denied`); a key without a tenant sees its own key only.
//!
//! Ingress sends a [`UsageQuery`] to `<prefix>.billing.usage` and waits up to
//! [`USAGE_QUERY_TIMEOUT`] for one billing instance; the 200 answer is
//! `{"object":"usage","from":RFC3339,"to":RFC3339,"group_by":[...],"data":[rows],"totals":{...}}`
//! with rows as in [`UsageRow`] (money as exact decimal strings, USD). No billing instance, or no
//! answer in time: 503.

use crate::AppState;
use crate::charge::Caller;
use crate::error::ApiError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;
use std::time::Duration;
use switchyard_schemas::usage_query::{GroupBy, UsageAnswer, UsageQuery};

#[cfg(doc)]
use switchyard_schemas::usage_query::UsageRow;

/// How long ingress waits for billing's answer.
pub const USAGE_QUERY_TIMEOUT: Duration = Duration::from_secs(5);
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
    let payload = serde_json::to_vec(&query).map_err(|e| internal(e.to_string()))?;
    let request = async_nats::Request::new()
        .payload(payload.into())
        .timeout(Some(USAGE_QUERY_TIMEOUT));
    let reply = app
        .nats
        .send_request(app.subjects.usage_query(), request)
        .await
        .map_err(|e| {
            use async_nats::RequestErrorKind::{NoResponders, TimedOut};
            match e.kind() {
                NoResponders => {
                    unavailable("No billing service is running to answer usage queries.")
                }
                TimedOut => unavailable(&format!(
                    "The billing service did not answer within {} s; narrow the range or retry.",
                    USAGE_QUERY_TIMEOUT.as_secs()
                )),
                _ => unavailable(&format!("Asking the billing service failed: {e}")),
            }
        })?;
    let answer: UsageAnswer = serde_json::from_slice(&reply.payload)
        .map_err(|e| internal(format!("unreadable answer from billing: {e}")))?;
    let reply = match answer {
        UsageAnswer::Ok(reply) => reply,
        UsageAnswer::Err { error } => {
            return Err(internal(format!("billing could not answer: {error}")));
        }
    };
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
                return Err(forbidden(
                    format!("This key may read the usage of tenant `{own}` only."),
                    "tenant",
                ));
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
    let uri: axum::http::Uri = format!("/?{query}")
        .parse()
        .map_err(|_| ApiError::invalid("The query string is not valid.", None))?;
    let axum::extract::Query(pairs) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map_err(|e| ApiError::invalid(format!("The query string is not valid: {e}"), None))?;
    let mut from = None;
    let mut to = None;
    let mut group_by: Option<Vec<GroupBy>> = None;
    let mut tenant = None;
    let mut key_id = None;
    for (name, value) in pairs {
        let once = |slot: &mut Option<String>, value: String| {
            if slot.is_some() {
                return Err(invalid(&name, format!("`{name}` is given more than once.")));
            }
            if value.is_empty() {
                return Err(invalid(&name, format!("`{name}` must not be empty.")));
            }
            *slot = Some(value);
            Ok(())
        };
        match name.as_str() {
            "from" => once(&mut from, value)?,
            "to" => once(&mut to, value)?,
            "tenant" => once(&mut tenant, value)?,
            "key" => once(&mut key_id, value)?,
            "group_by" => {
                let list = group_by.get_or_insert_with(Vec::new);
                for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let g: GroupBy = item.parse().map_err(
                        |e: switchyard_schemas::usage_query::UnknownGroupBy| {
                            invalid("group_by", format!("{e}."))
                        },
                    )?;
                    if list.contains(&g) {
                        return Err(invalid(
                            "group_by",
                            format!("group_by names `{g}` more than once."),
                        ));
                    }
                    list.push(g);
                }
            }
            _ => {
                return Err(invalid(
                    &name,
                    format!(
                        "Unrecognized query parameter `{name}`; /v1/usage takes from, to, \
                         group_by, tenant and key."
                    ),
                ));
            }
        }
    }
    let from_ms = match &from {
        Some(s) => parse_time(s, false).map_err(|m| invalid("from", m))?,
        None => now_ms - now_ms % DAY_MS,
    };
    let to_ms = match &to {
        Some(s) => parse_time(s, true).map_err(|m| invalid("to", m))?,
        None => now_ms,
    };
    if from_ms > to_ms {
        return Err(invalid(
            "from",
            format!(
                "`from` ({}) is after `to` ({}).",
                rfc3339(from_ms),
                rfc3339(to_ms)
            ),
        ));
    }
    Ok(UsageParams {
        from_ms,
        to_ms,
        group_by: group_by.unwrap_or_else(|| vec![GroupBy::Model]),
        tenant,
        key_id,
    })
}

/// A time parameter as ms since the Unix epoch: an RFC 3339 timestamp, or a `YYYY-MM-DD` date
/// meaning its midnight UTC, or with `end_of_day` the next midnight. The message says what is
/// wrong.
fn parse_time(s: &str, end_of_day: bool) -> Result<u64, String> {
    let expected =
        "expected an RFC 3339 timestamp (e.g. 2025-11-05T10:00:00Z) or a date YYYY-MM-DD";
    let bad = || format!("`{s}` is not a valid time: {expected}.");
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Result<u64, String> {
        let part = s.get(r).ok_or_else(bad)?;
        if part.is_empty() || !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse().map_err(|_| bad())
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return Err(bad());
    }
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let days = days_from_civil(y, m, d).ok_or_else(bad)?;
    let midnight = days * DAY_MS;
    if b.len() == 10 {
        return Ok(if end_of_day {
            midnight + DAY_MS
        } else {
            midnight
        });
    }
    if !matches!(b[10], b'T' | b't' | b' ') || b.len() < 19 || b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (h, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if h > 23 || min > 59 || sec > 59 {
        return Err(bad());
    }
    let mut rest = &s[19..];
    let mut frac_ms = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        // Milliseconds, truncating finer digits.
        for (i, c) in frac.bytes().take(3).take(digits).enumerate() {
            frac_ms += u64::from(c - b'0') * [100, 10, 1][i];
        }
        rest = &frac[digits..];
    }
    let local = midnight + h * 3_600_000 + min * 60_000 + sec * 1000 + frac_ms;
    match rest.as_bytes() {
        b"Z" | b"z" => Ok(local),
        // `+` arrives as a space when the client did not percent-encode it.
        [sign @ (b'+' | b'-' | b' '), _, _, b':', _, _] => {
            let two = |part: Option<&str>| -> Result<u64, String> {
                let part = part.ok_or_else(bad)?;
                if part.bytes().all(|c| c.is_ascii_digit()) {
                    part.parse().map_err(|_| bad())
                } else {
                    Err(bad())
                }
            };
            let (oh, om) = (two(rest.get(1..3))?, two(rest.get(4..6))?);
            if oh > 23 || om > 59 {
                return Err(bad());
            }
            let offset = oh * 3_600_000 + om * 60_000;
            if *sign == b'-' {
                Ok(local + offset)
            } else {
                local
                    .checked_sub(offset)
                    .ok_or_else(|| format!("`{s}` is before 1970-01-01T00:00:00Z."))
            }
        }
        _ => Err(bad()),
    }
}

/// Days since 1970-01-01 of a valid proleptic Gregorian date from 1970 to 9999 (H. Hinnant's
/// `days_from_civil`); `None` for an invalid date such as 2025-02-30.
fn days_from_civil(y: u64, m: u64, d: u64) -> Option<u64> {
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || d == 0 {
        return None;
    }
    let leap = (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if d > month_days[usize::try_from(m - 1).ok()?] {
        return None;
    }
    let (y, m, d) = (y as i64, m as i64, d as i64);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    u64::try_from(era * 146_097 + doe - 719_468).ok()
}

/// `ms` as RFC 3339 UTC, `YYYY-MM-DDTHH:MM:SS[.mmm]Z` (milliseconds only when not zero).
pub fn rfc3339(ms: u64) -> String {
    let days = (ms / DAY_MS) as i64;
    // H. Hinnant's `civil_from_days`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let t = ms % DAY_MS;
    let (h, min, s, frac) = (t / 3_600_000, t / 60_000 % 60, t / 1000 % 60, t % 1000);
    if frac == 0 {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}Z")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{frac:03}Z")
    }
}

fn invalid(param: &str, message: String) -> ApiError {
    ApiError::invalid(message, Some(param.to_owned()))
}

fn forbidden(message: String, param: &str) -> ApiError {
    ApiError {
        status: StatusCode::FORBIDDEN,
        message,
        kind: "invalid_request_error",
        param: Some(param.to_owned()),
        code: Some("permission_denied"),
        retry_after_s: None,
    }
}

fn unavailable(message: &str) -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: message.to_owned(),
        kind: "service_unavailable_error",
        param: None,
        code: Some("billing_unavailable"),
        retry_after_s: Some(1),
    }
}

fn internal(message: String) -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message,
        kind: "server_error",
        param: None,
        code: Some("usage_query_failed"),
        retry_after_s: None,
    }
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

        let p = parse_query(
            "from=2025-11-05T10:00:00Z&to=2025-11-05T12:00:00.5%2B02:00&group_by=",
            NOW,
        )
        .unwrap();
        assert_eq!(p.from_ms, DAY + 10 * 3_600_000);
        assert_eq!(p.to_ms, DAY + 10 * 3_600_000 + 500);
        assert!(p.group_by.is_empty());
        // An unencoded `+` decodes to a space; it still means a positive offset.
        let p = parse_query(
            "from=2025-11-05T10:00:00+01:00&to=2025-11-05t09:30:00.123456-00:30",
            NOW,
        )
        .unwrap();
        assert_eq!(p.from_ms, DAY + 9 * 3_600_000);
        assert_eq!(p.to_ms, DAY + 10 * 3_600_000 + 123);
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
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        assert_eq!(e.code, Some("permission_denied"));

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
