"""The official `openai` SDK, unmodified, against Switchyard: tool calling with a full round trip,
embeddings, and an Anthropic-format upstream behind the OpenAI front door."""

from __future__ import annotations

import json

from openai import OpenAI

from conftest import DEFAULT_TEXT, MODEL

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                      "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}},
]


def client_for(base_url: str) -> OpenAI:
    return OpenAI(base_url=f"{base_url}/v1", api_key="sk-anything", max_retries=0, timeout=30.0)


def tool_round_trip(client: OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "Weather in Paris and the time in UTC?\n#mock tool_calls=2"}]
    first = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    for c in calls:
        assert c.id
        assert isinstance(json.loads(c.function.arguments), dict)
    # Round trip: the assistant's calls and one result per call.
    messages.append(choice.message.model_dump(exclude_none=True))
    for c in calls:
        messages.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps({"ok": c.function.name})})
    messages.append({"role": "user", "content": "Summarise."})
    second = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == DEFAULT_TEXT
    assert second.choices[0].finish_reason == "stop"


def test_tool_calling_round_trip_openai_upstream(gateway):
    tool_round_trip(client_for(gateway.base_url), MODEL)


def test_tool_calling_round_trip_anthropic_upstream(gateway):
    tool_round_trip(client_for(gateway.base_url), "demo/claude")


def test_streamed_tool_calls_anthropic_upstream(gateway):
    client = client_for(gateway.base_url)
    stream = client.chat.completions.create(
        model="demo/claude", tools=TOOLS, stream=True,
        messages=[{"role": "user", "content": "Weather?\n#mock tool_calls=2"}])
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    finish = None
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names[tc.index] = tc.function.name
                args[tc.index] = args.get(tc.index, "") + ((tc.function and tc.function.arguments) or "")
            finish = ch.finish_reason or finish
    assert finish == "tool_calls"
    assert names == {0: "get_weather", 1: "get_time"}
    assert all(isinstance(json.loads(a), dict) for a in args.values())


def test_chat_and_stream_anthropic_upstream(gateway):
    client = client_for(gateway.base_url)
    resp = client.chat.completions.create(model="demo/claude", messages=[{"role": "user", "content": "hi"}])
    assert resp.choices[0].message.content == DEFAULT_TEXT
    assert resp.model == "demo/claude"
    stream = client.chat.completions.create(
        model="demo/claude", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.delta.content or ""
        usage = chunk.usage or usage
    assert text == DEFAULT_TEXT
    assert usage is not None and usage.prompt_tokens == 1 and usage.completion_tokens == 13


def test_embeddings(gateway):
    client = client_for(gateway.base_url)
    # The SDK asks for base64 by default and decodes it itself.
    resp = client.embeddings.create(model=MODEL, input=["alpha beta", "gamma"])
    assert resp.model == MODEL
    assert [d.index for d in resp.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in resp.data)
    assert resp.usage.prompt_tokens == 3
    floats = client.embeddings.create(model=MODEL, input="alpha beta", encoding_format="float", dimensions=4)
    assert len(floats.data[0].embedding) == 4
    norm = sum(x * x for x in floats.data[0].embedding)
    assert abs(norm - 1.0) < 1e-5


def test_structured_output_parse_anthropic_upstream(gateway):
    """FC-41: `chat.completions.parse` with a Pydantic model against a Claude upstream: the
    JSON comes back as content (Switchyard's synthetic `json_tool_call` tool), parsed by the
    SDK, with no tool calls and finish `stop`."""
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        temp_c: int

    client = client_for(gateway.base_url)
    directive = "#mock tool_args=%7B%22city%22%3A%22Paris%22%2C%22temp_c%22%3A21%7D"
    completion = client.chat.completions.parse(
        model="demo/claude", response_format=Weather,
        messages=[{"role": "user", "content": f"Weather in Paris?\n{directive}"}])
    choice = completion.choices[0]
    assert choice.message.parsed == Weather(city="Paris", temp_c=21)
    assert choice.message.content == '{"city":"Paris","temp_c":21}'
    assert not choice.message.tool_calls
    assert choice.finish_reason == "stop"
