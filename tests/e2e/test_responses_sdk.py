"""End-to-end tests of the OpenAI Responses front door (`/v1/responses`) with the official `openai`
Python SDK's `responses` resource, against real switchyard processes.

Behind the door the request is normalised and routed to an OpenAI-format upstream (`demo/mock`)
or an Anthropic-format upstream (`demo/claude`), both served by the mock; stored responses live in
the `SY_RESPONSES` JetStream KV bucket of the test's nats-server.
"""

from __future__ import annotations

import json

import openai
import pytest
from openai import OpenAI

from conftest import DEFAULT_COMPLETION_TOKENS, DEFAULT_TEXT, prompt_words

PROMPT = "Say hello to the gateway please"
MODELS = ["demo/mock", "demo/claude"]

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False},
    "strict": True,
}

#: The documented order of a streamed text answer's events.
TEXT_EVENTS_HEAD = ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added"]
TEXT_EVENTS_TAIL = ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                    "response.completed"]


def client_for(base_url: str) -> OpenAI:
    return OpenAI(base_url=f"{base_url}/v1", api_key="sk-anything", max_retries=0, timeout=30.0)


def upstream_roles(mock, model: str) -> list[str]:
    """Roles of the messages the last upstream request carried (system prompt included)."""
    body = mock.requests()[-1]["body"]
    roles = [m["role"] for m in body["messages"]]
    if model == "demo/claude" and body.get("system"):
        roles.insert(0, "system")
    return roles


@pytest.mark.parametrize("model", MODELS)
def test_plain_response(gateway, model):
    client = client_for(gateway.base_url)
    raw = client.responses.with_raw_response.create(model=model, input=PROMPT, instructions="Be nice.",
                                                    metadata={"run": "e2e"}, temperature=0.5)
    resp = raw.parse()
    assert resp.id == "resp_" + raw.headers["x-request-id"].replace("-", "")
    assert resp.object == "response"
    assert resp.status == "completed"
    assert resp.model == model
    assert resp.output_text == DEFAULT_TEXT
    assert [i.type for i in resp.output] == ["message"]
    assert resp.output[0].role == "assistant"
    assert resp.output[0].status == "completed"
    assert [p.type for p in resp.output[0].content] == ["output_text"]
    assert resp.incomplete_details is None
    assert resp.usage.input_tokens == prompt_words("Be nice.", PROMPT) == 8
    assert resp.usage.output_tokens == DEFAULT_COMPLETION_TOKENS
    assert resp.usage.total_tokens == 8 + DEFAULT_COMPLETION_TOKENS
    assert resp.usage.input_tokens_details.cached_tokens == 0
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    # Echoed request parameters.
    assert resp.instructions == "Be nice."
    assert resp.metadata == {"run": "e2e"}
    assert resp.temperature == 0.5
    assert resp.store is True
    assert resp.parallel_tool_calls is True
    assert resp.tool_choice == "auto"
    assert resp.tools == []
    assert resp.text.format.type == "text"
    assert upstream_roles(gateway.mock, model) == ["system", "user"]


@pytest.mark.parametrize("model", MODELS)
def test_streamed_response_events(gateway, model):
    client = client_for(gateway.base_url)
    events = list(client.responses.create(model=model, input=PROMPT, stream=True))
    types = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert types[:4] == TEXT_EVENTS_HEAD
    assert types[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert types[4 + len(deltas):] == TEXT_EVENTS_TAIL
    assert len(deltas) > 1
    assert "".join(deltas) == DEFAULT_TEXT
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, final = events[0].response, events[-1].response
    assert created.status == "in_progress" and created.output == []
    assert final.status == "completed"
    assert final.output_text == DEFAULT_TEXT
    assert final.id == created.id
    assert final.usage.input_tokens == prompt_words(PROMPT)
    assert final.usage.output_tokens == DEFAULT_COMPLETION_TOKENS
    item_id = events[2].item.id
    assert {e.item_id for e in events if e.type == "response.output_text.delta"} == {item_id}
    assert final.output[0].id == item_id
    # The SDK's stream helper assembles the same response.
    with client.responses.stream(model=model, input=PROMPT) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        helper_final = stream.get_final_response()
    assert text == DEFAULT_TEXT
    assert helper_final.output_text == DEFAULT_TEXT


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stream", [False, True])
def test_function_call_round_trip(gateway, model, stream):
    client = client_for(gateway.base_url)
    question = [{"role": "user", "content": "Weather in Paris?\n#mock tool_calls=1"}]
    if stream:
        with client.responses.stream(model=model, input=question, tools=[WEATHER_TOOL]) as s:
            events = list(s)
            first = s.get_final_response()
        types = [e.type for e in events]
        assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
        assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                              "response.completed"]
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert args == first.output[0].arguments
    else:
        first = client.responses.create(model=model, input=question, tools=[WEATHER_TOOL])
    assert first.status == "completed"
    calls = [i for i in first.output if i.type == "function_call"]
    assert len(calls) == 1 and [i.type for i in first.output] == ["function_call"]
    call = calls[0]
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id and call.id.startswith("fc_")
    assert first.tools[0].name == "get_weather"

    # The SDK's own output items go back as input, with the tool's result.
    follow_input = question + [i.model_dump(exclude_none=True) for i in first.output] + [
        {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temp_c": 21})}]
    second = client.responses.create(model=model, input=follow_input, tools=[WEATHER_TOOL])
    assert second.output_text == DEFAULT_TEXT
    assert second.status == "completed"
    body = gateway.mock.requests()[-1]["body"]
    if model == "demo/mock":
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool"]
        assert body["messages"][1]["tool_calls"][0]["id"] == call.call_id
        assert body["messages"][2] == {"role": "tool", "tool_call_id": call.call_id,
                                       "content": json.dumps({"temp_c": 21})}
    else:
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
        assert body["messages"][1]["content"][-1]["type"] == "tool_use"
        assert body["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": call.call_id,
                                                     "content": json.dumps({"temp_c": 21})}


@pytest.mark.parametrize("model", MODELS)
def test_previous_response_id_follow_up(gateway, model):
    client = client_for(gateway.base_url)
    first = client.responses.create(model=model, input="My name is Ada.", instructions="Be brief.")
    second = client.responses.create(model=model, input="What is my name?", previous_response_id=first.id)
    assert second.output_text == DEFAULT_TEXT
    assert second.previous_response_id == first.id
    body = gateway.mock.requests()[-1]["body"]
    # The stored turn (input + output) precedes the new input; the old instructions do not.
    if model == "demo/mock":
        assert body["messages"] == [
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": DEFAULT_TEXT},
            {"role": "user", "content": "What is my name?"},
        ]
    else:
        assert "system" not in body
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert second.usage.input_tokens == prompt_words("My name is Ada.", DEFAULT_TEXT, "What is my name?")

    # A tool round trip by reference: only the function_call_output is sent the second time.
    first = client.responses.create(model=model, input="Weather?\n#mock tool_calls=1", tools=[WEATHER_TOOL])
    call = first.output[0]
    third = client.responses.create(model=model, previous_response_id=first.id, tools=[WEATHER_TOOL],
                                    input=[{"type": "function_call_output", "call_id": call.call_id,
                                            "output": "sunny"}])
    assert third.output_text == DEFAULT_TEXT


def test_retrieve_delete_and_input_items(gateway):
    client = client_for(gateway.base_url)
    items = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "one"}]},
             {"role": "assistant", "content": "two"},
             {"role": "user", "content": "three"}]
    created = client.responses.create(model="demo/mock", input=items)
    got = client.responses.retrieve(created.id)
    assert got.model_dump() == created.model_dump()

    page = client.responses.input_items.list(created.id)
    assert [i.type for i in page.data] == ["message"] * 4
    # Newest first by default, as OpenAI.
    assert [i.role for i in page.data] == ["user", "assistant", "user", "developer"]
    assert page.data[0].content[0].text == "three"
    asc = client.responses.input_items.list(created.id, order="asc", limit=2)
    assert [i.role for i in asc.data] == ["developer", "user"]
    assert asc.has_more is True
    rest = client.responses.input_items.list(created.id, order="asc", limit=2, after=asc.last_id)
    assert [i.role for i in rest.data] == ["assistant", "user"]
    assert rest.has_more is False
    # The SDK's auto-pagination walks the cursor.
    assert len(list(client.responses.input_items.list(created.id, limit=1))) == 4

    deleted = client.responses.delete(created.id)
    assert deleted is None  # the SDK returns None for a 200 delete
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(created.id)
    assert e.value.body["message"] == f"No response found with id '{created.id}'."
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)

    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="demo/mock", input="hi", previous_response_id=created.id)
    assert e.value.code == "previous_response_not_found"
    assert e.value.param == "previous_response_id"


def test_store_false_is_not_kept(gateway):
    client = client_for(gateway.base_url)
    resp = client.responses.create(model="demo/mock", input="hi", store=False, service_tier="auto",
                                   truncation="auto", include=["reasoning.encrypted_content"],
                                   reasoning={"effort": "low"}, user="u1", parallel_tool_calls=False)
    assert resp.store is False
    assert resp.reasoning.effort == "low"
    assert resp.parallel_tool_calls is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_hosted_tools_and_bad_input_are_clear_400s(gateway):
    client = client_for(gateway.base_url)
    for tool in ({"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
                 {"type": "code_interpreter", "container": {"type": "auto"}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="demo/mock", input="hi", tools=[tool])
        assert tool["type"] in e.value.message
        assert e.value.param == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="demo/mock", input=[{"role": "wizard", "content": "x"}])
    assert e.value.param == "input[0].role"


def test_json_schema_text_format(gateway):
    client = client_for(gateway.base_url)
    fmt = {"type": "json_schema", "name": "weather", "strict": True,
           "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                      "additionalProperties": False}}
    resp = client.responses.create(model="demo/mock", input="Weather?", text={"format": fmt},
                                   max_output_tokens=50)
    assert resp.text.format.type == "json_schema"
    assert resp.max_output_tokens == 50
    body = gateway.mock.requests()[-1]["body"]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "weather", "strict": True, "schema": fmt["schema"]}}
    assert body["max_completion_tokens"] == 50


@pytest.mark.parametrize("model", MODELS)
def test_max_output_tokens_is_incomplete(gateway, model):
    client = client_for(gateway.base_url)
    resp = client.responses.create(model=model, input="hi", max_output_tokens=5)
    assert resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output_text == "Hello from the Switchyard mock"
    assert resp.output[0].status == "incomplete"
    assert resp.usage.output_tokens == 5
    events = list(client.responses.create(model=model, input="hi", max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == "Hello from the Switchyard mock"


def test_responses_upstream(gateway):
    """`demo/oai-responses` is an `api: responses` target: the upstream itself gets `/v1/responses`
    with the conversation as items and `store: false` (the state stays in Switchyard)."""
    client = client_for(gateway.base_url)
    model = "demo/oai-responses"
    first = client.responses.create(model=model, input=PROMPT, instructions="Be nice.")
    assert first.output_text == DEFAULT_TEXT
    assert first.usage.input_tokens == prompt_words("Be nice.", PROMPT)
    sent = gateway.mock.requests()[-1]
    assert sent["path"] == "/v1/responses"
    assert sent["body"]["store"] is False
    assert sent["body"]["input"] == [{"role": "system", "content": "Be nice."}, {"role": "user", "content": PROMPT}]
    events = list(client.responses.create(model=model, input="Next?", previous_response_id=first.id, stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == DEFAULT_TEXT
    sent = gateway.mock.requests()[-1]["body"]
    assert "previous_response_id" not in sent
    assert sent["input"] == [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": DEFAULT_TEXT},
                             {"role": "user", "content": "Next?"}]
    call = client.responses.create(model=model, input="Weather?\n#mock tool_calls=1", tools=[WEATHER_TOOL]).output[0]
    assert call.type == "function_call" and call.call_id == "call_mock_0"
    done = client.responses.create(model=model, tools=[WEATHER_TOOL], input=[
        {"role": "user", "content": "Weather?\n#mock tool_calls=1"}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert done.output_text == DEFAULT_TEXT
    assert gateway.mock.requests()[-1]["body"]["input"][1:] == [
        {"type": "function_call", "call_id": "call_mock_0", "name": "get_weather", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": "call_mock_0", "output": "sunny"}]
