"""A 1,000-item batch survives the loss of each service in turn, as separate processes: the worker
is SIGKILLed and restarted, then the billing consumer, then nats-server itself (same port, same
JetStream directory), then the ingress that runs the batch. The batch completes with 1,000
results, one per `custom_id`; after each restart every `charge` row of the batch is `ok` and
names a distinct item, and at the end the ledger holds exactly 1,000 `charge` rows — the
request ids of the 1,000 results — summing to the exact batch-rate cost. The provider saw at
most the items plus one in-flight window (`batch.max_in_flight`) per restart that can lose
answers in flight (worker, nats-server, ingress)."""

from __future__ import annotations

import io
import json
import sqlite3
import time
from decimal import Decimal

import httpx
from openai import OpenAI

from conftest import MODEL, START_DEADLINE_S, http_ok, nats_server_bin, wait_until
import pytest

CATALOG = """\
currency: USD
as_of: 2026-12-01
upstream:
  mock: {input: 2.5, output: 10, batch_discount: 0.5}
standard:
  demo/mock: {input: 2.5, output: 10, batch_discount: 0.5}
"""

WINDOW = 16  # batch.max_in_flight
pytestmark = pytest.mark.config_extra(
    'pricing_file: "@TMP@/catalog.yaml"\n'
    f"batch: {{max_in_flight: {WINDOW}, ack_wait_s: 5}}\n",
    files={"catalog.yaml": CATALOG})

ITEMS = 1000
PROMPT = "#mock ttft_ms=40 prompt_tokens=10 completion_tokens=2\nhi"


def test_batch_survives_worker_billing_and_nats_restarts(gateway, tmp_path):
    client = OpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-test", max_retries=3, timeout=30.0)
    lines = [json.dumps({
        "custom_id": f"i{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [
            {"role": "user", "content": PROMPT}]},
    }) for i in range(ITEMS)]
    f = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")

    def done() -> int:
        try:
            b = client.batches.retrieve(batch.id)
        except Exception:  # noqa: BLE001 - NATS may be restarting
            return -1
        return b.request_counts.completed + b.request_counts.failed

    ledger = tmp_path / "ledger.db"

    def charges() -> list:
        con = sqlite3.connect(ledger)
        try:
            return con.execute(
                "SELECT request_id, status, cost_usd FROM usage_events "
                "WHERE batch_id = ? AND kind = 'charge'", (batch.id,)).fetchall()
        finally:
            con.close()

    def billed_once_so_far(after: str) -> None:
        rows = charges()
        assert all(r[1] == "ok" for r in rows), f"after the {after} restart: {rows}"
        assert len({r[0] for r in rows}) == len(rows) <= ITEMS, after

    procs, nats = gateway.procs, gateway.nats
    # 1. The worker.
    wait_until("300 items done", lambda: done() >= 300, 120, [gateway.ingress])
    gateway.kill_worker(gateway.workers[0])
    worker = procs.start("worker-restarted", gateway.workers[0].args)
    # 2. The billing consumer.
    wait_until("500 items done", lambda: done() >= 500, 120, [gateway.ingress, worker])
    billed_once_so_far("worker")
    gateway.billing.sigkill()
    billing = procs.start("billing-restarted", gateway.billing.args)
    # 3. nats-server: same port and store.
    wait_until("650 items done", lambda: done() >= 650, 120, [gateway.ingress, worker, billing])
    billed_once_so_far("billing")
    nats.proc.sigkill()
    nats2 = procs.start("nats-server-restarted", nats.proc.args)
    wait_until("nats-server back", lambda: http_ok(f"{nats.monitor_url}/healthz"), START_DEADLINE_S, [nats2])
    # 4. The ingress running the batch (SIGKILL: its items in flight are redelivered after
    # `ack_wait_s`), restarted on the same address.
    wait_until("800 items done", lambda: done() >= 800, 120, [gateway.ingress, worker, billing, nats2])
    billed_once_so_far("nats-server")
    gateway.ingress.sigkill()
    ingress = procs.start("ingress-restarted", gateway.ingress.args)
    wait_until("ingress back", lambda: http_ok(f"{gateway.base_url}/healthz"), START_DEADLINE_S, [ingress])

    deadline = time.monotonic() + 180
    while True:
        try:
            b = client.batches.retrieve(batch.id)
            if b.status in ("completed", "failed", "expired", "cancelled"):
                break
        except Exception:  # noqa: BLE001 - reconnecting
            pass
        assert time.monotonic() < deadline, "batch did not finish"
        time.sleep(0.5)
    assert b.status == "completed", b
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (ITEMS, ITEMS, 0)
    out = [json.loads(l) for l in client.files.content(b.output_file_id).text.splitlines()]
    assert len(out) == ITEMS
    assert len({o["custom_id"] for o in out}) == ITEMS

    # The ledger: exactly one charge per item — the one its result names — and none for the
    # tries that failed while a service was away, at the batch rate ((10 × 2.5 + 2 × 10) / 1M / 2).
    wait_until("1,000 charges in the ledger", lambda: len(charges()) >= ITEMS, 60, [billing])
    rows = charges()
    assert len(rows) == ITEMS
    assert all(r[1] == "ok" for r in rows)
    assert {r[0] for r in rows} == {o["response"]["request_id"] for o in out}
    assert sum(Decimal(r[2]) for r in rows) == Decimal("0.0225")
    # Provider side: an item whose result was stored is never dispatched again; a call whose
    # answer was lost with the worker, nats-server or the ingress is re-run (same request id, a
    # later attempt number), so the provider may have served up to one in-flight window of items
    # twice per such restart — billed once all the same (above).
    marker = PROMPT.splitlines()[0]
    calls = sum(1 for r in gateway.mock.requests() if marker in json.dumps(r.get("body")))
    # One window per worker and ingress restart, two for the nats-server restart.
    assert ITEMS <= calls <= ITEMS + 4 * WINDOW, calls
    def upstream_ok():
        con = sqlite3.connect(ledger)
        try:
            return con.execute(
                "SELECT COUNT(*) FROM usage_events WHERE batch_id = ? AND kind = 'upstream' "
                "AND status = 'ok'", (batch.id,)).fetchone()[0]
        finally:
            con.close()

    # A worker's `upstream` event rides its own group-committed publisher (spooled while NATS was
    # away), independent of ingress's charge: it may reach the ledger after the last charge.
    wait_until("1,000 upstream events in the ledger", lambda: upstream_ok() >= ITEMS, 60, [billing])
    assert ITEMS <= upstream_ok() <= calls, (upstream_ok(), calls)
    assert httpx.get(f"{gateway.base_url}/healthz", timeout=5).status_code == 200
