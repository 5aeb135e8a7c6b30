//! One reader of URL query strings for the JSON `GET` endpoints (`/v1/usage`,
//! `/admin/requests`): every error is a 400 in the OpenAI error shape naming the parameter.

use crate::error::ApiError;
use std::collections::BTreeMap;

/// The parameters of `query` by name. Each name of `known` may appear once with a non-empty
/// value; a name of `lists` may repeat, its values joined with `,` (empty ones allowed). Any
/// other name is an error that lists what `route` takes.
pub(crate) fn params(
    query: &str,
    route: &str,
    known: &[&str],
    lists: &[&str],
) -> Result<BTreeMap<String, String>, ApiError> {
    let uri: axum::http::Uri = format!("/?{query}")
        .parse()
        .map_err(|_| ApiError::invalid("The query string is not valid.", None))?;
    let axum::extract::Query(pairs) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map_err(|e| ApiError::invalid(format!("The query string is not valid: {e}"), None))?;
    let mut out = BTreeMap::new();
    for (name, value) in pairs {
        if lists.contains(&name.as_str()) {
            out.entry(name)
                .and_modify(|v: &mut String| {
                    v.push(',');
                    v.push_str(&value);
                })
                .or_insert(value);
            continue;
        }
        if !known.contains(&name.as_str()) {
            let all: Vec<&str> = known.iter().chain(lists).copied().collect();
            let takes = match all.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
                _ => all.join(""),
            };
            return Err(invalid(
                &name,
                format!(
                    "Unrecognized query parameter `{}`; {route} takes {takes}.",
                    // A caller-chosen name is never echoed whole.
                    name.chars().take(64).collect::<String>()
                ),
            ));
        }
        if value.is_empty() {
            return Err(invalid(&name, format!("`{name}` must not be empty.")));
        }
        if out.contains_key(&name) {
            return Err(invalid(&name, format!("`{name}` is given more than once.")));
        }
        out.insert(name, value);
    }
    Ok(out)
}

/// The integer parameter `name` of `params` in `1..=max`, or `None` where absent; anything else
/// is an error naming it.
pub(crate) fn int(
    params: &BTreeMap<String, String>,
    name: &str,
    max: u32,
) -> Result<Option<u32>, ApiError> {
    params
        .get(name)
        .map(|v| {
            v.parse::<u32>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| invalid(name, format!("`{name}` must be an integer in 1..={max}.")))
        })
        .transpose()
}

/// The `from` and `to` parameters of `params` as ms since the Unix epoch
/// ([`parse_time`]: `to` given as a date means its next midnight), or `None`
/// where absent. `from` after `to` is an error naming `from`.
pub(crate) fn time_range(
    params: &BTreeMap<String, String>,
) -> Result<(Option<u64>, Option<u64>), ApiError> {
    let time = |name: &str, end_of_day| {
        params
            .get(name)
            .map(|s| parse_time(s, end_of_day).map_err(|m| invalid(name, m)))
            .transpose()
    };
    let (from, to) = (time("from", false)?, time("to", true)?);
    if let (Some(f), Some(t)) = (from, to)
        && f > t
    {
        return Err(after(f, t));
    }
    Ok((from, to))
}

/// The error for a range whose start `from_ms` is after its end `to_ms`.
pub(crate) fn after(from_ms: u64, to_ms: u64) -> ApiError {
    invalid(
        "from",
        format!(
            "`from` ({}) is after `to` ({}).",
            rfc3339(from_ms),
            rfc3339(to_ms)
        ),
    )
}

fn invalid(param: &str, message: String) -> ApiError {
    ApiError::invalid(message, Some(param.to_owned()))
}

/// A time parameter as ms since the Unix epoch: an RFC 3339 timestamp (parsed by the `time`
/// crate; finer than ms is truncated), or a `YYYY-MM-DD` date meaning its midnight UTC, or with
/// `end_of_day` the next midnight. The message says what is wrong.
pub(crate) fn parse_time(s: &str, end_of_day: bool) -> Result<u64, String> {
    use time::format_description::well_known::Rfc3339;
    let bad = || {
        format!(
            "`{s}` is not a valid time: expected an RFC 3339 timestamp \
             (e.g. 2025-11-05T10:00:00Z) or a date YYYY-MM-DD."
        )
    };
    let t = if s.len() == 10 {
        let date = time::Date::parse(s, time::macros::format_description!("[year]-[month]-[day]"))
            .map_err(|_| bad())?;
        let midnight = date.midnight().assume_utc();
        if end_of_day {
            // 9999-12-31 has no next day in `time`'s range: a 400, never a panic.
            midnight
                .checked_add(time::Duration::DAY)
                .ok_or_else(|| format!("`{s}` is past the last supported date."))?
        } else {
            midnight
        }
    } else {
        // An unencoded `+` in a query string decodes to a space: `…T10:00:00 01:00`.
        let mut fixed = s.to_owned();
        if fixed.len() > 6 && fixed.as_bytes()[fixed.len() - 6] == b' ' {
            fixed.replace_range(fixed.len() - 6..fixed.len() - 5, "+");
        }
        time::OffsetDateTime::parse(&fixed, &Rfc3339).map_err(|_| bad())?
    };
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| format!("`{s}` is before 1970-01-01T00:00:00Z."))
}

/// `ms` as RFC 3339 UTC, `YYYY-MM-DDTHH:MM:SS[.mmm]Z` (milliseconds only when not zero).
pub fn rfc3339(ms: u64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let (y, mo, d) = (t.year(), u8::from(t.month()), t.day());
    let (h, mi, sec, frac) = (t.hour(), t.minute(), t.second(), ms % 1000);
    if frac == 0 {
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{sec:02}Z")
    } else {
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{sec:02}.{frac:03}Z")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_values_and_lists() {
        let p = params("a=1&l=x&l=&l=y", "/r", &["a", "b"], &["l"]).unwrap();
        assert_eq!(p["a"], "1");
        assert_eq!(p["l"], "x,,y");
        let msg = |q: &str| params(q, "/r", &["a", "b"], &["l"]).unwrap_err().message;
        assert_eq!(msg("a=1&a=2"), "`a` is given more than once.");
        assert_eq!(msg("b="), "`b` must not be empty.");
        assert_eq!(
            msg("zz=1"),
            "Unrecognized query parameter `zz`; /r takes a, b and l."
        );
    }
}
