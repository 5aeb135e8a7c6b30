"""Issue 12 with the official SDKs: the newest `openai` defaults (`store`, `service_tier`,
`logprobs`, `reasoning_effort`, replayed `model_dump()` history), `models.retrieve`, legacy
`completions.create`, and the `anthropic` SDK's `messages.count_tokens`, `top_k`, a thinking round
trip and `OverloadedError` for an upstream 529."""

from __future__ import annotations

import anthropic
import openai
import pytest
from anthropic import Anthropic
from openai import OpenAI

from conftest import DEFAULT_TEXT

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}


def oai(base_url: str) -> OpenAI:
    return OpenAI(base_url=f"{base_url}/v1", api_key="sk-anything", max_retries=0, timeout=30.0)


def ant(base_url: str) -> Anthropic:
    return Anthropic(base_url=base_url, api_key="sk-anything", max_retries=0, timeout=30.0)


@pytest.mark.parametrize("model", ["demo/mock", "demo/claude"])
def test_openai_newest_defaults_and_model_dump_replay(gateway, model):
    client = oai(gateway.base_url)
    first = client.chat.completions.create(
        model=model, tools=[WEATHER], store=False, service_tier="auto", logprobs=False,
        reasoning_effort="low",
        messages=[{"role": "user", "content": "Weather in Paris?\n#mock tool_calls=1"}])
    call_msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert call_msg.tool_calls[0].function.name == "get_weather"
    history = [{"role": "user", "content": "Weather in Paris?"}, call_msg.model_dump(),
               {"role": "tool", "tool_call_id": call_msg.tool_calls[0].id, "content": "sunny"}]
    second = client.chat.completions.create(model=model, messages=history, store=False,
                                            service_tier="auto", logprobs=False, reasoning_effort="low")
    text_msg = second.choices[0].message
    assert text_msg.content == DEFAULT_TEXT
    dumped = text_msg.model_dump()
    assert dumped["tool_calls"] is None  # what the SDK produces, replayed as is
    third = client.chat.completions.create(
        model=model, messages=history + [dumped, {"role": "user", "content": "Thanks"}],
        store=False, service_tier="auto", logprobs=False, reasoning_effort="low", stream=True,
        stream_options={"include_usage": True})
    chunks = list(third)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == DEFAULT_TEXT
    assert chunks[-1].usage.completion_tokens == 13


def test_openai_models_retrieve_and_legacy_completions(gateway):
    client = oai(gateway.base_url)
    m = client.models.retrieve("demo/claude")
    assert (m.id, m.object, m.owned_by) == ("demo/claude", "model", "switchyard")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    c = client.completions.create(model="demo/mock", prompt="Say this is a test", max_tokens=100)
    assert c.object == "text_completion"
    assert c.choices[0].text == DEFAULT_TEXT
    assert c.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model="demo/mock", prompt="Say this is a test", max_tokens=100, stream=True))
    assert streamed == DEFAULT_TEXT


def test_anthropic_count_tokens_top_k_and_529(gateway):
    client = ant(gateway.base_url)
    tool = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
    n = client.messages.count_tokens(
        model="demo/claude", system="You are a weather bot.", tools=[tool],
        messages=[{"role": "user", "content": "Weather?\n#mock prompt_tokens=728"}])
    assert n.input_tokens == 728
    beta = client.beta.messages.count_tokens(
        model="demo/claude", system="You are a weather bot.", tools=[tool], betas=["token-counting-2024-11-01"],
        messages=[{"role": "user", "content": "Weather?\n#mock prompt_tokens=728"}])
    assert beta.input_tokens == 728
    sent = [r for r in gateway.mock.requests() if r["path"] == "/v1/messages/count_tokens"]
    assert sent[-1]["body"]["system"] == "You are a weather bot."
    assert sent[-1]["body"]["tools"][0]["name"] == "get_weather"

    msg = client.messages.create(model="demo/claude", max_tokens=64, top_k=5,
                                 messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text == DEFAULT_TEXT
    assert gateway.mock.requests()[-1]["body"]["top_k"] == 5

    with pytest.raises(anthropic.OverloadedError) as e:
        client.messages.create(model="demo/claude", max_tokens=64,
                               messages=[{"role": "user", "content": "hi\n#mock status=529"}])
    assert e.value.status_code == 529


def test_anthropic_thinking_round_trip(gateway):
    client = ant(gateway.base_url)
    ask = {"role": "user", "content": "What is 2+2?\n#mock fixture=fc37_anthropic_thinking"}
    thinking = {"type": "enabled", "budget_tokens": 1024}
    with client.messages.stream(model="demo/claude", max_tokens=2048, thinking=thinking,
                                messages=[ask]) as s:
        deltas = [e.thinking for e in s if e.type == "thinking"]
        final = s.get_final_message()
    assert deltas == ["Let me add ", "2 and 2."]
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Let me add 2 and 2."
    assert final.content[0].signature == "EqQBCkYIBRgCKkA1"
    replay = client.messages.create(
        model="demo/claude", max_tokens=2048, thinking=thinking,
        messages=[ask, {"role": "assistant", "content": final.content},
                  {"role": "user", "content": "And 3+3?"}])
    assert replay.content[0].text == DEFAULT_TEXT
    sent = gateway.mock.requests()[-1]["body"]["messages"][1]["content"][0]
    assert sent == {"type": "thinking", "thinking": "Let me add 2 and 2.", "signature": "EqQBCkYIBRgCKkA1"}


def test_openai_sdk_sees_reasoning_and_replays_it(gateway):
    """FC-37 through the openai SDK: the chat view's `reasoning_content` (streamed and not), and the
    message's `model_dump()` (with `thinking_blocks`) replayed to the Anthropic upstream."""
    client = oai(gateway.base_url)
    ask = {"role": "user", "content": "What is 2+2?\n#mock fixture=fc37_anthropic_thinking"}
    stream = client.chat.completions.create(model="demo/claude", messages=[ask], stream=True)
    reasoning = [c.choices[0].delta.model_extra.get("reasoning_content") for c in stream if c.choices]
    assert [r for r in reasoning if r] == ["Let me add ", "2 and 2."]
    msg = client.chat.completions.create(model="demo/claude", messages=[ask]).choices[0].message
    assert msg.content == "4"
    assert msg.model_extra["reasoning_content"] == "Let me add 2 and 2."
    block = {"type": "thinking", "thinking": "Let me add 2 and 2.", "signature": "EqQBCkYIBRgCKkA1"}
    assert msg.model_extra["thinking_blocks"] == [block]
    again = client.chat.completions.create(
        model="demo/claude", messages=[ask, msg.model_dump(), {"role": "user", "content": "And 3+3?"}])
    assert again.choices[0].message.content == DEFAULT_TEXT
    sent = gateway.mock.requests()[-1]["body"]["messages"][1]
    assert sent == {"role": "assistant", "content": [block, {"type": "text", "text": "4"}]}
