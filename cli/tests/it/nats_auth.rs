//! NATS authentication and authorization (issue 13, docs/security.md) against the embedded
//! server started the way `switchyard up` starts it: one user per identity with the permissions
//! of `switchyard::nats_auth::users`. What an identity may not do must fail at the server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use futures::{FutureExt as _, StreamExt as _};
use std::time::Duration;
use switchyard::nats_auth::{Credentials, Identity};
use switchyard_mock::DEFAULT_TEXT;
use switchyard_publish::sync_with_server;
use switchyard_schemas::usage::UsageKind;
use tokio::sync::mpsc;

const CONFIG_V1: &str = "targets:\n  - {id: mock, provider: openai, base_url: \"builtin:mock\", upstream_model: mock}\nmodels:\n  - {id: demo/mock, targets: [mock]}\n";
const CONFIG_NO_KEYS: &str = "targets: []\nmodels: []\n";

/// The embedded server with `up`'s users, and their passwords.
fn server() -> (switchyard_natsd::NatsServer, Credentials) {
    let creds = Credentials::generate();
    let users = switchyard::nats_auth::users(&creds, "sy");
    (
        switchyard_natsd::NatsServer::start_temp_with_users(&users).unwrap(),
        creds,
    )
}

/// Connects as `id` and returns the client with a channel of the server's error messages
/// (permission violations arrive there, e.g. `Permissions Violation for Publish to "x"`).
async fn connect_watched(
    url: &str,
    creds: &Credentials,
    id: Identity,
) -> (async_nats::Client, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let client = switchyard::nats::options(id.name(), &creds.config_for(id))
        .await
        .unwrap()
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let async_nats::Event::ServerError(async_nats::ServerError::Other(e)) = event {
                    let _ = tx.send(e);
                }
            }
        })
        .connect(url)
        .await
        .unwrap();
    (client, rx)
}

/// The next server error, waiting up to 5 s.
async fn next_error(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("no server error within 5 s")
        .unwrap()
}

/// A worker's client subscribed to every request subject (`sy.req.>`), the subscription in place
/// on the server: the client and the subscription.
async fn worker_on_requests(
    url: &str,
    creds: &Credentials,
) -> (async_nats::Client, async_nats::Subscriber) {
    let worker = connect_as(url, Some(creds), Identity::Worker).await;
    let requests = worker.subscribe("sy.req.>").await.unwrap();
    assert!(sync_with_server(&worker).await);
    (worker, requests)
}

/// Publishes `payload` on a chat request subject (`sy.req.chat.openai`) as `client`.
async fn publish_request(client: &async_nats::Client, payload: &'static str) {
    client
        .publish("sy.req.chat.openai", payload.into())
        .await
        .unwrap();
}

/// The payload of the next message on `sub`, waiting up to 5 s.
async fn next_payload(sub: &mut async_nats::Subscriber) -> Vec<u8> {
    tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .unwrap()
        .unwrap()
        .payload
        .to_vec()
}

/// The live config's revision and text, read by `client`.
async fn config_entry(client: &async_nats::Client) -> (u64, String) {
    let kv = switchyard::reload::bucket(client).await.unwrap();
    let entry = kv.entry(switchyard::reload::KEY).await.unwrap().unwrap();
    (
        entry.revision,
        String::from_utf8_lossy(&entry.value).into_owned(),
    )
}

#[tokio::test]
async fn a_client_without_or_with_wrong_credentials_cannot_connect() {
    let (nats, creds) = server();
    let err = async_nats::connect(nats.url()).await.unwrap_err();
    assert_eq!(
        err.kind(),
        async_nats::ConnectErrorKind::AuthorizationViolation
    );
    let mut wrong = creds.config_for(Identity::Worker);
    wrong.password = Some(switchyard_schemas::Secret::new("guess"));
    let err = switchyard::nats::connect(&nats.url(), "intruder", &wrong)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "connecting to NATS at {}: authorization violation: nats: authorization violation",
            nats.url()
        )
    );
    // The right password connects.
    switchyard::nats::connect(&nats.url(), "worker", &creds.config_for(Identity::Worker))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_worker_cannot_write_the_config_bucket_or_publish_requests() {
    let (nats, creds) = server();
    let admin = connect_as(&nats.url(), Some(&creds), Identity::Admin).await;
    let v1 = switchyard::reload::push(&admin, CONFIG_V1).await.unwrap();

    let (worker, mut errors) = connect_watched(&nats.url(), &creds, Identity::Worker).await;
    // `switchyard config push` with a worker's credentials: the put is refused by the server.
    let pushed = switchyard::reload::push(&worker, CONFIG_NO_KEYS).await;
    assert!(pushed.is_err(), "{pushed:?}");
    assert_eq!(
        next_error(&mut errors).await,
        "Permissions Violation for Publish to \"$KV.SY_CONFIG.gateway\""
    );
    assert_eq!(config_entry(&admin).await, (v1, CONFIG_V1.to_owned()));
    // Nor can it delete or recreate the bucket's stream.
    let js = async_nats::jetstream::new(worker.clone());
    assert!(js.delete_stream("KV_SY_CONFIG").await.is_err());
    assert_eq!(
        next_error(&mut errors).await,
        "Permissions Violation for Publish to \"$JS.API.STREAM.DELETE.KV_SY_CONFIG\""
    );

    // A worker's request never reaches the (other) workers subscribed to requests.
    let (_listener, mut requests) = worker_on_requests(&nats.url(), &creds).await;
    publish_request(&worker, "forged").await;
    assert!(sync_with_server(&worker).await);
    assert_eq!(
        next_error(&mut errors).await,
        "Permissions Violation for Publish to \"sy.req.chat.openai\""
    );
    let ingress = connect_as(&nats.url(), Some(&creds), Identity::Ingress).await;
    publish_request(&ingress, "genuine").await;
    assert_eq!(next_payload(&mut requests).await, b"genuine");
}

#[tokio::test]
async fn ingress_cannot_subscribe_to_requests_and_only_admin_writes_config() {
    let (nats, creds) = server();
    let (ingress, mut errors) = connect_watched(&nats.url(), &creds, Identity::Ingress).await;
    let mut snooped = ingress.subscribe("sy.req.>").await.unwrap();
    assert_eq!(
        next_error(&mut errors).await,
        "Permissions Violation for Subscription to \"sy.req.>\""
    );
    let (_worker, mut requests) = worker_on_requests(&nats.url(), &creds).await;
    publish_request(&ingress, "prompt").await;
    assert_eq!(next_payload(&mut requests).await, b"prompt");
    // The server handled the publish before the echo: a delivery to `snooped` would be here.
    assert!(sync_with_server(&ingress).await);
    assert!(!matches!(snooped.next().now_or_never(), Some(Some(_))));

    // Ingress (and cache, billing) may read the live config but not write it.
    for id in [Identity::Ingress, Identity::Cache, Identity::Billing] {
        let (client, mut errors) = connect_watched(&nats.url(), &creds, id).await;
        assert!(
            switchyard::reload::push(&client, CONFIG_NO_KEYS)
                .await
                .is_err()
        );
        // The bucket does not exist yet and may not be created by a service.
        assert_eq!(
            next_error(&mut errors).await,
            "Permissions Violation for Publish to \"$JS.API.STREAM.CREATE.KV_SY_CONFIG\"",
            "{id:?}"
        );
    }
    let admin = connect_as(&nats.url(), Some(&creds), Identity::Admin).await;
    let v = switchyard::reload::push(&admin, CONFIG_V1).await.unwrap();
    assert_eq!(config_entry(&ingress).await, (v, CONFIG_V1.to_owned()));
}

/// The whole pipeline with each component on its own identity: chat (non-streaming and
/// streaming), embeddings, usage in the ledger, the usage query, stored responses and files.
#[tokio::test]
async fn the_pipeline_works_with_each_service_on_its_own_identity() {
    // `demo/limited` takes RPM tokens from the workers' SY_LIMITS bucket.
    let config = test_config(serde_json::json!({
        "targets": [
            {"id": "mock", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "mock"},
            {"id": "limited", "provider": "openai", "base_url": "builtin:mock",
             "upstream_model": "mock", "limits": {"rpm": 100}}
        ],
        "models": [
            {"id": "demo/mock", "targets": ["mock"]},
            {"id": "demo/limited", "targets": ["limited"]}
        ]
    }));
    let gw = start(Options {
        config,
        billing: true,
        auth: true,
        ..Options::default()
    })
    .await;
    let (status, headers, body) = post_json(&gw.base, &chat("demo/mock", "hello", false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], DEFAULT_TEXT);
    let id: uuid::Uuid = headers["x-request-id"].to_str().unwrap().parse().unwrap();
    let rows = ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await;
    let mut kinds: Vec<UsageKind> = rows.iter().map(|r| r.kind).collect();
    kinds.sort_by_key(|k| format!("{k:?}"));
    assert_eq!(kinds, vec![UsageKind::Charge, UsageKind::Upstream]);
    for r in &rows {
        assert_eq!(r.usage.prompt_tokens, 1);
        assert_eq!(r.usage.completion_tokens, 13);
    }

    let (status, _, body) = post_json(&gw.base, &chat("demo/limited", "hello", false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], DEFAULT_TEXT);
    let limits = async_nats::jetstream::new(gw.nats_as(Identity::Worker).await)
        .get_key_value(switchyard_schemas::subjects::LIMITS_BUCKET)
        .await
        .unwrap();
    assert!(limits.get("limited.rpm").await.unwrap().is_some());

    let sse = post_sse(&gw.base, &chat("demo/mock", "hello", true)).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.content(), DEFAULT_TEXT);
    assert_eq!(sse.done_count(), 1);

    let http = reqwest::Client::new();
    let v = json_ok(
        http.post(format!("{}/v1/embeddings", gw.base))
            .json(&serde_json::json!({"model": "demo/mock", "input": "hi"})),
    )
    .await;
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["object"], "embedding");

    // The usage query goes ingress → billing and back.
    let usage: serde_json::Value = eventually(Duration::from_secs(10), || {
        let http = http.clone();
        let url = format!("{}/v1/usage", gw.base);
        async move {
            let v: serde_json::Value = http.get(url).send().await.ok()?.json().await.ok()?;
            (v["totals"]["requests"].as_u64()? >= 4).then_some(v)
        }
    })
    .await;
    assert_eq!(usage["object"], "usage");

    // Stored responses (SY_RESPONSES) and files (the SY_FILES object store).
    let created = json_ok(
        http.post(format!("{}/v1/responses", gw.base))
            .json(&serde_json::json!({"model": "demo/mock", "input": "hi"})),
    )
    .await;
    let rid = created["id"].as_str().unwrap();
    let url = format!("{}/v1/responses/{rid}", gw.base);
    let (_, fetched) = crate::common::call(reqwest::Method::GET, url, None, None).await;
    assert_eq!(fetched["id"], rid);
    assert_eq!(fetched["status"], "completed");
    let line = serde_json::json!({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "demo/mock", "messages": [{"role": "user", "content": "hi"}]}});
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::bytes(format!("{line}\n").into_bytes()).file_name("a.jsonl"),
        );
    let file = json_ok(http.post(format!("{}/v1/files", gw.base)).multipart(form)).await;
    assert_eq!(file["status"], "processed");
    let batch = json_ok(http.post(format!("{}/v1/batches", gw.base)).json(
        &serde_json::json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}),
    ))
    .await;
    let bid = batch["id"].as_str().unwrap().to_owned();
    let done: serde_json::Value = eventually(Duration::from_secs(20), || {
        let (http, url) = (http.clone(), format!("{}/v1/batches/{bid}", gw.base));
        async move {
            let v: serde_json::Value = http.get(url).send().await.ok()?.json().await.ok()?;
            (v["status"] == "completed").then_some(v)
        }
    })
    .await;
    assert_eq!(done["request_counts"]["completed"], 1);
    // Deleting a file purges its chunks from the object store.
    let deleted = json_ok(http.delete(format!(
        "{}/v1/files/{}",
        gw.base,
        file["id"].as_str().unwrap()
    )))
    .await;
    assert_eq!(deleted["deleted"], true);
}

/// The answer cache on its own identity: a repeated question is a hit and skips the upstream.
#[tokio::test]
async fn the_cache_works_on_its_own_identity() {
    let gw = start(Options {
        config: test_config(serde_json::json!({
            "models": [{"id": "demo/mock", "targets": ["mock"], "cache": {"threshold": 0.8}}]
        })),
        cache: true,
        auth: true,
        ..Options::default()
    })
    .await;
    let body = chat("demo/mock", "How do I turn on dark mode?", false);
    let ask = || async {
        let resp = post_keyless(&gw.base, &body).await;
        assert_eq!(resp.status(), 200);
        let outcome = resp.headers()["x-switchyard-cache"]
            .to_str()
            .unwrap()
            .to_owned();
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], DEFAULT_TEXT);
        outcome
    };
    assert_eq!(ask().await, "miss");
    // The store is fire-and-forget: wait until it is served.
    eventually(Duration::from_secs(10), || async {
        (ask().await == "hit").then_some(())
    })
    .await;
    let before = gw.mock.request_count();
    assert_eq!(ask().await, "hit");
    assert_eq!(gw.mock.request_count(), before);
}

/// A nats-server whose only user is an NKey: the seed (`nats.nkey_seed`) connects, another
/// key does not; a missing `.creds` file is named in the error.
#[tokio::test]
async fn nkey_seed_connects_and_a_missing_creds_file_is_named() {
    use switchyard_schemas::Secret;
    use switchyard_schemas::nats_config::NatsConfig;
    let user = nkeys::KeyPair::new_user();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nkey.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{ users: [ {{ nkey: {} }} ] }}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let port = switchyard_natsd::free_port().unwrap();
    let mut server = std::process::Command::new(switchyard_natsd::find_binary().unwrap())
        .arg("-c")
        .arg(&conf)
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
    })
    .await;
    let url = format!("nats://127.0.0.1:{port}");
    let with_seed = |seed: String| NatsConfig {
        nkey_seed: Some(Secret::new(seed)),
        ..Default::default()
    };
    let client = switchyard::nats::connect(&url, "nkey-user", &with_seed(user.seed().unwrap()))
        .await
        .unwrap();
    assert!(sync_with_server(&client).await);
    let other = nkeys::KeyPair::new_user();
    let refused = switchyard::nats::connect(&url, "other", &with_seed(other.seed().unwrap())).await;
    assert_eq!(
        refused.unwrap_err().to_string(),
        format!(
            "connecting to NATS at {url}: authorization violation: nats: authorization violation"
        )
    );
    let missing = NatsConfig {
        credentials_file: Some("/nonexistent/switchyard.creds".into()),
        ..Default::default()
    };
    let err = switchyard::nats::connect(&url, "creds", &missing)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("NATS credentials file /nonexistent/switchyard.creds: "),
        "{err}"
    );
    server.kill().unwrap();
    server.wait().unwrap();
}
