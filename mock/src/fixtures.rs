//! Canned wire fixtures (`fixture=<name>`): exact upstream bodies for field cases, written from
//! the providers' documented stream formats (OpenAI "Streaming", OpenAI Responses "Streaming
//! events", Anthropic "Streaming Messages" and Gemini "streamGenerateContent" docs). Each SSE event is sent as one content item, so `split`, `chunk_delay_ms` and friends
//! still apply.

use bytes::Bytes;

/// Name → bytes of every fixture.
const FIXTURES: &[(&str, &str)] = &[
    (
        "fc06_anthropic_overloaded",
        include_str!("fixtures/fc06_anthropic_overloaded.sse"),
    ),
    (
        "fc07_openai_error_in_200",
        include_str!("fixtures/fc07_openai_error_in_200.sse"),
    ),
    (
        "fc07_openai_error_numeric_code",
        include_str!("fixtures/fc07_openai_error_numeric_code.sse"),
    ),
    (
        "fc07_openai_error_string_code",
        include_str!("fixtures/fc07_openai_error_string_code.sse"),
    ),
    (
        "fc07_openai_error_type_only",
        include_str!("fixtures/fc07_openai_error_type_only.sse"),
    ),
    (
        "fc07_openai_error_status_only",
        include_str!("fixtures/fc07_openai_error_status_only.sse"),
    ),
    (
        "fc08_openai_tools_no_done",
        include_str!("fixtures/fc08_openai_tools_no_done.sse"),
    ),
    (
        "fc10_anthropic_usage_in_delta",
        include_str!("fixtures/fc10_anthropic_usage_in_delta.sse"),
    ),
    (
        "fc10_anthropic_usage_in_start",
        include_str!("fixtures/fc10_anthropic_usage_in_start.sse"),
    ),
    (
        "fc17_anthropic_two_tools",
        include_str!("fixtures/fc17_anthropic_two_tools.sse"),
    ),
    (
        "fc37_anthropic_thinking",
        include_str!("fixtures/fc37_anthropic_thinking.sse"),
    ),
    (
        "fc38_openai_parallel_no_args",
        include_str!("fixtures/fc38_openai_parallel_no_args.sse"),
    ),
    (
        "fc21_openai_empty_then_quota",
        include_str!("fixtures/fc21_openai_empty_then_quota.sse"),
    ),
    (
        "fc21_openai_hel_then_quota",
        include_str!("fixtures/fc21_openai_hel_then_quota.sse"),
    ),
    (
        "fc31_responses_empty_output",
        include_str!("fixtures/fc31_responses_empty_output.sse"),
    ),
    (
        "fc31_responses_null_output",
        include_str!("fixtures/fc31_responses_null_output.sse"),
    ),
    (
        "fc31_responses_incomplete",
        include_str!("fixtures/fc31_responses_incomplete.sse"),
    ),
    (
        "fc31_responses_call_in_done",
        include_str!("fixtures/fc31_responses_call_in_done.sse"),
    ),
    // Billing field cases (issue #16): input counts reported at the start of a stream the client
    // then leaves (use with `hold=1`), and usage only in a trailing event after the stop.
    (
        "fc_anthropic_start_usage_then_hold",
        include_str!("fixtures/fc_anthropic_start_usage_then_hold.sse"),
    ),
    (
        "fc_openai_usage_after_stop",
        include_str!("fixtures/fc_openai_usage_after_stop.sse"),
    ),
    (
        "fc_gemini_usage_after_stop",
        include_str!("fixtures/fc_gemini_usage_after_stop.sse"),
    ),
];

/// The fixture called `name`.
pub fn get(name: &str) -> Option<&'static str> {
    FIXTURES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, body)| *body)
}

/// Splits a fixture into its SSE events (each ending in a blank line).
pub(crate) fn events(body: &str) -> Vec<Bytes> {
    body.split_inclusive("\n\n")
        .map(|e| Bytes::copy_from_slice(e.as_bytes()))
        .collect()
}
