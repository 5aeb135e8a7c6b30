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
/// ([`crate::usage_api::parse_time`]: `to` given as a date means its next midnight), or `None`
/// where absent. `from` after `to` is an error naming `from`.
pub(crate) fn time_range(
    params: &BTreeMap<String, String>,
) -> Result<(Option<u64>, Option<u64>), ApiError> {
    let time = |name: &str, end_of_day| {
        params
            .get(name)
            .map(|s| crate::usage_api::parse_time(s, end_of_day).map_err(|m| invalid(name, m)))
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
    use crate::usage_api::rfc3339;
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
