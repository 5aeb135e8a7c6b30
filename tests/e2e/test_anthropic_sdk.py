"""End-to-end tests with the official `anthropic` Python SDK against real switchyard processes.

The SDK talks to Switchyard's Anthropic front door (`POST /v1/messages`); behind it the request is
normalised and routed to an OpenAI-format upstream (`demo/mock`) or an Anthropic-format upstream
(`demo/claude`), both served by the mock.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest
from anthropic import Anthropic

from conftest import DEFAULT_COMPLETION_TOKENS, DEFAULT_TEXT, prompt_words

PROMPT = "Say hello to the gateway please"
#: One model per upstream wire format.
MODELS = ["demo/mock", "demo/claude"]

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def client_for(base_url: str) -> Anthropic:
    # The SDK appends /v1/messages itself, so the base URL has no /v1.
    # max_retries=0: the SDK must not hide a failed request by retrying it.
    return Anthropic(base_url=base_url, api_key="sk-anything", max_retries=0, timeout=30.0)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("model", MODELS)
def test_non_streamed_message(gateway, model):
    client = client_for(gateway.base_url)
    raw = client.messages.with_raw_response.create(model=model, max_tokens=256, messages=user(PROMPT))
    # The SDK appended /v1/messages to the base URL.
    assert str(raw.http_request.url) == f"{gateway.base_url}/v1/messages"
    msg = raw.parse()

    assert msg.type == "message"
    assert msg.role == "assistant"
    assert msg.model == model
    assert msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == DEFAULT_TEXT
    assert msg.stop_reason == "end_turn"
    assert msg.stop_sequence is None
    assert msg.usage.input_tokens == prompt_words(PROMPT) == 6
    assert msg.usage.output_tokens == DEFAULT_COMPLETION_TOKENS
    assert msg.usage.cache_read_input_tokens == 0
    # The SDK exposes Anthropic's `request-id` header; Switchyard sets it to its request id.
    assert msg._request_id == raw.headers["x-request-id"]
    assert msg.id == "msg_" + msg._request_id.replace("-", "")


@pytest.mark.parametrize("model", MODELS)
def test_streamed_message(gateway, model):
    client = client_for(gateway.base_url)
    with client.messages.stream(model=model, max_tokens=256, system="Be nice.", messages=user(PROMPT)) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()

    assert "".join(pieces) == DEFAULT_TEXT
    assert len(pieces) > 1, f"expected the text in several deltas, got {pieces!r}"
    assert final.model == model
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == DEFAULT_TEXT
    assert final.stop_reason == "end_turn"
    # Input tokens are only known at the end: message_start says 0, message_delta the real count.
    assert final.usage.input_tokens == prompt_words("Be nice.", PROMPT) == 8
    assert final.usage.output_tokens == DEFAULT_COMPLETION_TOKENS


def test_stream_event_sequence(gateway):
    client = client_for(gateway.base_url)
    events = list(client.messages.create(model="demo/mock", max_tokens=256, messages=user(PROMPT), stream=True))
    types = [e.type for e in events]
    # `ping` is consumed by the SDK; the rest is Anthropic's exact order.
    assert types == (["message_start", "content_block_start"] + ["content_block_delta"] * DEFAULT_COMPLETION_TOKENS
                     + ["content_block_stop", "message_delta", "message_stop"])
    assert events[0].message.usage.input_tokens == 0
    assert events[-2].usage.output_tokens == DEFAULT_COMPLETION_TOKENS


@pytest.mark.parametrize("model", MODELS)
def test_tool_use_round_trip(gateway, model):
    client = client_for(gateway.base_url)
    question = "Weather in two cities?\n#mock tool_calls=2"
    first = client.messages.create(model=model, max_tokens=256, tools=[WEATHER_TOOL], messages=user(question))
    assert first.stop_reason == "tool_use"
    calls = [b for b in first.content if b.type == "tool_use"]
    assert len(calls) == 2
    for call in calls:
        assert call.name == "get_weather"
        assert isinstance(call.input, dict) and isinstance(call.input["city"], str)
    assert len({c.id for c in calls}) == 2

    # Streamed, the SDK assembles the same calls from input_json_delta pieces.
    with client.messages.stream(model=model, max_tokens=256, tools=[WEATHER_TOOL], messages=user(question)) as s:
        streamed = s.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in streamed.content] == [(c.type, c.name, c.input) for c in calls]

    # The follow-up sends the SDK's own content blocks back, plus the tool results.
    follow = client.messages.create(
        model=model, max_tokens=256, tools=[WEATHER_TOOL],
        messages=[
            *user(question),
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny"},
                {"type": "tool_result", "tool_use_id": calls[1].id, "content": [{"type": "text", "text": "rain"}]},
                {"type": "text", "text": "Thanks!"},
            ]},
        ],
    )
    assert follow.type == "message"
    sent = gateway.mock.requests()[-1]["body"]
    if model == "demo/mock":
        roles = [m["role"] for m in sent["messages"]]
        assert roles == ["user", "assistant", "tool", "tool", "user"]
        assert [c["id"] for c in sent["messages"][1]["tool_calls"]] == [c.id for c in calls]
        assert sent["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": calls[0].id}
        assert sent["messages"][3] == {"role": "tool", "content": "rain", "tool_call_id": calls[1].id}
    else:
        assert [b["type"] for b in sent["messages"][1]["content"]] == ["tool_use", "tool_use"]
        assert [b["type"] for b in sent["messages"][2]["content"]] == ["tool_result", "tool_result", "text"]


def test_errors_are_anthropic_errors(gateway):
    client = client_for(gateway.base_url)
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope/nope", max_tokens=16, messages=user("hi"))
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="demo/mock", max_tokens=16, messages=user("hi"),
                               extra_body={"bogus": 5})
    assert e.value.body["error"]["message"] == "bogus: Extra inputs are not permitted"
    # max_tokens is required (the SDK checks it too, so send the body by hand).
    r = httpx.post(f"{gateway.base_url}/v1/messages", json={"model": "demo/mock", "messages": user("hi")}, timeout=10)
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "max_tokens: Field required"}}


def test_mid_stream_error_raises(gateway):
    client = client_for(gateway.base_url)
    with pytest.raises(anthropic.APIStatusError) as e:
        with client.messages.stream(model="demo/claude", max_tokens=256,
                                    messages=user("#mock error_after=2")) as stream:
            for _ in stream.text_stream:
                pass
    assert e.value.body["error"]["type"] == "overloaded_error"
