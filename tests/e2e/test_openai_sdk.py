"""End-to-end tests with the official `openai` Python SDK against real switchyard processes."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from openai import OpenAI

from conftest import DEFAULT_COMPLETION_TOKENS, DEFAULT_TEXT, MODEL, prompt_words

PROMPT = "Say hello to the gateway please"


def client_for(base_url: str) -> OpenAI:
    # max_retries=0: the SDK must not hide a failed request by retrying it.
    return OpenAI(base_url=f"{base_url}/v1", api_key="sk-anything", max_retries=0, timeout=30.0)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def collect_stream(stream) -> tuple[list, list[str], list]:
    """(all chunks, the non-empty content deltas, the finish reasons seen)."""
    chunks, deltas, finishes = [], [], []
    for chunk in stream:
        chunks.append(chunk)
        for choice in chunk.choices:
            if choice.delta is not None and choice.delta.content:
                deltas.append(choice.delta.content)
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    return chunks, deltas, finishes


# 1 ------------------------------------------------------------------------------------------


def test_non_streamed_completion(gateway):
    client = client_for(gateway.base_url)
    resp = client.chat.completions.create(model=MODEL, messages=user(PROMPT))

    assert resp.object == "chat.completion"
    assert resp.model == MODEL
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == DEFAULT_TEXT
    assert choice.finish_reason == "stop"

    assert resp.usage is not None
    assert resp.usage.prompt_tokens == prompt_words(PROMPT) == 6
    assert resp.usage.completion_tokens == DEFAULT_COMPLETION_TOKENS == 13
    assert resp.usage.total_tokens == 6 + 13


# 2 ------------------------------------------------------------------------------------------


def test_streamed_completion(gateway):
    client = client_for(gateway.base_url)
    stream = client.chat.completions.create(model=MODEL, messages=user(PROMPT), stream=True)
    chunks, deltas, finishes = collect_stream(stream)

    assert "".join(deltas) == DEFAULT_TEXT
    assert len(deltas) > 1, f"expected the text in several chunks, got {deltas!r}"
    assert finishes, "no chunk carried a finish_reason"
    assert finishes[-1] == "stop"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.model == MODEL for c in chunks)
    assert len({c.id for c in chunks}) == 1, "all chunks of one completion share its id"
    # Usage was not asked for: no chunk may carry it, and every chunk has a choice.
    assert all(c.usage is None for c in chunks), [c.usage for c in chunks if c.usage is not None]
    assert all(len(c.choices) == 1 for c in chunks)


# 3 ------------------------------------------------------------------------------------------


def test_streamed_completion_with_usage(gateway):
    client = client_for(gateway.base_url)
    stream = client.chat.completions.create(
        model=MODEL, messages=user(PROMPT), stream=True, stream_options={"include_usage": True}
    )
    chunks, deltas, finishes = collect_stream(stream)

    assert "".join(deltas) == DEFAULT_TEXT
    assert finishes[-1] == "stop"
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens == prompt_words(PROMPT)
    assert last.usage.completion_tokens == DEFAULT_COMPLETION_TOKENS
    assert last.usage.total_tokens == prompt_words(PROMPT) + DEFAULT_COMPLETION_TOKENS
    # OpenAI: every other chunk has `usage: null`.
    assert all(c.usage is None for c in chunks[:-1])


# 4 ------------------------------------------------------------------------------------------


def _served_by(client: OpenAI, n: int) -> list[str]:
    def one(i: int) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=user(f"request number {i}")
        )
        completion = raw.parse()
        assert raw.status_code == 200
        assert completion.choices[0].message.content == DEFAULT_TEXT
        assert completion.choices[0].finish_reason == "stop"
        assert raw.headers.get("x-switchyard-target") == "mock"
        assert raw.headers.get("x-request-id")
        worker = raw.headers.get("x-switchyard-worker")
        assert worker, "response without x-switchyard-worker"
        return worker

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, range(n)))


@pytest.mark.workers(2)
def test_two_workers_share_load_and_survive_a_kill(gateway):
    client = client_for(gateway.base_url)
    first, second = gateway.workers
    ids = {gateway.worker_id(first), gateway.worker_id(second)}
    assert len(ids) == 2

    served = _served_by(client, 200)
    assert len(served) == 200
    counts = Counter(served)
    assert set(counts) == ids, f"requests were served by {dict(counts)}, workers are {ids}"

    gateway.kill_worker(first)
    survivor = gateway.worker_id(second)

    served = _served_by(client, 100)
    assert len(served) == 100
    assert Counter(served) == Counter({survivor: 100})


# 5 ------------------------------------------------------------------------------------------


def test_unknown_model_is_openai_404(gateway):
    client = client_for(gateway.base_url)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope/not-a-model", messages=user(PROMPT))
    e = info.value
    assert e.status_code == 404
    # The SDK stores the `error` object of the body in `e.body`.
    assert isinstance(e.body, dict)
    assert e.body["code"] == "model_not_found"
    assert e.code == "model_not_found"
    assert e.body["type"] == "invalid_request_error"
    assert "nope/not-a-model" in e.body["message"]


def test_bad_temperature_is_openai_400(gateway):
    client = client_for(gateway.base_url)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=user(PROMPT), temperature=5)
    e = info.value
    assert e.status_code == 400
    assert isinstance(e.body, dict)
    assert e.body["param"] == "temperature"
    assert e.param == "temperature"
    assert e.body["type"] == "invalid_request_error"


# 6 ------------------------------------------------------------------------------------------


def test_switchyard_up_smoke(up):
    assert httpx.get(f"{up.base_url}/healthz", timeout=5.0).status_code == 200
    client = client_for(up.base_url)
    stream = client.chat.completions.create(model=MODEL, messages=user(PROMPT), stream=True)
    chunks, deltas, finishes = collect_stream(stream)
    assert "".join(deltas) == DEFAULT_TEXT
    assert len(deltas) > 1
    assert finishes[-1] == "stop"


# 7 ------------------------------------------------------------------------------------------


def test_fc03_compact_sse(gateway):
    """The upstream writes `data:{...}` / `data:[DONE]` without the optional space (valid SSE);
    the gateway must parse it like the spaced form."""
    client = client_for(gateway.base_url)
    stream = client.chat.completions.create(
        model=MODEL, messages=user("Answer briefly\n#mock compact=1 text=Hi"), stream=True
    )
    chunks, deltas, finishes = collect_stream(stream)
    assert "".join(deltas) == "Hi"
    assert finishes and finishes[-1] == "stop"
    # The directive really reached the mock on a streamed upstream call.
    upstream = [r for r in gateway.mock.requests() if "compact=1" in str(r["body"])]
    assert len(upstream) == 1
    assert upstream[0]["body"].get("stream") is True


# n > 1 --------------------------------------------------------------------------------------

N2_PROMPT = "Two answers please\n#mock texts=Hi+there|Bye"


def test_n2_with_logprobs(gateway):
    """`n=2, logprobs=True, top_logprobs=2`: two choices with their own index, content, finish
    reason and logprob tokens (the mock's alternatives: the token itself, then `alt1`)."""
    client = client_for(gateway.base_url)
    resp = client.chat.completions.create(
        model=MODEL, messages=user(N2_PROMPT), n=2, logprobs=True, top_logprobs=2
    )
    assert len(resp.choices) == 2
    assert [c.index for c in resp.choices] == [0, 1]
    assert [c.message.content for c in resp.choices] == ["Hi there", "Bye"]
    assert [c.finish_reason for c in resp.choices] == ["stop", "stop"]
    tokens = [[t.token for t in c.logprobs.content] for c in resp.choices]
    assert tokens == [["Hi ", "there"], ["Bye"]]
    assert [[a.token for a in t.top_logprobs] for t in resp.choices[0].logprobs.content] == [
        ["Hi ", "alt1"],
        ["there", "alt1"],
    ]
    assert resp.choices[1].logprobs.content[0].logprob == -0.5
    assert resp.usage.prompt_tokens == prompt_words(N2_PROMPT)
    assert resp.usage.completion_tokens == 3

    stream = client.chat.completions.create(
        model=MODEL,
        messages=user(N2_PROMPT),
        n=2,
        logprobs=True,
        top_logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    text: dict[int, str] = {}
    lp_tokens: dict[int, list[str]] = {}
    finishes: dict[int, str] = {}
    chunks = list(stream)
    for chunk in chunks[:-1]:
        assert len(chunk.choices) == 1, "OpenAI streams one choice per chunk"
        c = chunk.choices[0]
        text[c.index] = text.get(c.index, "") + (c.delta.content or "")
        if c.logprobs is not None and c.logprobs.content:
            lp_tokens.setdefault(c.index, []).extend(t.token for t in c.logprobs.content)
            assert all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
        if c.finish_reason is not None:
            finishes[c.index] = c.finish_reason
    assert len(text) == 2
    assert text == {0: "Hi there", 1: "Bye"}
    assert lp_tokens == {0: ["Hi ", "there"], 1: ["Bye"]}
    assert finishes == {0: "stop", 1: "stop"}
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 3
