"""Scaling on the local cluster of `scripts/cluster` (docs/BENCHMARKS.md, "Scaling out"):

1. Throughput with 1, 2 and 3 workers. The mock target has `limits.max_concurrency: CAP`
   (in-flight requests per worker process; beyond it a worker answers 429 `rate_limited` at
   once) and every upstream call takes LATENCY ms, so one worker serves at most CAP / LATENCY
   requests per second. CLIENTS closed-loop clients (alternating between the two ingress; a 429
   is retried after 20 ms) keep every worker saturated; the `x-switchyard-worker` header of each
   answer shows how the queue group `workers.openai` spread the load.
2. Budgets across the two ingress: a key with `tokens_per_day: QUOTA` gets REQUESTS concurrent
   requests (alternating between the ingress ports); the ledger's token sum for the key must be
   the admitted requests' usage exactly and never above the quota.

    .tools/venv/bin/python scripts/cluster_scale.py [--cap 4] [--latency-ms 200] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "scripts" / "cluster"
LOAD_KEY = "sk-scale-load-0123456789abcdef"
QUOTA_KEY = "sk-scale-quota-0123456789abcdef"


def free_base() -> int:
    """A port block nobody listens on (ports in TIME_WAIT are fine: the servers bind with
    SO_REUSEADDR too)."""
    for base in range(20000 + (os.getpid() % 200) * 100, 60000, 100):
        try:
            for off in (1, 2, 3, 11, 12, 13, 21, 22, 23, 31, 32, 40):
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", base + off))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port block")


class Cluster:
    def __init__(self, dir: Path, base: int, db: str, cap: int, extra: Path):
        self.dir, self.base, self.db = dir, base, db
        self.env = {**os.environ, "SY_CLUSTER_PORT": str(base), "SY_CLUSTER_DB": db,
                    "SY_CLUSTER_MAX_CONCURRENCY": str(cap), "SY_CLUSTER_CONFIG_EXTRA": str(extra)}
        self.urls = [f"http://127.0.0.1:{base + 31}", f"http://127.0.0.1:{base + 32}"]

    def run(self, *args: str) -> str:
        r = subprocess.run([str(CLUSTER), *args, str(self.dir)], env=self.env, capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"scripts/cluster {' '.join(args)}: {r.stderr}{r.stdout}")
        return r.stdout

    def psql(self, sql: str) -> str:
        return subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", self.db, "-tA"],
                              input=sql, check=True, capture_output=True, text=True, timeout=30).stdout.strip()


async def throughput(c: Cluster, clients: int, seconds: float, latency_ms: int) -> dict:
    body = {"model": "demo/mock", "max_tokens": 10, "messages": [
        {"role": "user", "content": f"#mock ttft_ms={latency_ms} prompt_tokens=10 completion_tokens=10\nscale"}]}
    headers = {"authorization": f"Bearer {LOAD_KEY}", "cache-control": "no-cache, no-store"}
    stats = {"ok": 0, "rate_limited": 0, "other": 0, "workers": {}}
    end = time.monotonic() + seconds

    async def client(i: int, http: httpx.AsyncClient):
        n = i
        while time.monotonic() < end:
            r = await http.post(f"{c.urls[n % 2]}/v1/chat/completions", json=body, headers=headers)
            n += 1
            if r.status_code == 200:
                stats["ok"] += 1
                w = r.headers.get("x-switchyard-worker", "?")
                stats["workers"][w] = stats["workers"].get(w, 0) + 1
            elif r.status_code == 429:
                stats["rate_limited"] += 1
                await asyncio.sleep(0.02)  # back-off of the closed-loop client, not synchronisation
            else:
                stats["other"] += 1
                await asyncio.sleep(0.02)

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=clients * 2)) as http:
        await asyncio.gather(*(client(i, http) for i in range(clients)))
    stats["rps"] = stats["ok"] / seconds
    return stats


async def budget(c: Cluster, requests: int, quota: int, concurrency: int) -> dict:
    body = {"model": "demo/mock", "max_tokens": 10, "messages": [
        {"role": "user", "content": "#mock prompt_tokens=10 completion_tokens=10\nbudget"}]}
    headers = {"authorization": f"Bearer {QUOTA_KEY}", "cache-control": "no-cache, no-store"}
    # At most the workers' total cap in flight, so every refusal is the budget's, not a worker's.
    gate = asyncio.Semaphore(concurrency)

    async def one(http: httpx.AsyncClient, i: int) -> httpx.Response:
        async with gate:
            return await http.post(f"{c.urls[i % 2]}/v1/chat/completions", json=body, headers=headers)

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency * 2)) as http:
        rs = await asyncio.gather(*(one(http, i) for i in range(requests)))
    errors: dict[str, int] = {}
    for r in rs:
        if r.status_code != 200:
            code = f"{r.status_code} {r.json().get('error', {}).get('code') or r.json().get('error', {}).get('type')}"
            errors[code] = errors.get(code, 0) + 1
    admitted = [r.headers["x-request-id"] for r in rs if r.status_code == 200]
    by_port = {u: sum(1 for i, r in enumerate(rs) if r.status_code == 200 and i % 2 == k)
               for k, u in enumerate(c.urls)}
    deadline = time.monotonic() + 60
    while True:
        n = int(c.psql("SELECT count(*) FROM usage_events WHERE kind='charge' AND key_id='quota' "
                       "AND prompt_tokens + completion_tokens > 0"))
        if n >= len(admitted) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)  # billing drains the usage stream asynchronously
    tokens = int(c.psql("SELECT coalesce(sum(prompt_tokens + completion_tokens), 0) FROM usage_events "
                        "WHERE kind='charge' AND key_id='quota'"))
    return {"sent": requests, "succeeded": len(admitted), "refused": errors, "charged_rows": n,
            "ledger_tokens": tokens, "quota": quota, "by_port": by_port}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cap", type=int, default=4, help="max_concurrency per worker")
    ap.add_argument("--latency-ms", type=int, default=200, help="upstream time of one request, ms")
    ap.add_argument("--seconds", type=float, default=10.0, help="load per worker count")
    ap.add_argument("--clients", type=int, default=0, help="closed-loop clients (default 2 x 3 x cap)")
    ap.add_argument("--budget-requests", type=int, default=300)
    ap.add_argument("--quota", type=int, default=2000, help="tokens_per_day of the budget key")
    ap.add_argument("--dir", help="cluster dir (default: a temporary one, removed)")
    a = ap.parse_args()
    clients = a.clients or 2 * 3 * a.cap
    tmp = tempfile.TemporaryDirectory(prefix="sy-scale-")
    dir = Path(a.dir or tmp.name) / "cluster"
    extra = Path(tmp.name) / "extra.yaml"
    extra.write_text(f"keys:\n  - {{id: load, tenant: scale, key: {LOAD_KEY}}}\n"
                     f"  - {{id: quota, tenant: scale, key: {QUOTA_KEY}, budget: {{tokens_per_day: {a.quota}}}}}\n")
    c = Cluster(dir, free_base(), f"sy_scale_{uuid.uuid4().hex[:12]}", a.cap, extra)
    try:
        c.run("up")
        c.run("stop", "worker2")
        print(f"max_concurrency {a.cap} per worker, upstream {a.latency_ms} ms, {clients} closed-loop clients, "
              f"{a.seconds:.0f} s per step; ceiling per worker {a.cap * 1000 / a.latency_ms:.0f} rps\n")
        print("| workers | succeeded/s | ceiling/s | 429 (worker at its cap) | answers per worker |")
        print("|---|---|---|---|---|")
        for n, start in ((1, None), (2, "worker2"), (3, "worker3")):
            if start:
                c.run("start", start)
            s = asyncio.run(throughput(c, clients, a.seconds, a.latency_ms))
            spread = " / ".join(str(v) for v in sorted(s["workers"].values(), reverse=True))
            print(f"| {n} | {s['rps']:.0f} | {n * a.cap * 1000 / a.latency_ms:.0f} | {s['rate_limited']} "
                  f"| {spread} |", flush=True)
        b = asyncio.run(budget(c, a.budget_requests, a.quota, 3 * a.cap))
        print(f"\nbudget across both ingress ({3 * a.cap} in flight): {b}")
        # Exact: the ledger holds each succeeded request's 20 tokens once, and never more than the quota.
        ok = b["ledger_tokens"] == b["succeeded"] * 20 <= b["quota"] and b["charged_rows"] == b["succeeded"]
        print("budget exact: " + ("yes" if ok else "NO"))
    finally:
        subprocess.run([str(CLUSTER), "down", str(dir)], env=c.env, capture_output=True, timeout=120)
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f'DROP DATABASE IF EXISTS "{c.db}"'],
                       capture_output=True, timeout=30)
        tmp.cleanup()


if __name__ == "__main__":
    main()
