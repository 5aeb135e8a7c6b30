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
            let msg = body["error"]["message"].as_str().unwrap();
            assert!(
                msg.ends_with(": Invalid value for 'temperature': must be between 0 and 2."),
                "{fixture}: {msg}"
            );
            assert_eq!(gw.mock.request_count(), 1, "{fixture} stream={stream}");
            assert_eq!(gw.mock.requests()[0].path, "/v1/chat/completions");
        }
    }
}
