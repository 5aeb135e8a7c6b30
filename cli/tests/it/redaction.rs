//! Provider credentials never leak through upstream errors (issue 13, "Secrets"): an upstream
//! 401 whose body echoes the key it was sent reaches the client as a 502 with a short reason, and
//! other upstream error text has anything shaped like a key redacted — in the client's body and
//! in the ledger row.

use crate::common::{Options, eventually, percent_encode, post_json, start, test_config};
use serde_json::{Value, json};
use std::time::Duration;

const UPSTREAM_KEY: &str = "sk-upstream-0123456789abcdefSECRET";

/// A chat on `demo/keyed` whose upstream answers `status` with the error message `message`: the
/// gateway's status, headers and body.
async fn upstream_error(
    base: &str,
    status: u16,
    message: &str,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let directive = format!(
        "#mock status={status} error_message={}\nhi",
        percent_encode(message)
    );
    post_json(
        base,
        &json!({"model": "demo/keyed", "messages": [{"role": "user", "content": directive}]}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_never_carry_the_credential() {
    let gw = start(Options {
        config: test_config(json!({
            "targets": [{"id": "keyed", "provider": "openai", "base_url": "builtin:mock",
                         "upstream_model": "mock", "api_key": UPSTREAM_KEY}],
            "models": [{"id": "demo/keyed", "targets": ["keyed"]}]
        })),
        billing: true,
        ..Options::default()
    })
    .await;
    // 401 echoing the Authorization header, as OpenAI's "Incorrect API key provided" does.
    let echo = format!("Incorrect API key provided: Bearer {UPSTREAM_KEY}");
    let (status, _, body) = upstream_error(&gw.base, 401, &echo).await;
    assert_eq!(status, 502, "{body}");
    let text = body.to_string();
    assert!(!text.contains("0123456789abcdef"), "{text}");
    assert!(!text.contains("Incorrect API key"), "{text}");
    assert_eq!(
        body["error"]["message"],
        "upstream returned HTTP 401: the upstream refused the target's credentials (check the key configured for it)"
    );
    // A 400 whose message quotes a key: redacted, the rest kept.
    let echo = format!("Invalid value for api_key={UPSTREAM_KEY}");
    let (status, headers, body) = upstream_error(&gw.base, 400, &echo).await;
    assert_eq!(status, 400, "{body}");
    // A failed admitted request still names its id, which finds its ledger rows.
    let id: uuid::Uuid = headers["x-request-id"].to_str().unwrap().parse().unwrap();
    assert_eq!(
        crate::common::ledger_rows(gw.ledger.as_ref().unwrap(), id, 2)
            .await
            .len(),
        2
    );
    assert_eq!(
        body["error"]["message"],
        "upstream returned HTTP 400: Invalid value for api_key=[redacted]"
    );
    // The ledger holds no trace of it either (the rows' raw JSON included): 2 requests × 2 rows.
    let ledger = gw.ledger.clone().unwrap();
    let raw: Vec<String> = eventually(Duration::from_secs(10), || {
        let ledger = ledger.clone();
        async move {
            let rows: Vec<(String,)> = sqlx::query_as("SELECT raw FROM usage_events")
                .fetch_all(ledger.pool())
                .await
                .unwrap();
            (rows.len() == 4).then(|| rows.into_iter().map(|r| r.0).collect())
        }
    })
    .await;
    assert!(
        raw.iter().all(|r| !r.contains("0123456789abcdef")),
        "{raw:?}"
    );
}
