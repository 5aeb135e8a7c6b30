//! Tenant isolation (issue 13, acceptance): tenant A — its client key, and its tenant-scoped
//! admin key — gets 404 for everything of tenant B: B's keys (get, change, revoke, rotate,
//! delete) and tenant, B's usage (`/v1/usage` and `/admin/usage`), B's files (metadata,
//! content, delete), OpenAI batches (retrieve, cancel, create from B's file), Anthropic message
//! batches (retrieve, results, cancel, delete) and stored responses (retrieve, `input_items`,
//! delete; a `previous_response_id` naming B's is 400 `previous_response_not_found`). Exact
//! statuses and bodies; afterwards B's things are all still there.

use crate::batch::{call, post_batch, upload};
use crate::common::{eventually, get_as, start_billed};
use reqwest::Method as M;
use serde_json::{Value, json};
use std::time::Duration;
use switchyard_schemas::tenancy::sha256_hex;

const KEY_A: &str = "sk-iso-tenant-a-0123456789abcdef";
const KEY_B: &str = "sk-iso-tenant-b-0123456789abcdef";
const ADMIN_A: &str = "sk-iso-admin-a-0123456789abcdef";

fn openai_err(message: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "param": param,
                     "code": code}})
}

fn anthropic_404(message: &str) -> Value {
    json!({"type": "error", "error": {"type": "not_found_error", "message": message}})
}

/// `method url` with `key` as `x-api-key` (the Anthropic SDK's header); status and JSON body.
async fn call_x(method: M, url: String, key: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .request(method, url)
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// Tenant B's usage totals as B sees them, once billing has `n` requests of B.
async fn usage_requests(base: &str, key: &str, n: u64) -> Value {
    eventually(Duration::from_secs(20), || async move {
        let (s, u) = get_as(format!("{base}/v1/usage"), key).await;
        (s == 200 && u["totals"]["requests"] == n).then_some(u)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_a_gets_404_for_every_resource_of_tenant_b() {
    let text = json!({
        "targets": [
            {"id": "mock", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "mock"},
            {"id": "claude", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-test"}
        ],
        "models": [
            {"id": "demo/mock", "targets": ["mock"]},
            {"id": "demo/claude", "targets": ["claude"]}
        ],
        "tenants": [{"id": "a"}, {"id": "b"}],
        "keys": [
            {"id": "ka", "tenant": "a", "key_sha256": sha256_hex(KEY_A)},
            {"id": "kb", "tenant": "b", "key_sha256": sha256_hex(KEY_B)}
        ],
        "admin": {"keys": [{"id": "admin-a", "tenant": "a", "key_sha256": sha256_hex(ADMIN_A)}]},
        "timeouts": {"first_frame_ms": 2000, "worker_silence_ms": 3000, "heartbeat_ms": 200}
    })
    .to_string();
    let cfg = switchyard_schemas::config_text::parse_valid("test", &text, |_| None).unwrap();
    let gw = start_billed(cfg).await;
    // The live config (admin writes are compare-and-set on it), watched by the ingress.
    let admin = async_nats::connect(gw.nats.url()).await.unwrap();
    let version = switchyard::reload::push(&admin, &text).await.unwrap();
    crate::admin::watch(&gw, &gw.config, &gw.shutdown).await;
    let h = gw.config.clone();
    eventually(Duration::from_secs(5), move || {
        let v = h.version();
        async move { (v >= version).then_some(()) }
    })
    .await;
    let b = gw.base.clone();

    // Tenant B's resources: a chat (usage), a stored response, a file, two batches.
    let (s, r) = call(
        M::POST,
        format!("{b}/v1/chat/completions"),
        KEY_B,
        Some(json!({"model": "demo/mock", "messages": [{"role": "user", "content": "hi"}]})),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let (s, resp) = call(
        M::POST,
        format!("{b}/v1/responses"),
        KEY_B,
        Some(json!({"model": "demo/mock", "input": "secret plans of b"})),
    )
    .await;
    assert_eq!(s, 200, "{resp}");
    let rid = resp["id"].as_str().unwrap().to_owned();
    let item = json!({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "demo/mock", "messages": [{"role": "user", "content": "#mock ttft_ms=3000\nslow"}]}});
    let file = upload(&b, KEY_B, &item.to_string()).await;
    let fid = file["id"].as_str().unwrap().to_owned();
    let (s, batch) = post_batch(&b, KEY_B, &fid).await;
    assert_eq!(s, 200, "{batch}");
    let bid = batch["id"].as_str().unwrap().to_owned();
    let (s, mb) = call(
        M::POST,
        format!("{b}/v1/messages/batches"),
        KEY_B,
        Some(json!({"requests": [{"custom_id": "one", "params": {"model": "demo/claude",
            "max_tokens": 16, "messages": [{"role": "user", "content": "#mock ttft_ms=3000\nslow"}]}}]})),
    )
    .await;
    assert_eq!(s, 200, "{mb}");
    let mbid = mb["id"].as_str().unwrap().to_owned();
    // B's chat and response are in the ledger (the batch items are still running).
    usage_requests(&b, KEY_B, 2).await;

    // Keys and tenant, through A's tenant-scoped admin key.
    let no_key = openai_err("No API key with id `kb`.", Some("id"), Some("not_found"));
    for (method, path, body) in [
        (M::GET, "/admin/keys/kb", None),
        (M::PATCH, "/admin/keys/kb", Some(json!({"enabled": false}))),
        (M::POST, "/admin/keys/kb/revoke", None),
        (M::POST, "/admin/keys/kb/rotate", None),
        (M::DELETE, "/admin/keys/kb", None),
    ] {
        let (s, e) = call(method.clone(), format!("{b}{path}"), ADMIN_A, body).await;
        assert_eq!((s, &e), (404, &no_key), "{method} {path}");
    }
    let (s, e) = get_as(format!("{b}/admin/tenants/b"), ADMIN_A).await;
    assert_eq!(s, 404, "{e}");
    assert_eq!(e["error"]["code"], "not_found");
    assert_eq!(e["error"]["param"], "id");
    let (s, list) = get_as(format!("{b}/admin/keys"), ADMIN_A).await;
    assert_eq!(s, 200);
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ka"], "A's admin sees A's key only");

    // Usage: naming tenant B is 404 on both routes; B's key id narrows A's own (none).
    let no_tenant = openai_err(
        "No tenant `b` visible to this key (it reads tenant `a`).",
        Some("tenant"),
        Some("not_found"),
    );
    for (key, path) in [
        (KEY_A, "/v1/usage?tenant=b"),
        (ADMIN_A, "/admin/usage?tenant=b"),
    ] {
        let (s, e) = get_as(format!("{b}{path}"), key).await;
        assert_eq!((s, &e), (404, &no_tenant), "{path}");
    }
    for (key, path) in [(KEY_A, "/v1/usage?key=kb"), (ADMIN_A, "/admin/usage")] {
        let (s, u) = get_as(format!("{b}{path}"), key).await;
        assert_eq!(s, 200, "{path}: {u}");
        assert_eq!(u["totals"]["requests"], 0, "{path}: {u}");
        assert_eq!(u["data"], json!([]), "{path}: {u}");
    }

    // Files and OpenAI batches.
    let no_file = openai_err(&format!("No such file: '{fid}'"), Some("id"), None);
    let no_batch = openai_err(&format!("No such batch: '{bid}'"), Some("id"), None);
    for (method, path, want) in [
        (M::GET, format!("/v1/files/{fid}"), &no_file),
        (M::GET, format!("/v1/files/{fid}/content"), &no_file),
        (M::DELETE, format!("/v1/files/{fid}"), &no_file),
        (M::GET, format!("/v1/batches/{bid}"), &no_batch),
        (M::POST, format!("/v1/batches/{bid}/cancel"), &no_batch),
    ] {
        let (s, e) = call(method.clone(), format!("{b}{path}"), KEY_A, None).await;
        assert_eq!((s, &e), (404, want), "{method} {path}");
    }
    let (s, e) = post_batch(&b, KEY_A, &fid).await;
    assert_eq!(s, 404, "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    for path in ["/v1/files", "/v1/batches"] {
        let (s, l) = get_as(format!("{b}{path}"), KEY_A).await;
        assert_eq!((s, &l["data"]), (200, &json!([])), "{path}");
    }

    // Anthropic message batches, in Anthropic's envelope.
    let no_mb = anthropic_404(&format!("No such message batch: '{mbid}'"));
    for (method, path) in [
        (M::GET, format!("/v1/messages/batches/{mbid}")),
        (M::GET, format!("/v1/messages/batches/{mbid}/results")),
        (M::POST, format!("/v1/messages/batches/{mbid}/cancel")),
        (M::DELETE, format!("/v1/messages/batches/{mbid}")),
    ] {
        let (s, e) = call_x(method.clone(), format!("{b}{path}"), KEY_A).await;
        assert_eq!((s, &e), (404, &no_mb), "{method} {path}");
    }
    let (s, l) = call_x(M::GET, format!("{b}/v1/messages/batches"), KEY_A).await;
    assert_eq!((s, &l["data"]), (200, &json!([])));

    // Stored responses.
    let no_resp = openai_err(&format!("No response found with id '{rid}'."), None, None);
    for (method, path) in [
        (M::GET, format!("/v1/responses/{rid}")),
        (M::GET, format!("/v1/responses/{rid}/input_items")),
        (M::DELETE, format!("/v1/responses/{rid}")),
    ] {
        let (s, e) = call(method.clone(), format!("{b}{path}"), KEY_A, None).await;
        assert_eq!((s, &e), (404, &no_resp), "{method} {path}");
    }
    let (s, e) = call(
        M::POST,
        format!("{b}/v1/responses"),
        KEY_A,
        Some(json!({"model": "demo/mock", "input": "go on", "previous_response_id": rid})),
    )
    .await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["code"], "previous_response_not_found");
    assert!(!e.to_string().contains("secret plans"), "{e}");

    // Nothing of B changed: its key, response, file and batches are all still there.
    for (path, want) in [
        (format!("/v1/responses/{rid}"), "response"),
        (format!("/v1/responses/{rid}/input_items"), "list"),
        (format!("/v1/files/{fid}"), "file"),
        (format!("/v1/batches/{bid}"), "batch"),
    ] {
        let (s, v) = get_as(format!("{b}{path}"), KEY_B).await;
        assert_eq!((s, v["object"].as_str()), (200, Some(want)), "{path}: {v}");
    }
    let (s, v) = call_x(M::GET, format!("{b}/v1/messages/batches/{mbid}"), KEY_B).await;
    assert_eq!(
        (s, v["processing_status"].as_str()),
        (200, Some("in_progress"))
    );
    let (s, v) = get_as(format!("{b}/v1/batches/{bid}"), KEY_B).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("in_progress")), "{v}");
}
