//! Tests of the config types and their validation.

#![allow(clippy::unwrap_used)]
use super::*;
use crate::secret::Secret;

fn base() -> GatewayConfig {
    serde_json::from_value(serde_json::json!({
        "targets": [{"id": "mock", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "mock"}],
        "models": [{"id": "demo/mock", "targets": ["mock"]}]
    }))
    .unwrap()
}

#[test]
fn valid_default_shape() {
    let c = base();
    assert_eq!(c.listen, "127.0.0.1:8080");
    assert!(c.validate().is_ok());
}

#[test]
fn server_section_defaults_partial_and_rejects() {
    assert_eq!(base().server, ServerConfig::default());
    let c: GatewayConfig = serde_json::from_value(serde_json::json!({
        "server": {"max_in_flight": 4, "header_read_timeout_ms": 500}
    }))
    .unwrap();
    assert_eq!(c.server.max_in_flight, 4);
    assert_eq!(c.server.header_read_timeout_ms, 500);
    assert_eq!(c.server.drain_timeout_ms, 30_000);
    let unknown = serde_json::json!({"server": {"max_inflight": 4}});
    assert!(serde_json::from_value::<GatewayConfig>(unknown).is_err());
    let mut c = base();
    c.server.write_stall_ms = 0;
    assert_eq!(c.validate().unwrap_err().field, "server.write_stall_ms");
}

#[test]
fn unknown_target_names_the_field() {
    let mut c = base();
    c.models[0].targets.push("nope".into());
    let e = c.validate().unwrap_err();
    assert_eq!(e.field, "models[0].targets[1]");
}

#[test]
fn responses_api_only_on_openai_kinds() {
    let mut c = base();
    c.targets[0].api = OpenAiApi::Responses;
    assert!(c.validate().is_ok());
    c.targets[0].provider = ProviderKind::Anthropic;
    assert_eq!(c.validate().unwrap_err().field, "targets[0].api");
    let t: TargetConfig = serde_json::from_value(serde_json::json!({"id": "a",
        "provider": "azure_openai", "base_url": "https://x", "upstream_model": "d",
        "api": "responses"}))
    .unwrap();
    assert_eq!(t.api, OpenAiApi::Responses);
    let bad = serde_json::json!({"id": "a", "provider": "openai", "base_url": "https://x",
        "upstream_model": "d", "api": "assistants"});
    assert!(serde_json::from_value::<TargetConfig>(bad).is_err());
}

#[test]
fn api_version_only_on_azure() {
    let mut c = base();
    c.targets[0].api_version = Some("2024-10-21".into());
    assert_eq!(c.validate().unwrap_err().field, "targets[0].api_version");
    c.targets[0].provider = ProviderKind::AzureOpenai;
    assert!(c.validate().is_ok());
    c.targets[0].api_version = Some("2024-10-21&x=1".into());
    assert_eq!(c.validate().unwrap_err().field, "targets[0].api_version");
    let t: TargetConfig = serde_json::from_value(serde_json::json!({"id": "g",
        "provider": "gemini", "base_url": "builtin:mock", "upstream_model": "m"}))
    .unwrap();
    assert_eq!((t.provider.as_str(), t.api_version), ("gemini", None));
    let t: TargetConfig = serde_json::from_value(serde_json::json!({"id": "a",
        "provider": "azure_openai", "base_url": "builtin:mock", "upstream_model": "d"}))
    .unwrap();
    assert_eq!(t.provider.as_str(), "azure_openai");
}

#[test]
fn builtin_base_urls_are_valid_and_others_are_not() {
    let mut c = base();
    c.targets[0].base_url = BUILTIN_LOCAL_MODEL_URL.into();
    assert!(c.validate().is_ok());
    c.targets[0].base_url = "builtin:mock/x/status=503,retry_after=2".into();
    assert!(c.validate().is_ok());
    for bad in [
        "builtin:mock/x/",
        "builtin:mock/x/a/b",
        "builtin:mock/y/a",
        "builtin:mockx",
    ] {
        c.targets[0].base_url = bad.into();
        assert_eq!(
            c.validate().unwrap_err().field,
            "targets[0].base_url",
            "{bad}"
        );
    }
    c.targets[0].base_url = "builtin:nope".into();
    let e = c.validate().unwrap_err();
    assert_eq!(e.field, "targets[0].base_url");
    assert!(e.message.contains(BUILTIN_LOCAL_MODEL_URL), "{}", e.message);
}

#[test]
fn bedrock_targets_need_aws_settings() {
    let mut c = base();
    c.targets[0].provider = ProviderKind::Bedrock;
    assert_eq!(c.validate().unwrap_err().field, "targets[0].aws");
    let t: TargetConfig = serde_json::from_value(serde_json::json!({"id": "mock",
        "provider": "bedrock", "upstream_model": "anthropic.claude-3-haiku-20240307-v1:0",
        "aws": {"region": "us-east-1", "access_key_id": "AKID", "secret_access_key": "s",
            "session_token": "tok"}}))
    .unwrap();
    assert_eq!((t.provider.as_str(), t.base_url.as_str()), ("bedrock", ""));
    let aws = t.aws.clone().unwrap();
    assert_eq!(format!("{aws:?}").matches("[redacted]").count(), 3);
    c.targets[0] = t;
    assert!(c.validate().is_ok(), "{:?}", c.validate());
    c.targets[0].aws.as_mut().unwrap().region = "US East".into();
    assert_eq!(c.validate().unwrap_err().field, "targets[0].aws.region");
    c.targets[0].aws.as_mut().unwrap().region = "eu-west-3".into();
    c.targets[0].aws.as_mut().unwrap().secret_access_key = Secret::new("");
    let e = c.validate().unwrap_err();
    assert_eq!(e.field, "targets[0].aws.secret_access_key");
    c.targets[0].aws = Some(aws);
    c.targets[0].provider = ProviderKind::Openai;
    assert_eq!(c.validate().unwrap_err().field, "targets[0].base_url");
    c.targets[0].base_url = "https://api.openai.com/v1".into();
    assert_eq!(c.validate().unwrap_err().field, "targets[0].aws");
    let r: Result<AwsTarget, _> = serde_json::from_value(serde_json::json!({"region": "x",
        "access_key_id": "a", "secret_access_key": "b", "profile": "p"}));
    assert!(r.unwrap_err().to_string().contains("profile"));
}

#[test]
fn an_admin_key_hash_under_two_ids_is_rejected() {
    let h = "ab".repeat(32);
    let mut c = base();
    c.admin = serde_json::from_value(serde_json::json!({"keys": [
        {"id": "ops", "key_sha256": h},
        {"id": "ops-2", "key_sha256": h.to_ascii_uppercase()}
    ]}))
    .unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("admin.keys[1]"), "{e}");
    assert!(e.contains("the same admin key is configured twice"), "{e}");
    c.admin.keys.pop();
    assert!(c.validate().is_ok());
}

#[test]
fn unknown_fields_are_rejected() {
    let r: Result<GatewayConfig, _> = serde_json::from_value(serde_json::json!({"listne": "x"}));
    assert!(r.unwrap_err().to_string().contains("listne"));
}
