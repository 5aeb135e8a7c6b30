"""End-to-end tests with a real model: `switchyard up` with its local model server (SmolLM2-135M on
llama.cpp, `scripts/local_model.py`) behind `local/smollm2-135m`, driven by the official `openai`
SDK. Temperature 0 makes the model deterministic; small `max_tokens` keep the tests fast on one CPU
thread (~50-75 tokens/s). The llama.cpp server decodes one request at a time, which test (c) uses.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import httpx
import openai
import pytest
from openai import OpenAI

from conftest import LOCAL_MODEL, MODEL, Up, start_up, wait_until

PROMPT = "What is an API gateway?"
#: Runs to max_tokens=400 at temperature 0 without an end-of-sequence token (~6-8 s).
LONG_PROMPT = "Write a long essay about the history of railways."
LEDGER_DEADLINE_S = 20.0
#: These tests are about the model server, so they ask the gateway not to answer from its cache
#: (`x-switchyard-cache: bypass`); test (d) is the one about the cache.
NO_CACHE = {"Cache-Control": "no-cache"}
# The gateway's cache lookup timeout is 50 ms; a debug build on a busy CI machine can exceed it on
# the semantic path (embedding), which turns the lookup into a `bypass`. Test (d) checks the cache's
# answers, not its speed (`switchyard cache bench` does), so the processes started here wait longer.
os.environ.setdefault("SWITCHYARD_CACHE_TIMEOUT_MS", "2000")


def client_for(base_url: str) -> OpenAI:
    # max_retries=0: the SDK must not hide a failed request by retrying it.
    return OpenAI(base_url=f"{base_url}/v1", api_key="sk-anything", max_retries=0, timeout=60.0)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def ledger_rows(up: Up, request_id: str) -> dict[str, dict]:
    """The ledger's usage rows of one request, by kind ('upstream' / 'charge')."""
    if not up.ledger_path.exists():
        return {}
    db = sqlite3.connect(f"file:{up.ledger_path}?mode=ro", uri=True, timeout=5.0)
    try:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            "SELECT kind, prompt_tokens, completion_tokens, status, estimated "
            "FROM usage_events WHERE request_id = ?",
            (request_id,),
        ).fetchall()
    finally:
        db.close()
    return {r["kind"]: dict(r) for r in rows}


def wait_ledger(up: Up, request_id: str, kinds: set[str]) -> dict[str, dict]:
    found: dict[str, dict] = {}

    def have_all() -> bool:
        found.clear()
        found.update(ledger_rows(up, request_id))
        return kinds <= set(found)

    wait_until(f"ledger rows {sorted(kinds)} for request {request_id}", have_all,
               LEDGER_DEADLINE_S, [up.proc], interval_s=0.1)
    return found


def model_server_url(up: Up) -> str:
    starts = up.local_model_starts()
    assert starts, "switchyard up did not log `local model ready url=…`"
    return starts[-1][0]


# a ------------------------------------------------------------------------------------------


def test_models_lists_local_model_beside_mock(up_local):
    ids = [m.id for m in client_for(up_local.base_url).models.list().data]
    assert LOCAL_MODEL in ids
    assert MODEL in ids


def test_stream_arrives_in_chunks_and_equals_non_streamed_answer(up_local):
    client = client_for(up_local.base_url)
    resp = client.chat.completions.create(
        model=LOCAL_MODEL, messages=user(PROMPT), temperature=0, max_tokens=24,
        extra_headers=NO_CACHE,
    )
    answer = resp.choices[0].message.content
    assert resp.model == LOCAL_MODEL
    assert answer, "the model answered nothing"

    stream = client.chat.completions.create(
        model=LOCAL_MODEL, messages=user(PROMPT), temperature=0, max_tokens=24, stream=True,
        extra_headers=NO_CACHE,
    )
    deltas, arrivals, finishes = [], [], []
    for chunk in stream:
        assert chunk.model == LOCAL_MODEL
        for choice in chunk.choices:
            if choice.delta is not None and choice.delta.content:
                deltas.append(choice.delta.content)
                arrivals.append(time.monotonic())
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)

    assert len(deltas) >= 5, f"expected the answer in several chunks, got {deltas!r}"
    # Token by token as the model decodes them, not one blob at the end.
    assert arrivals[-1] - arrivals[0] >= 0.05, f"all {len(deltas)} chunks arrived at once"
    assert "".join(deltas) == answer
    assert finishes == [resp.choices[0].finish_reason]


# b ------------------------------------------------------------------------------------------


def test_ledger_usage_equals_model_server_usage(up_local):
    client = client_for(up_local.base_url)
    raw = client.chat.completions.with_raw_response.create(
        model=LOCAL_MODEL, messages=user(PROMPT), temperature=0, max_tokens=24,
        extra_headers=NO_CACHE,
    )
    assert raw.status_code == 200
    assert raw.headers.get("x-switchyard-target") == "local"
    request_id = raw.headers["x-request-id"]
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0

    # The same request straight to the model server reports the same usage.
    direct = httpx.post(
        f"{model_server_url(up_local)}/v1/chat/completions",
        json={"model": "smollm2-135m", "messages": user(PROMPT), "temperature": 0,
              "max_tokens": 24},
        timeout=60.0,
    )
    assert direct.status_code == 200, direct.text
    direct_usage = direct.json()["usage"]
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        direct_usage["prompt_tokens"], direct_usage["completion_tokens"])

    rows = wait_ledger(up_local, request_id, {"upstream", "charge"})
    for kind in ("upstream", "charge"):
        row = rows[kind]
        assert (row["prompt_tokens"], row["completion_tokens"]) == (
            usage.prompt_tokens, usage.completion_tokens), f"{kind} row {row}"
        assert row["status"] == "ok", row
    assert not rows["upstream"]["estimated"], "the model reported usage; nothing to estimate"


# c ------------------------------------------------------------------------------------------


def test_client_disconnect_stops_generation(up_local):
    client = client_for(up_local.base_url)
    with client.chat.completions.with_streaming_response.create(
        model=LOCAL_MODEL, messages=user(LONG_PROMPT), temperature=0, max_tokens=400, stream=True,
        extra_headers=NO_CACHE,
    ) as resp:
        cancelled_id = resp.headers["x-request-id"]
        seen = 0
        for chunk in resp.parse():
            if any(c.delta is not None and c.delta.content for c in chunk.choices):
                seen += 1
                if seen == 3:
                    break
        assert seen == 3
    # Leaving the block closed the connection with ~397 tokens (~5-8 s of decoding) to go. The
    # model server decodes one request at a time: this one is answered promptly only if the
    # cancellation reached it.
    started = time.monotonic()
    stream = client.chat.completions.create(
        model=LOCAL_MODEL, messages=user(PROMPT), temperature=0, max_tokens=8, stream=True,
        extra_headers=NO_CACHE,
    )
    ttft = None
    for chunk in stream:
        if ttft is None and any(c.delta is not None and c.delta.content for c in chunk.choices):
            ttft = time.monotonic() - started
    assert ttft is not None, "the follow-up request streamed no content"
    assert ttft < 3.0, f"time to first token after the disconnect was {ttft:.2f} s"

    # The worker recorded the aborted upstream call as cancelled, well short of 400 tokens.
    rows = wait_ledger(up_local, cancelled_id, {"upstream"})
    upstream = rows["upstream"]
    assert upstream["status"] == "cancelled", upstream
    assert upstream["completion_tokens"] < 200, upstream


# d ------------------------------------------------------------------------------------------


def test_second_identical_request_is_a_cache_hit(up_local):
    client = client_for(up_local.base_url)
    prompt = user("Name the largest planet of the solar system.")
    first = client.chat.completions.with_raw_response.create(
        model=LOCAL_MODEL, messages=prompt, temperature=0, max_tokens=24
    )
    second = client.chat.completions.with_raw_response.create(
        model=LOCAL_MODEL, messages=prompt, temperature=0, max_tokens=24
    )
    assert first.headers.get("x-switchyard-cache") == "miss"
    assert second.headers.get("x-switchyard-cache") == "hit"
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    # Without reaching the model: the ledger charges the request but has no upstream call for it.
    second_id = second.headers["x-request-id"]
    rows = wait_ledger(up_local, second_id, {"charge"})
    assert "upstream" not in rows, rows


# e ------------------------------------------------------------------------------------------


def test_model_server_restarted_after_crash(up_local):
    """Runs last in this module: it kills the model server under the shared gateway."""
    client = client_for(up_local.base_url)
    before = client.chat.completions.create(
        model=LOCAL_MODEL, messages=user(PROMPT), temperature=0, max_tokens=12,
        extra_headers=NO_CACHE,
    ).choices[0].message.content
    starts = up_local.local_model_starts()
    url, pid = starts[-1]
    os.kill(pid, signal.SIGKILL)
    wait_until("switchyard up to restart the local model server",
               lambda: len(up_local.local_model_starts()) > len(starts), 30.0, [up_local.proc])
    new_url, new_pid = up_local.local_model_starts()[-1]
    assert new_pid != pid
    assert new_url == url, "a restarted server keeps its port (the worker resolved it at start-up)"
    after = client.chat.completions.create(
        model=LOCAL_MODEL, messages=user(PROMPT), temperature=0, max_tokens=12,
        extra_headers=NO_CACHE,
    ).choices[0].message.content
    assert after == before


def test_no_local_model_flag_hides_the_model(procs, tmp_path):
    up = start_up(procs, tmp_path / "data", "--no-local-model")
    assert "local model disabled (--no-local-model)" in up.proc.log()
    assert up.local_model_starts() == []
    client = client_for(up.base_url)
    ids = [m.id for m in client.models.list().data]
    assert MODEL in ids
    assert LOCAL_MODEL not in ids
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model=LOCAL_MODEL, messages=user(PROMPT))
    assert info.value.code == "model_not_found"
