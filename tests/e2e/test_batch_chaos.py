"""A 1,000-item batch survives the loss of each service in turn, as separate processes: the worker
is SIGKILLed and restarted, then the billing consumer, then nats-server itself (same port, same
JetStream directory). The batch completes with 1,000 results, one per `custom_id`, and the
ledger holds exactly one `ok` charge per item, at the batch rate."""

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

pytestmark = pytest.mark.config_extra('pricing_file: "@TMP@/catalog.yaml"\n',
                                      files={"catalog.yaml": CATALOG})

ITEMS = 1000


def test_batch_survives_worker_billing_and_nats_restarts(gateway, tmp_path):
    client = OpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-test", max_retries=3, timeout=30.0)
    lines = [json.dumps({
        "custom_id": f"i{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [
            {"role": "user", "content": "#mock ttft_ms=40 prompt_tokens=10 completion_tokens=2\nhi"}]},
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

    procs, nats = gateway.procs, gateway.nats
    # 1. The worker.
    wait_until("300 items done", lambda: done() >= 300, 120, [gateway.ingress])
    gateway.kill_worker(gateway.workers[0])
    worker = procs.start("worker-restarted", gateway.workers[0].args)
    # 2. The billing consumer.
    wait_until("500 items done", lambda: done() >= 500, 120, [gateway.ingress, worker])
    gateway.billing.sigkill()
    billing = procs.start("billing-restarted", gateway.billing.args)
    # 3. nats-server: same port and store.
    wait_until("700 items done", lambda: done() >= 700, 120, [gateway.ingress, worker, billing])
    nats.proc.sigkill()
    nats2 = procs.start("nats-server-restarted", nats.proc.args)
    wait_until("nats-server back", lambda: http_ok(f"{nats.monitor_url}/healthz"), START_DEADLINE_S, [nats2])

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

    # The ledger: exactly one ok charge per item, at the batch rate ((10 × 2.5 + 2 × 10) / 1M / 2).
    ledger = tmp_path / "ledger.db"

    def ok_charges() -> list:
        con = sqlite3.connect(ledger)
        try:
            return con.execute(
                "SELECT request_id, cost_usd FROM usage_events "
                "WHERE batch_id = ? AND kind = 'charge' AND status = 'ok'", (batch.id,)).fetchall()
        finally:
            con.close()

    wait_until("1,000 ok charges in the ledger", lambda: len(ok_charges()) >= ITEMS, 60, [billing])
    rows = ok_charges()
    assert len(rows) == ITEMS
    assert len({r[0] for r in rows}) == ITEMS
    assert sum(Decimal(r[1]) for r in rows) == Decimal("0.0225")
    # Provider side: an answer lost with nats-server (the upstream call completed, its reply never
    # reached ingress) is re-run under a new request id, so the provider may have served a few
    # items twice — at most the items in flight (batch.max_in_flight = 16) — but the tenant is
    # charged once per item (above).
    con = sqlite3.connect(ledger)
    try:
        upstream_ok = con.execute(
            "SELECT COUNT(*) FROM usage_events WHERE batch_id = ? AND kind = 'upstream' "
            "AND status = 'ok'", (batch.id,)).fetchone()[0]
    finally:
        con.close()
    assert ITEMS <= upstream_ok <= ITEMS + 16, upstream_ok
    assert httpx.get(f"{gateway.base_url}/healthz", timeout=5).status_code == 200
