"""Batch jobs as SDK users run them, unmodified: the `openai` SDK's documented Batch API flow
(files.create → batches.create → poll batches.retrieve → files.content of the output and error
files) for 200 requests with 2 made to fail upstream, and the `anthropic` SDK's
messages.batches flow for 20 requests, against the gateway's processes and the mock upstream."""

from __future__ import annotations

import io
import json
import time

import anthropic
from openai import OpenAI

from conftest import DEFAULT_TEXT, MODEL

POLL_DEADLINE_S = 120.0


def poll(fetch, done, what: str):
    deadline = time.monotonic() + POLL_DEADLINE_S
    while True:
        obj = fetch()
        if done(obj):
            return obj
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not finish: {obj}")
        time.sleep(0.25)


def test_openai_sdk_batch_flow_200_requests_2_failing(gateway):
    client = OpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-test", max_retries=0, timeout=30.0)
    lines = []
    for i in range(200):
        # Two items fail upstream with a 400 (the mock's `status` directive): not retried.
        content = "#mock status=400\nfail" if i in (17, 150) else f"question {i}"
        lines.append(json.dumps({
            "custom_id": f"item-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 32},
        }))
    upload = client.files.create(file=("input.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    assert upload.purpose == "batch"
    assert upload.id.startswith("file-")

    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"suite": "e2e"})
    assert batch.status in ("validating", "in_progress")
    assert batch.request_counts.total == 200
    done = poll(lambda: client.batches.retrieve(batch.id),
                lambda b: b.status in ("completed", "failed", "expired", "cancelled"), "batch")
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (200, 198, 2)
    assert done.metadata == {"suite": "e2e"}
    assert done.completed_at >= done.created_at

    output = [json.loads(l) for l in client.files.content(done.output_file_id).text.splitlines()]
    errors = [json.loads(l) for l in client.files.content(done.error_file_id).text.splitlines()]
    assert len(output) == 198 and len(errors) == 2
    assert sorted(e["custom_id"] for e in errors) == ["item-150", "item-17"]
    for e in errors:
        assert e["response"]["status_code"] == 400
        assert e["response"]["body"]["error"]["type"] == "invalid_request_error"
    ids = {o["custom_id"] for o in output}
    assert len(ids) == 198 and "item-17" not in ids
    for o in output:
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == DEFAULT_TEXT
        assert body["model"] == MODEL

    listed = client.batches.list(limit=10)
    assert listed.data[0].id == batch.id


def test_anthropic_sdk_message_batches_20_requests(gateway):
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key="sk-test", max_retries=0)
    requests = [
        {"custom_id": f"q-{i}", "params": {"model": "demo/claude", "max_tokens": 64,
                                          "messages": [{"role": "user", "content": f"Hello {i}"}]}}
        for i in range(20)
    ]
    batch = client.messages.batches.create(requests=requests)
    assert batch.type == "message_batch"
    assert batch.processing_status == "in_progress"
    done = poll(lambda: client.messages.batches.retrieve(batch.id),
                lambda b: b.processing_status == "ended", "message batch")
    assert done.request_counts.succeeded == 20
    assert done.request_counts.errored == 0
    results = list(client.messages.batches.results(batch.id))
    assert sorted(r.custom_id for r in results) == sorted(f"q-{i}" for i in range(20))
    for r in results:
        assert r.result.type == "succeeded"
        assert r.result.message.content[0].text == DEFAULT_TEXT
    page = client.messages.batches.list(limit=5)
    assert page.data[0].id == batch.id


def test_cli_batch_submit_wait_and_results(gateway, tmp_path):
    import subprocess

    from conftest import switchyard_bin

    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps({
        "custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    }) for i in range(5)))
    env = {"SWITCHYARD_URL": gateway.base_url, "PATH": "/usr/bin:/bin"}
    run = subprocess.run([switchyard_bin(), "batch", "submit", str(src), "--wait"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    batch = json.loads(run.stdout)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    out = tmp_path / "out.jsonl"
    run = subprocess.run([switchyard_bin(), "batch", "results", batch["id"], "--out", str(out)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert sorted(r["custom_id"] for r in rows) == [f"c{i}" for i in range(5)]
