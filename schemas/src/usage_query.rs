//! The usage query: aggregated usage read from the billing ledger over NATS request/reply, the
//! backend of ingress's `GET /v1/usage`.
//!
//! Ingress sends a JSON [`UsageQuery`] to `<prefix>.billing.usage`
//! ([`crate::subjects::Subjects::usage_query`]); one billing instance of queue group `billing`
//! answers with a JSON [`UsageAnswer`]: either a [`UsageReply`] (`{"rows": [...], "totals": {...}}`)
//! or `{"error": "..."}`.
//!
//! **What is counted** is what billing's daily report counts: one request is one `charge` event
//! (ingress's record of what the tenant is billed for); requests, tokens, `charge_usd`, cache hits
//! and errors come from `charge` events, `cost_usd` from the `upstream` events of the same
//! requests. A request belongs to the range when its `charge` event's `ts_ms` is in it (a request
//! without one, when its earliest `upstream` event's is), and `day` / `hour` group it by that time
//! too, so the rows of one UTC day equal the daily report's figures for that day.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::str::FromStr;

/// Group value of a row without a tenant, key or target (e.g. authentication off).
pub const NONE_VALUE: &str = "(none)";
/// Group value of `provider` for a target the query's `providers` map does not name.
pub const UNKNOWN_PROVIDER: &str = "(unknown)";

/// What to aggregate: the requests of a time range, optionally of one tenant and/or key, grouped
/// by zero or more [`GroupBy`] dimensions.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageQuery {
    /// Range start, inclusive, ms since the Unix epoch (UTC).
    pub from_ms: u64,
    /// Range end, exclusive, ms since the Unix epoch (UTC): the range is `[from_ms, to_ms)` on the
    /// time each request is filed under (see the module docs).
    pub to_ms: u64,
    /// Dimensions of each row's group, in this order; empty = one row holding the totals.
    #[serde(default)]
    pub group_by: Vec<GroupBy>,
    /// Only this tenant's requests; `None` = every tenant.
    pub tenant: Option<String>,
    /// Only this key's requests; `None` = every key.
    pub key_id: Option<String>,
    /// Target id → provider name (e.g. `openai-east` → `openai`), for [`GroupBy::Provider`]: the
    /// ledger stores targets, the live config knows their providers. A target missing here is
    /// grouped under [`UNKNOWN_PROVIDER`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub providers: BTreeMap<String, String>,
}

/// One grouping dimension; serialised snake_case (`tenant`, `key`, `model`, `provider`, `target`,
/// `day`, `hour`), which is also the key of the value in [`UsageRow::group`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// The tenant ([`NONE_VALUE`] when authentication is off).
    Tenant,
    /// The calling key id ([`NONE_VALUE`] when authentication is off).
    Key,
    /// The standard model id or route tag the client asked for.
    Model,
    /// The provider of the target (see [`UsageQuery::providers`]).
    Provider,
    /// The provider target: the one that served (charge) or was called (upstream cost).
    Target,
    /// The UTC day, `YYYY-MM-DD`.
    Day,
    /// The UTC hour, `YYYY-MM-DDTHH`.
    Hour,
}

impl GroupBy {
    /// Every dimension, in declaration order.
    pub const ALL: [Self; 7] = [
        Self::Tenant,
        Self::Key,
        Self::Model,
        Self::Provider,
        Self::Target,
        Self::Day,
        Self::Hour,
    ];

    /// The snake_case name, e.g. `provider`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Key => "key",
            Self::Model => "model",
            Self::Provider => "provider",
            Self::Target => "target",
            Self::Day => "day",
            Self::Hour => "hour",
        }
    }
}

/// A `group_by` value that names no [`GroupBy`]; holds the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown group_by `{0}`: expected one of tenant, key, model, provider, target, day, hour")]
pub struct UnknownGroupBy(pub String);

impl FromStr for GroupBy {
    type Err = UnknownGroupBy;

    /// Parses the snake_case name (exact, case-sensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|g| g.as_str() == s)
            .ok_or_else(|| UnknownGroupBy(s.to_owned()))
    }
}

impl std::fmt::Display for GroupBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The figures of one group (or, with an empty `group`, of the whole range). Token parts never
/// overlap: input = `input_tokens + cached_input_tokens + cache_write_tokens`, output =
/// `output_tokens + reasoning_tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// [`GroupBy`] name → value (`day` as `YYYY-MM-DD`, `hour` as `YYYY-MM-DDTHH`, UTC); empty for
    /// totals.
    pub group: BTreeMap<String, String>,
    /// Requests (`charge` events), requests.
    pub requests: u64,
    /// New (uncached) input, tokens.
    pub input_tokens: u64,
    /// Input read from the provider's prompt cache, tokens.
    pub cached_input_tokens: u64,
    /// Input written to the provider's prompt cache, tokens.
    pub cache_write_tokens: u64,
    /// Output excluding reasoning, tokens.
    pub output_tokens: u64,
    /// Reasoning output, tokens.
    pub reasoning_tokens: u64,
    /// What the upstream calls cost (cost price), USD, exact, as a decimal string.
    pub cost_usd: Decimal,
    /// What the tenant is charged (sale price), USD, exact, as a decimal string.
    pub charge_usd: Decimal,
    /// Requests answered from the answer cache, requests.
    pub cache_hits: u64,
    /// Requests that ended with an error, requests.
    pub errors: u64,
}

/// A successful answer: one row per group, ascending by the group values in `group_by` order, and
/// the totals of the whole range (empty `group`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReply {
    /// One row per group present in the range (none when the range holds no request).
    pub rows: Vec<UsageRow>,
    /// Sum of every row.
    pub totals: UsageRow,
}

/// Billing's answer to a [`UsageQuery`], untagged on the wire: `{"rows": [...], "totals": {...}}`
/// or `{"error": "<why>"}` (invalid query, ledger unreadable, answer too large for NATS).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum UsageAnswer {
    /// The aggregated usage.
    Ok(UsageReply),
    /// The query could not be answered.
    Err {
        /// Why, for humans.
        error: String,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn group_by_names_roundtrip() {
        for g in GroupBy::ALL {
            assert_eq!(g.as_str().parse::<GroupBy>().unwrap(), g);
            assert_eq!(
                serde_json::to_value(g).unwrap(),
                serde_json::json!(g.as_str())
            );
        }
        let err = "week".parse::<GroupBy>().unwrap_err();
        assert_eq!(err, UnknownGroupBy("week".into()));
        assert!(err.to_string().contains("`week`"));
    }

    #[test]
    fn answer_shapes() {
        let row = UsageRow {
            group: BTreeMap::from([("model".to_owned(), "m".to_owned())]),
            requests: 2,
            cost_usd: Decimal::new(5615, 6),
            ..UsageRow::default()
        };
        let ok = UsageAnswer::Ok(UsageReply {
            rows: vec![row.clone()],
            totals: UsageRow {
                group: BTreeMap::new(),
                ..row
            },
        });
        let json = serde_json::to_value(&ok).unwrap();
        assert_eq!(json["rows"][0]["group"]["model"], "m");
        assert_eq!(json["rows"][0]["cost_usd"], "0.005615");
        assert_eq!(json["totals"]["requests"], 2);
        assert_eq!(
            serde_json::from_value::<UsageAnswer>(json).unwrap(),
            ok.clone()
        );
        let err = UsageAnswer::Err {
            error: "bad".into(),
        };
        let json = serde_json::to_string(&err).unwrap();
        assert_eq!(json, r#"{"error":"bad"}"#);
        assert_eq!(serde_json::from_str::<UsageAnswer>(&json).unwrap(), err);
        let q: UsageQuery =
            serde_json::from_str(r#"{"from_ms":1,"to_ms":2,"group_by":["day","key"]}"#).unwrap();
        assert_eq!(q.group_by, vec![GroupBy::Day, GroupBy::Key]);
        assert_eq!((q.tenant, q.key_id), (None, None));
    }
}
