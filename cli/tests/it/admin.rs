//! The admin API (`/admin/…`) against a real nats-server with two ingress replicas, each with its
//! own live-config watch: exact statuses and bodies of auth failures, keys created on one replica
//! working at once on the other, revocations reaching the other within 1 s (1,000 concurrent
//! requests through both before and after), the key never stored, tenant-scoped admin keys, the
//! config routes, and a replica that loses its watch failing closed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use switchyard_schemas::config::{ConfigHandle, GatewayConfig};
use switchyard_schemas::tenancy::sha256_hex;
use tokio_util::sync::CancellationToken;

pub(crate) const ADMIN_KEY: &str = "sk-admin-test-global-0123456789";
pub(crate) const TEAM_A_ADMIN: &str = "sk-admin-test-team-a-0123456789";
pub(crate) const CLIENT_KEY: &str = "sk-client-test-b-0123456789abc";

/// The config as JSON text (YAML is a superset) and as loaded; `extra` is merged at the top.
pub(crate) fn config(extra: Value) -> (String, GatewayConfig) {
    let mut v = json!({
        "targets": [{"id": "mock", "provider": "openai", "base_url": "builtin:mock",
            "upstream_model": "mock"}],
        "models": [{"id": "demo/mock", "targets": ["mock"]}],
        "tenants": [{"id": "team-a"}, {"id": "team-b"}],
        "keys": [{"id": "b-1", "tenant": "team-b", "key_sha256": sha256_hex(CLIENT_KEY)}],
        "admin": {"keys": [
            {"id": "ops", "key_sha256": sha256_hex(ADMIN_KEY)},
            {"id": "team-a-admin", "key_sha256": sha256_hex(TEAM_A_ADMIN), "tenant": "team-a"}
        ]},
        "timeouts": {"first_frame_ms": 2000, "worker_silence_ms": 3000, "heartbeat_ms": 200}
    });
    for (k, val) in extra.as_object().unwrap() {
        v[k] = val.clone();
    }
    let text = serde_json::to_string_pretty(&v).unwrap();
    let c = switchyard_schemas::config_text::parse_valid("test", &text, |_| None).unwrap();
    (text, c)
}

/// A watch of the live config on `handle` until `stop`.
pub(crate) async fn watch(gw: &Gateway, handle: &ConfigHandle, stop: &CancellationToken) {
    let client = async_nats::connect(gw.nats.url()).await.unwrap();
    tokio::spawn(switchyard::reload::watch_kv(
        client,
        handle.clone(),
        stop.clone(),
        std::sync::Arc::new(|_| Ok(())),
    ));
}

/// Two replicas: `gw.base` (on `gw.config`) and a second one on its own handle, both watching
/// the live config, which holds `text`.
pub(crate) async fn two_replicas(text: &str, c: GatewayConfig) -> (Gateway, String, ConfigHandle) {
    let gw = start_config(c.clone()).await;
    let admin = async_nats::connect(gw.nats.url()).await.unwrap();
    let version = switchyard::reload::push(&admin, text).await.unwrap();
    let b_config = ConfigHandle::new(c);
    let stop = gw.shutdown.clone();
    watch(&gw, &gw.config, &stop).await;
    watch(&gw, &b_config, &stop).await;
    let (b, _) = spawn_ingress_with(&gw, b_config.clone()).await;
    for h in [&gw.config, &b_config] {
        let h = h.clone();
        eventually(Duration::from_secs(5), move || {
            let v = h.version();
            async move { (v >= version).then_some(()) }
        })
        .await;
    }
    (gw, b, b_config)
}

/// The config text `yaml` sent to an admin config route with the global admin key: the status
/// and the JSON answer.
async fn send_config(method: reqwest::Method, url: String, yaml: String) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(ADMIN_KEY)
        .body(yaml)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn models_status(base: &str, key: &str) -> u16 {
    get_as(format!("{base}/v1/models"), key).await.0
}

/// Requests `GET /v1/models` with `key` on `base` until it answers `want`; the elapsed time.
/// Each try is a real request (the event waited on is the replica's answer), bounded by `limit`.
async fn until_status(base: &str, key: &str, want: u16, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if models_status(base, key).await == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "{base} did not answer {want} within {limit:?}"
        );
    }
}

/// The stored text of the live config.
async fn stored(gw: &Gateway) -> String {
    let c = async_nats::connect(gw.nats.url()).await.unwrap();
    let kv = switchyard::reload::bucket(&c).await.unwrap();
    let e = kv.entry(switchyard::reload::KEY).await.unwrap().unwrap();
    String::from_utf8(e.value.to_vec()).unwrap()
}

fn err(message: &str, kind: &str, param: Option<&str>, code: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

#[tokio::test]
async fn auth_failures_have_exact_statuses_and_bodies() {
    use reqwest::Method;
    let (text, c) = config(json!({}));
    let (gw, _b, _) = two_replicas(&text, c).await;
    let a = &gw.base;
    let (s, body) = call(Method::GET, format!("{a}/admin/keys"), None, None).await;
    assert_eq!(s, 401);
    assert_eq!(
        body,
        err(
            "The admin API needs an admin key: send it as `Authorization: Bearer <admin key>`.",
            "invalid_request_error",
            None,
            "missing_admin_key"
        )
    );
    let (s, body) = get_as(format!("{a}/admin/keys"), "sk-wrong-admin-key-123456").await;
    assert_eq!(s, 401);
    assert_eq!(
        body,
        err(
            "Incorrect admin key provided: sk-w…3456.",
            "invalid_request_error",
            None,
            "invalid_admin_key"
        )
    );
    // A client key never opens /admin, and an admin key is not a client key.
    let (s, body) = get_as(format!("{a}/admin/keys"), CLIENT_KEY).await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (401, Some("invalid_admin_key"))
    );
    assert_eq!(models_status(a, ADMIN_KEY).await, 401);
    assert_eq!(models_status(a, CLIENT_KEY).await, 200);

    let (s, body) = get_as(format!("{a}/admin/keys/nope"), ADMIN_KEY).await;
    assert_eq!(s, 404);
    assert_eq!(
        body,
        err(
            "No API key with id `nope`.",
            "invalid_request_error",
            Some("id"),
            "not_found"
        )
    );
    let (s, body) = post_as(
        format!("{a}/admin/keys"),
        ADMIN_KEY,
        json!({"tenant": "team-a", "expires": 5}),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        error_message(&body).contains("unknown field `expires`"),
        "{body}"
    );
    let (s, body) = post_as(
        format!("{a}/admin/keys"),
        ADMIN_KEY,
        json!({"tenant": "team a"}),
    )
    .await;
    assert_eq!((s, body["error"]["param"].as_str()), (400, Some("tenant")));
    let (s, body) = post_as(
        format!("{a}/admin/keys"),
        ADMIN_KEY,
        json!({"tenant": "team-a", "budget": {"daily_usd": -1}}),
    )
    .await;
    assert_eq!(
        (s, body["error"]["param"].as_str()),
        (400, Some("budget.daily_usd"))
    );
    let (s, body) = post_as(
        format!("{a}/admin/keys"),
        ADMIN_KEY,
        json!({"id": "b-1", "tenant": "team-b"}),
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (409, Some("key_exists"))
    );
    let (s, body) = get_as(format!("{a}/admin/nope"), ADMIN_KEY).await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );

    // Tenant isolation: team-a's admin key sees team-a only; team-b's key is 404 to it.
    let (s, body) = get_as(format!("{a}/admin/keys/b-1"), TEAM_A_ADMIN).await;
    assert_eq!(s, 404);
    assert_eq!(
        body,
        err(
            "No API key with id `b-1`.",
            "invalid_request_error",
            Some("id"),
            "not_found"
        )
    );
    for path in ["/admin/keys/b-1/revoke", "/admin/keys/b-1/rotate"] {
        let (s, _) = post_empty(format!("{a}{path}"), TEAM_A_ADMIN).await;
        assert_eq!(s, 404, "{path}");
    }
    let (s, _) = get_as(format!("{a}/admin/tenants/team-b"), TEAM_A_ADMIN).await;
    assert_eq!(s, 404);
    let (s, body) = get_as(format!("{a}/admin/keys"), TEAM_A_ADMIN).await;
    assert_eq!((s, body["data"].as_array().unwrap().len()), (200, 0));
    let (s, body) = post_as(
        format!("{a}/admin/keys"),
        TEAM_A_ADMIN,
        json!({"tenant": "team-b"}),
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (403, Some("permission_denied"))
    );
    for path in ["/admin/config", "/admin/health"] {
        let (s, body) = get_as(format!("{a}{path}"), TEAM_A_ADMIN).await;
        assert_eq!(
            (s, body["error"]["code"].as_str()),
            (403, Some("permission_denied")),
            "{path}"
        );
    }
    let (s, body) = get_as(format!("{a}/admin/tenants"), ADMIN_KEY).await;
    assert_eq!(s, 200);
    assert_eq!(
        body["data"],
        json!([{"object": "tenant", "id": "team-a", "keys": 0, "budget": {}},
               {"object": "tenant", "id": "team-b", "keys": 1, "budget": {}}])
    );
    // b-1 is untouched.
    let (_, body) = get_as(format!("{a}/admin/keys/b-1"), ADMIN_KEY).await;
    assert_eq!(body["status"], "active");
}

#[tokio::test]
async fn created_keys_work_at_once_everywhere_and_revocations_reach_every_replica() {
    use reqwest::Method;
    let (text, c) = config(json!({}));
    let (gw, b, _) = two_replicas(&text, c).await;
    let a = gw.base.clone();

    // Created on A by team-a's admin: works at once on B (and A).
    let (s, created) = post_as(
        format!("{a}/admin/keys"),
        TEAM_A_ADMIN,
        json!({"id": "a-1", "budget": {"daily_usd": 5}}),
    )
    .await;
    assert_eq!(s, 201, "{created}");
    let key = created["key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("sk-sy-") && key.len() == 46, "{key}");
    assert_eq!(created["tenant"], "team-a");
    assert_eq!(created["status"], "active");
    assert_eq!(created["budget"], json!({"daily_usd": "5"}));
    assert_eq!(models_status(&b, &key).await, 200);
    assert_eq!(models_status(&a, &key).await, 200);
    // Only the hash is stored.
    let kv_text = stored(&gw).await;
    assert!(!kv_text.contains(&key), "{kv_text}");
    assert!(!kv_text.contains(&key["sk-sy-".len()..]));
    assert!(kv_text.contains(&sha256_hex(&key)));
    let (_, got) = get_as(format!("{b}/admin/keys/a-1"), ADMIN_KEY).await;
    assert!(got.get("key").is_none(), "{got}");
    assert_eq!(got["id"], "a-1");

    // 1,000 concurrent requests through both replicas: all admitted.
    let burst = |key: String| {
        let (a, b) = (a.clone(), b.clone());
        async move {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..1000 {
                let base = if i % 2 == 0 { a.clone() } else { b.clone() };
                let key = key.clone();
                set.spawn(async move { models_status(&base, &key).await });
            }
            let mut counts = std::collections::BTreeMap::new();
            while let Some(s) = set.join_next().await {
                *counts.entry(s.unwrap()).or_insert(0) += 1;
            }
            counts
        }
    };
    assert_eq!(burst(key.clone()).await, [(200, 1000)].into());

    // Revoked on A: B refuses it within 1 s.
    let (s, revoked) = post_empty(format!("{a}/admin/keys/a-1/revoke"), ADMIN_KEY).await;
    assert_eq!((s, revoked["status"].as_str()), (200, Some("revoked")));
    let took = until_status(&b, &key, 401, Duration::from_secs(1)).await;
    eprintln!("revocation reached replica B in {took:?}");
    assert_eq!(models_status(&a, &key).await, 401);
    assert_eq!(burst(key.clone()).await, [(401, 1000)].into());
    let (_, body) = get_as(format!("{b}/v1/models"), &key).await;
    assert_eq!(
        body["error"]["message"],
        format!(
            "The API key {}…{} is disabled.",
            &key[..4],
            &key[key.len() - 4..]
        )
    );

    // Re-enabled, rotated: the old key stops at once, the new one works on both.
    let (s, _) = patch_as(
        format!("{a}/admin/keys/a-1"),
        ADMIN_KEY,
        json!({"enabled": true}),
    )
    .await;
    assert_eq!(s, 200);
    until_status(&b, &key, 200, Duration::from_secs(1)).await;
    let (s, rotated) = post_empty(format!("{b}/admin/keys/a-1/rotate"), ADMIN_KEY).await;
    assert_eq!(s, 200);
    let new_key = rotated["key"].as_str().unwrap().to_owned();
    assert_ne!(new_key, key);
    assert_eq!(models_status(&a, &new_key).await, 200);
    until_status(&a, &key, 401, Duration::from_secs(1)).await;
    assert!(!stored(&gw).await.contains(&new_key));

    // Expiry: a past expiry refuses the key on both with "expired".
    let past = switchyard_schemas::now_ms() / 1000 - 1;
    let (s, body) = patch_as(
        format!("{a}/admin/keys/a-1"),
        ADMIN_KEY,
        json!({"expires_at": past}),
    )
    .await;
    assert_eq!((s, body["status"].as_str()), (200, Some("expired")));
    until_status(&b, &new_key, 401, Duration::from_secs(1)).await;
    let (_, body) = get_as(format!("{b}/v1/models"), &new_key).await;
    assert!(error_message(&body).ends_with("has expired."), "{body}");

    // Deleted.
    let (s, body) = call(
        Method::DELETE,
        format!("{a}/admin/keys/a-1"),
        Some(ADMIN_KEY),
        None,
    )
    .await;
    assert_eq!((s, body["deleted"].as_bool()), (200, Some(true)));
    let (s, _) = get_as(format!("{b}/admin/keys/a-1"), ADMIN_KEY).await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn a_replica_that_cannot_confirm_its_config_fails_closed() {
    const OTHER: &str = "sk-client-test-b2-0123456789abc";
    let (text, c) = config(json!({"admin": {"keys": [
        {"id": "ops", "key_sha256": sha256_hex(ADMIN_KEY)}], "stale_after_ms": 300},
        "keys": [{"id": "b-1", "tenant": "team-b", "key_sha256": sha256_hex(CLIENT_KEY)},
                 {"id": "b-2", "tenant": "team-b", "key_sha256": sha256_hex(OTHER)}]}));
    let gw = start_config(c.clone()).await;
    let admin = async_nats::connect(gw.nats.url()).await.unwrap();
    switchyard::reload::push(&admin, &text).await.unwrap();
    let handle = ConfigHandle::new(c);
    let stop = CancellationToken::new();
    watch(&gw, &handle, &stop).await;
    let (b, _) = spawn_ingress_with(&gw, handle.clone()).await;
    until_status(&b, CLIENT_KEY, 200, Duration::from_secs(5)).await;
    // The watch stops (a broken watch): after stale_after_ms the replica refuses every key.
    stop.cancel();
    until_status(&b, CLIENT_KEY, 503, Duration::from_secs(3)).await;
    // Refused only once the last confirmation is older than stale_after_ms (300 ms). (Timing
    // from the cancel would be wrong: the last confirmation may be up to CONFIRM_EVERY before it.)
    let unconfirmed_for = handle.live().confirmation().at.elapsed();
    assert!(
        unconfirmed_for > Duration::from_millis(300),
        "{unconfirmed_for:?}"
    );
    let (s, body) = get_as(format!("{b}/v1/models"), CLIENT_KEY).await;
    assert_eq!(s, 503);
    assert_eq!(
        body,
        err(
            "This replica could not confirm its API key list is current; retry shortly.",
            "service_unavailable_error",
            None,
            "config_unconfirmed"
        )
    );
    // The replica that still confirms keeps serving.
    assert_eq!(models_status(&gw.base, CLIENT_KEY).await, 200);
    // A new watch confirms again: the replica serves again.
    let again = CancellationToken::new();
    watch(&gw, &handle, &again).await;
    until_status(&b, CLIENT_KEY, 200, Duration::from_secs(3)).await;

    // A stored revision this replica cannot load (an unset ${VAR}; written around push's
    // validation): the keys it changes are refused, the others still served.
    const NEW: &str = "sk-client-test-new-0123456789ab";
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["keys"][0]["enabled"] = json!(false);
    v["keys"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "new-1", "tenant": "team-a", "key_sha256": sha256_hex(NEW)}));
    v["targets"][0]["upstream_model"] = json!("${SY_TEST_NEVER_SET}");
    let kv = switchyard::reload::bucket(&admin).await.unwrap();
    kv.put(switchyard::reload::KEY, v.to_string().into())
        .await
        .unwrap();
    until_status(&b, CLIENT_KEY, 503, Duration::from_secs(1)).await;
    let (s, body) = get_as(format!("{b}/v1/models"), NEW).await;
    assert_eq!(s, 503);
    assert_eq!(
        body["error"]["message"],
        "This API key changed in a config revision this replica could not load yet."
    );
    assert_eq!(models_status(&b, OTHER).await, 200);
    again.cancel();
}

#[tokio::test]
async fn config_routes_show_redacted_validate_and_apply() {
    use reqwest::Method;
    let (text, c) = config(json!({}));
    // A literal provider key in the pushed text (no master key in this process: kept, warned).
    let text = text.replace(
        "\"upstream_model\": \"mock\"",
        "\"upstream_model\": \"mock\", \"api_key\": \"sk-literal-provider-0123456789\"",
    );
    let (gw, b, b_config) = two_replicas(&text, c).await;
    let a = gw.base.clone();
    let (s, shown) = get_as(format!("{a}/admin/config"), ADMIN_KEY).await;
    assert_eq!(s, 200);
    let yaml = shown["yaml"].as_str().unwrap();
    assert!(!yaml.contains("sk-literal-provider"), "{yaml}");
    assert!(yaml.contains("api_key: '[redacted]'"), "{yaml}");

    let mut bad: Value = serde_json::from_str(&text).unwrap();
    bad["models"][0]["targets"][0] = json!("nope");
    let bad = bad.to_string();
    let validate = format!("{a}/admin/config/validate");
    let (s, body) = send_config(reqwest::Method::POST, validate.clone(), bad.clone()).await;
    assert_eq!(s, 400);
    assert_eq!(body["error"]["param"], "models[0].targets[0]");
    assert!(error_message(&body).contains("unknown target `nope`"));

    let next = text.replace("demo/mock", "demo/renamed");
    let (s, body) = send_config(reqwest::Method::POST, validate.clone(), next.clone()).await;
    assert_eq!(s, 200);
    assert_eq!(body["valid"], true);
    assert!(
        body["warnings"][0]
            .as_str()
            .unwrap()
            .contains("targets[0].api_key is written literally")
    );
    let (s, body) = send_config(reqwest::Method::PUT, format!("{a}/admin/config"), next).await;
    assert_eq!(s, 200);
    let version = body["version"].as_u64().unwrap();
    assert_eq!(
        gw.config.version(),
        version,
        "the writing replica applied it before answering"
    );
    eventually(Duration::from_secs(1), || {
        let v = b_config.version();
        async move { (v >= version).then_some(()) }
    })
    .await;
    let resp = post_keyed(&b, CLIENT_KEY, &chat("demo/renamed", "hi", false)).await;
    assert_eq!(resp.status().as_u16(), 200);

    let (s, health) = get_as(format!("{a}/admin/health"), ADMIN_KEY).await;
    assert_eq!(s, 200);
    assert_eq!(health["data"][0]["target"], "mock");
    assert_eq!(health["data"][0]["state"], "healthy");
    assert_eq!(health["data"][0]["in_flight"], 0);

    // No cache service runs here: the purge says so.
    let (s, body) = post_as(
        format!("{a}/admin/cache/purge"),
        ADMIN_KEY,
        json!({"all": true}),
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (503, Some("admin_unavailable"))
    );
    let (s, body) = post_as(format!("{a}/admin/cache/purge"), ADMIN_KEY, json!({})).await;
    assert_eq!(s, 400, "{body}");

    // The OpenAPI document lists the admin routes.
    let (s, doc) = call(Method::GET, format!("{a}/openapi.json"), None, None).await;
    assert_eq!(s, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/admin/keys/{id}/revoke"]["post"].is_object());
}
