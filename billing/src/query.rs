//! Usage queries over NATS: the billing side of ingress's `GET /v1/usage`.
//!
//! [`crate::serve_queries`] with [`Query::Usage`](crate::Query::Usage) subscribes
//! `<prefix>.billing.usage` in queue group `billing` (one billing instance answers
//! each query) and replies to every JSON [`UsageQuery`] with a JSON [`UsageAnswer`]. [`usage`] does the work and is usable without NATS.
//!
//! The figures are the daily report's ([`crate::report`]): the same rows
//! ([`reconcile::load_requests_of`], requests anchored in the range with all their rows), added up
//! by the same [`GroupStats::add_row`], so a query for one UTC day matches that day's report. Each
//! ledger row goes to the group of its own tenant, key, model and target (as in the report: the
//! cost of a failed attempt lands on the target that failed); `day` and `hour` are those of the
//! request's anchor time. The tenant and key filters apply to rows, too.

use crate::reconcile::{self, LedgerRow, RequestRows};
use crate::report::{GroupStats, utc_date};
use crate::{BillingError, Ledger};
use std::collections::BTreeMap;
use switchyard_schemas::usage_query::{
    GroupBy, NONE_VALUE, UNKNOWN_PROVIDER, UsageAnswer, UsageQuery, UsageReply, UsageRow,
};

/// One hour, ms.
const HOUR_MS: u64 = 3_600_000;
/// One day, ms.
const DAY_MS: u64 = 86_400_000;

/// Answers `query` from `ledger`. Fails with [`QueryError::Invalid`] when `from_ms > to_ms` or a
/// dimension is named twice, and with [`QueryError::Billing`] when the ledger cannot be read.
pub async fn usage(ledger: &Ledger, query: &UsageQuery) -> Result<UsageReply, QueryError> {
    validate(query)?;
    let requests =
        reconcile::load_requests_of(ledger, query.from_ms, query.to_ms, query.tenant.as_deref())
            .await?;
    Ok(aggregate(&requests, query))
}

/// Why a query was not answered.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The query itself is wrong; the message says how.
    #[error("invalid usage query: {0}")]
    Invalid(String),
    /// Reading the ledger failed.
    #[error(transparent)]
    Billing(#[from] BillingError),
}

fn validate(query: &UsageQuery) -> Result<(), QueryError> {
    if query.from_ms > query.to_ms {
        return Err(QueryError::Invalid(format!(
            "from_ms {} is after to_ms {}",
            query.from_ms, query.to_ms
        )));
    }
    for (i, g) in query.group_by.iter().enumerate() {
        if query.group_by[..i].contains(g) {
            return Err(QueryError::Invalid(format!("group_by names `{g}` twice")));
        }
    }
    Ok(())
}

/// Groups the rows of `requests` (already restricted to the range) as `query` asks, applying its
/// tenant and key filters to each row.
pub fn aggregate(requests: &[RequestRows], query: &UsageQuery) -> UsageReply {
    let mut groups: BTreeMap<Vec<String>, GroupStats> = BTreeMap::new();
    for req in requests {
        let anchor = req.anchor_ts_ms();
        for row in req.charge.iter().chain(req.upstream.iter()) {
            if !matches(query.tenant.as_deref(), row.tenant.as_deref())
                || !matches(query.key_id.as_deref(), row.key_id.as_deref())
            {
                continue;
            }
            let key = query
                .group_by
                .iter()
                .map(|g| group_value(*g, row, anchor, query))
                .collect();
            groups.entry(key).or_default().add_row(row);
        }
    }
    let mut totals = GroupStats::default();
    let rows = groups
        .into_iter()
        .map(|(values, stats)| {
            totals.merge(&stats);
            let group = query
                .group_by
                .iter()
                .map(|g| g.as_str().to_owned())
                .zip(values)
                .collect();
            usage_row(group, &stats)
        })
        .collect();
    UsageReply {
        rows,
        totals: usage_row(BTreeMap::new(), &totals),
    }
}

fn matches(filter: Option<&str>, value: Option<&str>) -> bool {
    filter.is_none_or(|f| value == Some(f))
}

fn group_value(g: GroupBy, row: &LedgerRow, anchor_ms: u64, query: &UsageQuery) -> String {
    let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| NONE_VALUE.to_owned());
    match g {
        GroupBy::Tenant => or_none(&row.tenant),
        GroupBy::Key => or_none(&row.key_id),
        GroupBy::Model => row.model.clone(),
        GroupBy::Target => or_none(&row.target),
        GroupBy::Provider => match &row.target {
            None => NONE_VALUE.to_owned(),
            Some(t) => query
                .providers
                .get(t)
                .cloned()
                .unwrap_or_else(|| UNKNOWN_PROVIDER.to_owned()),
        },
        GroupBy::Day => utc_date(anchor_ms),
        GroupBy::Hour => format!(
            "{}T{:02}",
            utc_date(anchor_ms),
            anchor_ms % DAY_MS / HOUR_MS
        ),
    }
}

/// The wire row of one group's report figures.
fn usage_row(group: BTreeMap<String, String>, s: &GroupStats) -> UsageRow {
    UsageRow {
        group,
        requests: s.requests,
        input_tokens: s.tokens.new_input,
        cached_input_tokens: s.tokens.cached_input,
        cache_write_tokens: s.tokens.cache_write,
        output_tokens: s.tokens.output,
        reasoning_tokens: s.tokens.reasoning,
        cost_usd: s.cost_usd,
        charge_usd: s.charge_usd,
        cache_hits: s.cache_hits,
        errors: s.errors,
    }
}

/// The JSON answer to one request payload: the reply, or `{"error": ...}` for a payload that is
/// not a [`UsageQuery`], an invalid query, or a ledger failure (logged).
pub async fn answer(ledger: &Ledger, payload: &[u8]) -> UsageAnswer {
    let query: UsageQuery = match serde_json::from_slice(payload) {
        Ok(q) => q,
        Err(e) => {
            return UsageAnswer::Err {
                error: format!("invalid usage query: {e}"),
            };
        }
    };
    match usage(ledger, &query).await {
        Ok(reply) => UsageAnswer::Ok(reply),
        Err(e) => {
            if matches!(e, QueryError::Billing(_)) {
                tracing::error!(error = %e, ?query, "usage query failed");
            }
            UsageAnswer::Err {
                error: e.to_string(),
            }
        }
    }
}

/// The JSON [`answer`] to one request payload, as [`crate::serve_queries`] sends it: an answer
/// larger than `max_payload` bytes (0: no limit) is replaced by an error saying so.
pub(crate) async fn reply(ledger: &Ledger, payload: &[u8], max_payload: usize) -> Vec<u8> {
    encode(&answer(ledger, payload).await, max_payload)
}

/// JSON of `answer`, or of an error answer when it would exceed `max_payload` bytes.
fn encode(answer: &UsageAnswer, max_payload: usize) -> Vec<u8> {
    let error = |message: String| {
        let e = UsageAnswer::Err { error: message };
        serde_json::to_vec(&e).unwrap_or_else(|_| b"{\"error\":\"encoding failed\"}".to_vec())
    };
    match serde_json::to_vec(answer) {
        // Leave room for the protocol's headers.
        Ok(body) if max_payload == 0 || body.len() + 1024 <= max_payload => body,
        Ok(body) => {
            let rows = match answer {
                UsageAnswer::Ok(r) => r.rows.len(),
                UsageAnswer::Err { .. } => 0,
            };
            error(format!(
                "the answer has {rows} rows ({} bytes), more than NATS carries ({max_payload} \
                 bytes); narrow the range or group by fewer dimensions",
                body.len()
            ))
        }
        Err(e) => error(format!("encoding the answer failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rust_decimal::Decimal;
    use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind};

    fn ev(id: u128, kind: UsageKind, ts: u64, tenant: &str, target: &str) -> UsageEvent {
        UsageEvent {
            attempt: u32::from(kind == UsageKind::Upstream),
            tenant: Some(tenant.into()),
            key_id: Some(format!("{tenant}-key")),
            target: Some(target.into()),
            upstream_model: Some("u".into()),
            usage: Usage {
                prompt_tokens: 10,
                cached_tokens: 4,
                cache_write_tokens: 0,
                completion_tokens: 5,
                reasoning_tokens: 1,
                ..Default::default()
            },
            latency_ms: 1,
            ..UsageEvent::new(uuid::Uuid::from_u128(id), kind, ts, "m")
        }
    }

    fn rows(events: &[UsageEvent]) -> Vec<RequestRows> {
        RequestRows::group(
            events
                .iter()
                .map(|e| LedgerRow::from_event(e, Some(Decimal::new(1, 2)))),
        )
    }

    fn query(group_by: Vec<GroupBy>) -> UsageQuery {
        UsageQuery {
            from_ms: 0,
            to_ms: u64::MAX,
            group_by,
            tenant: None,
            key_id: None,
            providers: BTreeMap::from([("t1".to_owned(), "openai".to_owned())]),
        }
    }

    #[test]
    fn groups_filters_and_labels() {
        let hour = 3_600_000;
        let events = [
            ev(1, UsageKind::Charge, 2 * hour + 5, "a", "t1"),
            ev(1, UsageKind::Upstream, 2 * hour, "a", "t1"),
            ev(2, UsageKind::Charge, DAY_MS + 1, "b", "t2"),
        ];
        let reqs = rows(&events);
        let r = aggregate(
            &reqs,
            &query(vec![GroupBy::Provider, GroupBy::Hour, GroupBy::Key]),
        );
        let groups: Vec<Vec<&str>> = r
            .rows
            .iter()
            .map(|r| r.group.values().map(String::as_str).collect())
            .collect();
        // Rows sort by the values in group_by order (provider, hour, key); `group` is a map, so
        // its values come in key order: hour, key, provider.
        assert_eq!(
            groups,
            vec![
                vec!["1970-01-02T00", "b-key", UNKNOWN_PROVIDER],
                vec!["1970-01-01T02", "a-key", "openai"],
            ]
        );
        let a = &r.rows[1];
        assert_eq!(a.requests, 1);
        assert_eq!(a.cost_usd, Decimal::new(1, 2));
        assert_eq!(a.charge_usd, Decimal::new(1, 2));
        assert_eq!((a.input_tokens, a.cached_input_tokens), (6, 4));
        assert_eq!((a.output_tokens, a.reasoning_tokens), (4, 1));
        assert_eq!(r.totals.requests, 2);
        assert_eq!(r.totals.charge_usd, Decimal::new(2, 2));
        assert!(r.totals.group.is_empty());

        let mut q = query(vec![]);
        q.tenant = Some("b".into());
        let r = aggregate(&reqs, &q);
        assert_eq!(r.rows.len(), 1);
        assert_eq!(r.rows[0], r.totals);
        assert_eq!(r.totals.requests, 1);
        assert_eq!(r.totals.cost_usd, Decimal::ZERO);
    }

    #[test]
    fn invalid_queries_and_oversized_answers() {
        let mut q = query(vec![GroupBy::Day, GroupBy::Day]);
        assert!(matches!(validate(&q), Err(QueryError::Invalid(m)) if m.contains("`day` twice")));
        q.group_by = vec![];
        q.from_ms = 2;
        q.to_ms = 1;
        assert!(validate(&q).is_err());
        let big = UsageAnswer::Ok(UsageReply {
            rows: vec![UsageRow::default(); 100],
            totals: UsageRow::default(),
        });
        let body = encode(&big, 2048);
        let back: UsageAnswer = serde_json::from_slice(&body).unwrap();
        assert!(
            matches!(back, UsageAnswer::Err { ref error } if error.contains("100 rows")),
            "{back:?}"
        );
        assert_eq!(
            serde_json::from_slice::<UsageAnswer>(&encode(&big, 0)).unwrap(),
            big
        );
    }
}
