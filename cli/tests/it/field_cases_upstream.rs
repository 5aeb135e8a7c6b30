//! Upstream answers the adapters must read right, end to end through the gateway with exact
//! values: FC-07 (an error object inside a 200 stream names a 4xx in any field), the FC-12
//! variant (an upstream that rejects `stream_options`) and Deliver 8 (non-streaming upstream
//! calls for non-streaming clients; a JSON answer to a stream request).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;

/// FC-07 and its kind: the error inside the 200 stream names a 400 by a numeric `code`, a string
/// `code`, a `type` only (vLLM's top-level `BadRequestError`) or a `status` only (Google's
/// `INVALID_ARGUMENT`). The client gets 400 `invalid_request_error` with the upstream message and
/// `param`; the first target is called once — no retry on it, no fallback to `claude`.
#[tokio::test]
async fn fc07_any_4xx_field_inside_200_stream_is_final() {
    let gw = start(Options::default()).await;
    let cases = [
        ("fc07_openai_error_numeric_code", Some("temperature")),
        ("fc07_openai_error_string_code", None),
        ("fc07_openai_error_type_only", None),
        ("fc07_openai_error_status_only", None),
    ];
    for (fixture, param) in cases {
        for stream in [true, false] {
            gw.mock.state().clear();
            let prompt = format!("#mock fixture={fixture}");
            let body = chat("demo/mock-then-claude", &prompt, stream);
            let (status, _, body) = post_json(&gw.base, &body).await;
            assert_eq!(status, 400, "{fixture} stream={stream}: {body}");
            assert_eq!(body["error"]["type"], "invalid_request_error", "{fixture}");
            assert_eq!(body["error"]["code"], serde_json::Value::Null, "{fixture}");
            assert_eq!(body["error"]["param"].as_str(), param, "{fixture}");
            let msg = error_message(&body);
            assert!(
                msg.ends_with(": Invalid value for 'temperature': must be between 0 and 2."),
                "{fixture}: {msg}"
            );
            assert_eq!(gw.mock.request_count(), 1, "{fixture} stream={stream}");
            assert_eq!(gw.mock.requests()[0].path, "/v1/chat/completions");
        }
    }
}

/// FC-12 variant: an upstream that answers 400 "Unrecognized request argument supplied:
/// stream_options" is called once more without it; the client gets the answer (not the 400), the
/// usage is estimated (4 bytes per token) and marked `estimated` on both usage events, and the
/// next request to the same target leaves `stream_options` out from the start (one call).
#[tokio::test]
async fn fc12_stream_options_rejected_retried_without() {
    let gw = billed_gateway().await;
    let prompt = "#mock reject_stream_options=1";
    let mut body = chat("demo/mock", prompt, true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let r = post_sse(&gw.base, &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), switchyard_mock::DEFAULT_TEXT);
    assert_eq!(r.done_count(), 1);
    let sent = gw.mock.requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].body["stream_options"]["include_usage"], true);
    assert_eq!(sent[1].body.get("stream_options"), None);
    assert_eq!(sent[1].body["stream"], true);
    let id: uuid::Uuid = r.headers["x-request-id"].to_str().unwrap().parse().unwrap();
    let completion = switchyard_mock::DEFAULT_TEXT.len().div_ceil(4) as u64;
    let prompt_tokens = prompt.len().div_ceil(4) as u64;
    for row in ledger_rows(gw.ledger.as_ref().unwrap(), id, 2).await {
        assert!(row.estimated, "{:?}", row.kind);
        assert_eq!(row.usage.completion_tokens, completion, "{:?}", row.kind);
        assert_eq!(row.usage.prompt_tokens, prompt_tokens, "{:?}", row.kind);
    }
    // Remembered: the next request is one call without `stream_options`.
    gw.mock.state().clear();
    let r = post_sse(&gw.base, &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(gw.mock.request_count(), 1);
    assert_eq!(gw.mock.requests()[0].body.get("stream_options"), None);
}

/// Deliver 8 (b): an OpenAI-compatible server that answers a stream request with a plain JSON
/// `chat.completion` is read as the complete answer instead of a 502 `upstream_protocol_error`.
#[tokio::test]
async fn json_answer_to_a_stream_request() {
    let gw = start(Options::default()).await;
    let prompt = "#mock json_for_stream=1 prompt_tokens=11 completion_tokens=7";
    let mut body = chat("demo/mock", prompt, true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let r = post_sse(&gw.base, &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content(), switchyard_mock::DEFAULT_TEXT);
    assert_eq!(r.finish_reason().as_deref(), Some("stop"));
    assert_eq!(r.done_count(), 1);
    let last = r.json_events().last().cloned().unwrap();
    assert_eq!(last["usage"]["prompt_tokens"], 11);
    assert_eq!(last["usage"]["completion_tokens"], 7);
    assert_eq!(last["usage"]["total_tokens"], 18);
    assert_eq!(gw.mock.request_count(), 1);
    // Non-streaming client: a non-streaming upstream call, the same answer.
    let (status, _, body) = post_json(&gw.base, &chat("demo/mock", prompt, false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        switchyard_mock::DEFAULT_TEXT
    );
    assert_eq!(body["usage"]["prompt_tokens"], 11);
    assert_eq!(body["usage"]["completion_tokens"], 7);
    assert_eq!(gw.mock.requests()[1].body.get("stream"), None);
}
