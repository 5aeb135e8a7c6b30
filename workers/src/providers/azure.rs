//! Azure OpenAI adapter: `POST {base_url}/openai/deployments/{deployment}/chat/completions
//! ?api-version={api_version}` with the key in the `api-key` header (Azure OpenAI REST API
//! reference, data plane inference, "Chat completions"), e.g.
//! `base_url: https://my-resource.openai.azure.com`, `upstream_model: <deployment name>`.
//!
//! The body and the stream are OpenAI's Chat Completions format (see [`super::openai`]), with
//! Azure's differences: the deployment in the URL picks the model (the body's `model` is ignored
//! and carries the deployment name, as Azure's own SDKs send it); GA API versions up to
//! `2024-10-21` know `max_tokens` but not `max_completion_tokens` (added with the o1 models in
//! `2024-09-01-preview`) nor the `developer` role (added in `2024-12-01-preview`); streams begin
//! with an annotation chunk `{"choices":[],"prompt_filter_results":[…]}` and may carry more
//! chunks without choices (content-filter annotations), which carry no content and are skipped;
//! a filtered completion ends with `finish_reason: "content_filter"`.
//!
//! With `api: responses` the target is called through the Responses API instead
//! ([`responses_url`], [`crate::providers::openai_responses`]).

use std::collections::VecDeque;

use reqwest::header::ACCEPT;
use serde_json::{Map, Value, json};
use switchyard_schemas::config::{OpenAiApi, ProviderKind};
use switchyard_schemas::{ChatRequest, ErrorInfo, FrameBody};

use super::openai::{ChatDialect, OpenAiTranslator, accept, build_object, read_answer, send_chat};
use super::shared::api_key_header;
use crate::provider::{Call, EventStream, Provider, SseTranslator, Upstream, post_json};
use crate::sse::SseEvent;

/// `api-version` used when the target sets none: the GA data-plane inference version
/// (Azure OpenAI REST API reference, "API specs": latest GA `2024-10-21`).
pub const DEFAULT_API_VERSION: &str = "2024-10-21";

/// Adapter for Azure OpenAI deployments (`api-key` auth, `api-version` query). Streams upstream
/// with `stream_options.include_usage` for streaming clients (dropped for a deployment that
/// rejects it, see [`send_chat`]); non-streaming clients get a non-streaming call.
#[derive(Debug, Clone, Copy, Default)]
pub struct AzureOpenAiProvider;

impl Provider for AzureOpenAiProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::AzureOpenai
    }

    fn stream_chat(&self, up: Upstream<'_>, req: &ChatRequest) -> Call<EventStream> {
        let (target, base_url) = (up.target, up.base_url);
        if target.api == OpenAiApi::Responses {
            let auth = (!target.api_key.is_empty())
                .then(|| ("api-key", target.api_key.expose().to_owned()));
            let url = responses_url(base_url, target.api_version.as_deref());
            return crate::providers::openai_responses::call(
                up.http,
                url,
                auth,
                &target.upstream_model,
                req,
            );
        }
        let version = target.api_version.as_deref().unwrap_or(DEFAULT_API_VERSION);
        let body = build_map(&target.upstream_model, version, req);
        let url = chat_url(base_url, &target.upstream_model, version);
        let http = up.http.clone();
        let key = api_key_header(target);
        let memo = format!("{}|{base_url}", target.id);
        let translator = AzureTranslator {
            inner: OpenAiTranslator::for_request(req),
        };
        Box::pin(async move {
            let key = key?;
            let make = |body: &Map<String, Value>| {
                let mut builder = post_json(&http, &url)
                    .header(ACCEPT, accept(body))
                    // `json` fails the send (no request) if encoding fails: never an empty body.
                    .json(body);
                if let Some(key) = &key {
                    builder = builder.header("api-key", key.clone());
                }
                builder
            };
            let resp = send_chat(body?, &memo, make).await?;
            Ok(read_answer(resp, translator))
        })
    }
}

/// `{base_url}/openai/v1/responses` (Azure OpenAI "Responses API" guide: the v1 surface, no
/// deployment in the path, no `api-version` needed), with `?api-version=` when the target sets one.
pub fn responses_url(base_url: &str, api_version: Option<&str>) -> String {
    let base = base_url.trim_end_matches('/');
    match api_version {
        Some(v) => format!("{base}/openai/v1/responses?api-version={v}"),
        None => format!("{base}/openai/v1/responses"),
    }
}

/// `{base_url}/openai/deployments/{deployment}/chat/completions?api-version={version}` (Azure
/// OpenAI REST API reference, "Chat completions": `deployment-id` path and required
/// `api-version` query parameters).
pub fn chat_url(base_url: &str, deployment: &str, api_version: &str) -> String {
    let base = base_url.trim_end_matches('/');
    format!("{base}/openai/deployments/{deployment}/chat/completions?api-version={api_version}")
}

/// The `YYYY-MM-DD` date of an api-version and whether it is a `-preview`; `None` when the
/// version is not date-shaped.
fn version_date(api_version: &str) -> Option<((u32, u32, u32), bool)> {
    let date = api_version.get(..10)?;
    let mut it = date.split('-').map(|p| p.parse::<u32>().ok());
    let parsed = (it.next()??, it.next()??, it.next()??);
    Some((parsed, api_version.ends_with("-preview")))
}

/// Whether `max_completion_tokens` is accepted: previews from `2024-09-01-preview` on (Azure
/// OpenAI "reasoning models" guide: added there, `max_tokens` deprecated), GA versions after
/// `2024-10-21` (the `2024-10-21` inference spec has only `max_tokens`), and versions that are
/// not dates (assumed newest).
pub fn supports_max_completion_tokens(api_version: &str) -> bool {
    match version_date(api_version) {
        None => true,
        Some((d, true)) => d >= (2024, 9, 1),
        Some((d, false)) => d > (2024, 10, 21),
    }
}

/// Whether the `developer` role is accepted: previews from `2024-12-01-preview` on (Azure OpenAI
/// "reasoning models" guide, "Developer messages"), GA versions after `2024-10-21`, and versions
/// that are not dates.
pub fn supports_developer_role(api_version: &str) -> bool {
    match version_date(api_version) {
        None => true,
        Some((d, true)) => d >= (2024, 12, 1),
        Some((d, false)) => d > (2024, 10, 21),
    }
}

/// The upstream JSON body: OpenAI's ([`build_object`]) in the dialect of `api_version`:
/// `max_tokens` instead of `max_completion_tokens` and `developer` messages sent as `system`
/// where it predates them ([`supports_max_completion_tokens`], [`supports_developer_role`]).
/// Fails only if JSON encoding does.
pub fn build_body(
    deployment: &str,
    api_version: &str,
    req: &ChatRequest,
) -> Result<Vec<u8>, ErrorInfo> {
    let body = build_map(deployment, api_version, req)?;
    Ok(Value::Object(body).to_string().into_bytes())
}

/// [`build_body`] as an object.
pub fn build_map(
    deployment: &str,
    api_version: &str,
    req: &ChatRequest,
) -> Result<Map<String, Value>, ErrorInfo> {
    let dialect = ChatDialect {
        max_completion_tokens: supports_max_completion_tokens(api_version),
        developer_as_system: !supports_developer_role(api_version),
        openai_fields: true,
    };
    build_object(dialect, deployment, req)
}

/// The OpenAI translator (it already skips chunks with `choices: []`, such as Azure's
/// `prompt_filter_results` annotations) plus one Azure case: an in-stream error with code
/// `content_filter` ends the answer as `content_filter` instead of failing it (shape
/// `{"error":{"code":"content_filter",…}}` as in Azure's HTTP 400 filter errors).
#[derive(Debug, Default)]
pub struct AzureTranslator {
    inner: OpenAiTranslator,
}

impl SseTranslator for AzureTranslator {
    fn on_event(&mut self, ev: SseEvent, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) -> bool {
        let filtered = ev.data.contains("content_filter")
            && serde_json::from_str::<Value>(&ev.data)
                .is_ok_and(|v| v.pointer("/error/code") == Some(&json!("content_filter")));
        if !filtered {
            return self.inner.on_event(ev, out);
        }
        let finish =
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]});
        for data in [finish.to_string(), "[DONE]".to_owned()] {
            let ev = SseEvent {
                data,
                ..SseEvent::default()
            };
            if self.inner.on_event(ev, out) {
                return true;
            }
        }
        true
    }

    fn on_eof(&mut self, out: &mut VecDeque<Result<FrameBody, ErrorInfo>>) {
        self.inner.on_eof(out);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::providers::test_support::{self, AZURE, end, text};
    use switchyard_mock::MockUpstream;
    use switchyard_schemas::FinishReason;
    use switchyard_schemas::config::TargetConfig;

    type Item = Result<FrameBody, ErrorInfo>;

    /// Feeds `chunks` as separate writes through the SSE parser and the translator.
    fn translate_chunks(chunks: &[&str]) -> Vec<Item> {
        test_support::translate_chunks::<AzureTranslator>(chunks)
    }

    fn usage(prompt: u64, cached: u64, completion: u64) -> Item {
        test_support::usage(prompt, cached, 0, completion, 0)
    }

    fn target(base: &str, api_version: Option<&str>) -> TargetConfig {
        let mut t = AZURE.target(base);
        t.api_version = api_version.map(str::to_owned);
        t
    }

    #[tokio::test]
    async fn plain_text_stream_and_wire_request() {
        let mock = MockUpstream::start().await.unwrap();
        let mut t = target(&mock.base_url(), None);
        t.api_key = switchyard_schemas::Secret::new("az-key");
        let req = AZURE.request(
            json!([{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "hi\n#mock text=Hello,+world chunks=2 prompt_tokens=5 completion_tokens=2"}]),
            json!({"params": {"max_tokens": 50}}),
        );
        let events = AZURE.run_with(&t, &req).await.unwrap();
        assert_eq!(events, test_support::hello_world(usage(5, 0, 2)));
        let sent = &mock.requests()[0];
        assert_eq!(sent.path, "/openai/deployments/gpt4o-dep/chat/completions");
        assert_eq!(sent.query.as_deref(), Some("api-version=2024-10-21"));
        assert_eq!(sent.header("api-key"), Some("az-key"));
        assert_eq!(sent.header("authorization"), None);
        assert_eq!(sent.body["max_tokens"], json!(50));
        assert!(sent.body.get("max_completion_tokens").is_none());
        assert_eq!(sent.body["messages"][0]["role"], "system");
        assert_eq!(sent.body["stream_options"], json!({"include_usage": true}));
    }

    #[tokio::test]
    async fn preview_version_keeps_new_names() {
        let mock = MockUpstream::start().await.unwrap();
        let t = target(&mock.base_url(), Some("2025-01-01-preview"));
        let req = AZURE.request(
            json!([{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "hi"}]),
            json!({"params": {"max_tokens": 50}}),
        );
        AZURE.run_with(&t, &req).await.unwrap();
        let sent = &mock.requests()[0];
        assert_eq!(
            sent.query.as_deref(),
            Some("api-version=2025-01-01-preview")
        );
        assert_eq!(sent.body["max_completion_tokens"], json!(50));
        assert!(sent.body.get("max_tokens").is_none());
        assert_eq!(sent.body["messages"][0]["role"], "developer");
    }

    #[tokio::test]
    async fn two_parallel_tool_calls() {
        let mock = MockUpstream::start().await.unwrap();
        let events = AZURE.run_ask(&mock, "tool_calls=2 chunks=3").await.unwrap();
        let mut calls: Vec<(String, String, String)> = Vec::new();
        for (index, id, name, arguments) in test_support::tool_call_pieces(&events) {
            match (id, name) {
                (Some(id), Some(name)) => {
                    assert_eq!(index, calls.len());
                    calls.push((id.clone(), name.clone(), arguments.to_owned()));
                }
                _ => calls[index].2.push_str(arguments),
            }
        }
        let cities: Vec<Value> = calls
            .iter()
            .map(|(_, _, args)| serde_json::from_str::<Value>(args).unwrap()["city"].clone())
            .collect();
        assert_eq!(cities, [json!("Paris"), json!("London")]);
        assert_eq!(calls[1].0, "call_mock_1");
        assert_eq!(events.last(), Some(&end(FinishReason::ToolCalls)));
    }

    #[tokio::test]
    async fn mock_requires_api_version() {
        let mock = MockUpstream::start().await.unwrap();
        let url = format!("{}/openai/deployments/d/chat/completions", mock.base_url());
        let resp = reqwest::Client::new()
            .post(url)
            .json(&json!({"messages": [{"role": "user", "content": "x"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(
            body,
            json!({"error": {"code": "404", "message": "Resource not found"}})
        );
    }

    /// Azure's annotation chunks (`choices: []`), then a filtered finish, then usage.
    #[test]
    fn prompt_filter_chunks_and_content_filter_finish() {
        let safe = r#"{"hate":{"filtered":false,"severity":"safe"}}"#;
        let chunks = [
            format!(
                r#"{{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{{"prompt_index":0,"content_filter_results":{safe}}}]}}"#
            ),
            format!(
                r#"{{"choices":[{{"content_filter_results":{safe},"delta":{{"content":"Hi"}},"finish_reason":null,"index":0}}],"id":"c","object":"chat.completion.chunk"}}"#
            ),
            r#"{"choices":[{"delta":{},"finish_reason":"content_filter","index":0}],"id":"c"}"#
                .to_owned(),
            r#"{"choices":[],"id":"c","usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#
                .to_owned(),
            "[DONE]".to_owned(),
        ];
        let body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        let expected = vec![text("Hi"), usage(9, 0, 1), end(FinishReason::ContentFilter)];
        assert_eq!(translate_chunks(&[&body]), expected);

        let err = r#"{"error":{"code":"content_filter","message":"filtered","status":400}}"#;
        let body = format!("data: {}\n\ndata: {err}\n\n", chunks[1]);
        let expected = vec![text("Hi"), end(FinishReason::ContentFilter)];
        assert_eq!(translate_chunks(&[&body]), expected);
    }

    #[test]
    fn api_version_rules() {
        for (v, mct, dev) in [
            ("2024-10-21", false, false),
            ("2024-06-01", false, false),
            ("2024-08-01-preview", false, false),
            ("2024-09-01-preview", true, false),
            ("2024-12-01-preview", true, true),
            ("2025-04-01-preview", true, true),
            ("2025-06-01", true, true),
            ("latest", true, true),
        ] {
            assert_eq!(supports_max_completion_tokens(v), mct, "{v}");
            assert_eq!(supports_developer_role(v), dev, "{v}");
        }
        assert_eq!(
            chat_url("https://r.openai.azure.com/", "dep", "2024-10-21"),
            "https://r.openai.azure.com/openai/deployments/dep/chat/completions?api-version=2024-10-21"
        );
    }

    /// The whole body on an api-version with `max_completion_tokens` and `developer` and on
    /// one without (as OpenAI's otherwise, the OpenAI-only fields included).
    #[test]
    fn whole_bodies() {
        use crate::providers::openai::tests::{rich_body, rich_request};
        let req = rich_request();
        let new = Value::Object(build_map("up", "2025-01-01-preview", &req).unwrap());
        assert_eq!(new, rich_body("max_completion_tokens", "developer", true));
        let old = Value::Object(build_map("up", "2024-06-01", &req).unwrap());
        assert_eq!(old, rich_body("max_tokens", "system", true));
    }
}
