"""Chaos suite on the local cluster of `scripts/cluster` (three clustered nats-servers with
JetStream at R3, two ingress, two workers, cache, billing on PostgreSQL) under a steady load of
streamed chat requests (RATE per second, alternating between both ingress). Faults, one per
scenario, in this order:

* `nats-node`:     SIGKILL of one NATS server of three (`n2`), restarted on its store 5 s later;
* `stream-leader`: SIGKILL of the NATS server that leads the usage stream `SY_USAGE_WQ` (from
                   the nodes' `/jsz?streams=true`), restarted 5 s later;
* `worker`:        SIGKILL of the worker answering at that moment, restarted 5 s later;
* `billing`:       SIGTERM of the billing consumer, restarted 3 s later;
* `ingress`:       SIGTERM of `ingress1` (it drains), restarted at once (it takes a few s);
* `partition`:     `n3` cut from both other nodes for 10 s (every route link of n3 runs through
                   a TCP forwarder of this test, `SY_CLUSTER_PARTITIONABLE`; its clients still
                   reach it, as on a node whose cluster network failed);
* `postgres`:      PostgreSQL unreachable for billing for 60 s (billing reaches it through a TCP
                   forwarder of this test, `SY_CLUSTER_PG_PORT`, which refuses connections and
                   resets the open ones: the machine's PostgreSQL is shared with other tests and
                   is never stopped).

The load client acts as a load balancer in front of the two ingress would: a connection refused
(nothing sent) goes to the other ingress (`rerouted`). Each request ends as `ok` (200, the stream
ends with a finish_reason and `[DONE]`), `failed` (an HTTP error with an OpenAI error body, or a
stream that ends with an `error` event), or `lost` (no answer: a transport error, a client
timeout, or a stream cut without an error). Admitted = requests that got an `x-request-id`. For
every scenario: lost = 0, the ledger's `charge` rows are exactly the admitted request ids (no
loss, no duplicates), and no request takes longer than SLOWEST_S (never a hang). The table is
printed and written to $SY_CHAOS_TABLE when set (docs/chaos.md holds a copy).

`switchyard bench` starts its own gateway (`--dir`), it cannot target a running cluster: the
load comes from this test's own loop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from conftest import MODEL, REPO_ROOT, switchyard_bin, nats_server_bin, wait_until
from tcp_forwarder import Forwarder

# Every request must reach a worker: the cache would answer a repeated prompt.
NO_CACHE = {"cache-control": "no-cache, no-store"}

RATE = 50          # requests per second
DURATION_S = 14.0  # load per scenario (longer where the fault lasts longer)
FAULT_AT_S = 3.0   # fault after this much load
CLIENT_TIMEOUT_S = 30.0
# ~1 s streams (10 chunks, 100 ms apart), so a worker kill finds requests mid-stream.
PROMPT = "#mock chunks=10 chunk_delay_ms=100 prompt_tokens=10 completion_tokens=10\nhi"
# The longest any request may take: a stream on a killed worker ends after
# `timeouts.worker_silence_ms` (5 s) of silence, plus its own ~1 s, plus slack for 2 cores.
SLOWEST_S = 10.0
PG_OUTAGE_S = 60.0  # the 60 s
CLUSTER = REPO_ROOT / "scripts" / "cluster"
# scripts/cluster port offsets (its header): the PostgreSQL forwarder, n3's route forwarders.
PG_FORWARDER = 45
ROUTE_FORWARDERS = {51: 11, 52: 12, 53: 13}
USAGE_STREAM = "SY_USAGE_WQ"


def psql(db: str, sql: str) -> str:
    # On stdin: a list of thousands of request ids is longer than one argument may be.
    return subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-tA", "-v", "ON_ERROR_STOP=1"],
                          input=sql, check=True, capture_output=True, text=True, timeout=30).stdout.strip()


@dataclass
class Cluster:
    dir: Path
    base: int
    db: str
    pg: Forwarder | None = None
    routes: list[Forwarder] = field(default_factory=list)
    stream_names: set[str] = field(default_factory=set)  # every stream, as first settled

    def run(self, *args: str) -> str:
        env = {**os.environ, "SWITCHYARD_BIN": switchyard_bin(), "SWITCHYARD_NATS_SERVER": nats_server_bin(),
               "SY_CLUSTER_PORT": str(self.base), "SY_CLUSTER_DB": self.db,
               "SY_CLUSTER_PG_PORT": str(self.base + PG_FORWARDER), "SY_CLUSTER_PARTITIONABLE": "1"}
        r = subprocess.run([str(CLUSTER), *args], env=env, capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            logs = "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}"
                             for p in sorted((self.dir / "logs").glob("*.log")))
            raise AssertionError(f"scripts/cluster {' '.join(args)} failed: {r.stderr}\n{r.stdout}\n{logs}")
        return r.stdout

    def pid(self, name: str) -> int:
        return int((self.dir / "pids" / f"{name}.pid").read_text())

    def ingress(self) -> list[str]:
        return [f"http://127.0.0.1:{self.base + 31}", f"http://127.0.0.1:{self.base + 32}"]

    def streams(self) -> dict[str, dict]:
        """Each stream as its leader reports it (`/jsz?streams=true` of every node that answers,
        each stream from the node that leads it: only the leader knows whether the other
        replicas are current)."""
        found: dict[str, dict] = {}
        for i in (1, 2, 3):
            try:
                jsz = httpx.get(f"http://127.0.0.1:{self.base + 20 + i}/jsz",
                                params={"streams": "true", "accounts": "true"}, timeout=2).json()
            except httpx.HTTPError:
                continue
            found.update({s["name"]: s for a in jsz.get("account_details", []) for s in a.get("stream_detail", [])
                          if s.get("cluster", {}).get("leader") == f"n{i}"})
        return found

    def settled(self) -> bool:
        """Every node healthy, both ingress ready, every stream with a leader and every replica
        current (so one scenario's fault does not spill into the next)."""
        for i in (1, 2, 3):
            if httpx.get(f"http://127.0.0.1:{self.base + 20 + i}/healthz", timeout=2).status_code != 200:
                return False
        if any(httpx.get(f"{u}/readyz", timeout=2).status_code != 200 for u in self.ingress()):
            return False
        streams = self.streams()
        if not self.stream_names:
            self.stream_names = set(streams)
        return bool(streams) and set(streams) == self.stream_names and all(
            s.get("cluster", {}).get("leader")
            and len(s["cluster"].get("replicas", [])) == 2
            and all(r.get("current") for r in s["cluster"]["replicas"])
            for s in streams.values())


def free_base() -> int:
    """A port block nobody listens on."""
    import socket
    for base in range(20000 + (os.getpid() % 200) * 100, 60000, 100):
        try:
            # +54, +55: what n1 and n2 advertise as route URLs (nothing may listen there).
            for off in (1, 2, 3, 11, 12, 13, 21, 22, 23, 31, 32, 40, PG_FORWARDER, *ROUTE_FORWARDERS, 54, 55):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + off))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port block")


@pytest.fixture
def cluster(tmp_path):
    if subprocess.run([str(REPO_ROOT / "scripts" / "ensure-postgres")], capture_output=True).returncode != 0:
        if os.environ.get("SWITCHYARD_REQUIRE_POSTGRES") == "1":
            pytest.fail("PostgreSQL is required (SWITCHYARD_REQUIRE_POSTGRES=1) but not available")
        pytest.skip("no PostgreSQL on 127.0.0.1:5432 (scripts/ensure-postgres)")
    c = Cluster(tmp_path / "cluster", free_base(), f"sy_chaos_{uuid.uuid4().hex[:12]}")
    c.pg = Forwarder(c.base + PG_FORWARDER, 5432)
    c.routes = [Forwarder(c.base + f, c.base + t) for f, t in ROUTE_FORWARDERS.items()]
    try:
        c.run("up", str(c.dir))
        yield c
    finally:
        subprocess.run([str(CLUSTER), "down", str(c.dir)], capture_output=True, timeout=300)
        for f in [c.pg, *c.routes]:
            f.close()
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f'DROP DATABASE IF EXISTS "{c.db}"'],
                       capture_output=True, timeout=30)


@dataclass
class Outcome:
    kind: str              # ok | failed | lost
    request_id: str | None
    detail: str = ""
    at: float = 0.0    # when the request was sent, s since the load started
    end: float = 0.0   # when its answer ended
    worker: str | None = None  # x-switchyard-worker
    rerouted: bool = False  # its first ingress refused the connection
    reroute_why: str = ""   # what the first ingress did instead of answering
    message: str = ""       # a failed request's error code and message


async def one(client: httpx.AsyncClient, urls: list[str], t0: float) -> Outcome:
    at = time.monotonic() - t0
    rerouted = False
    why: list[str] = []
    for url in urls:
        try:
            o = await attempt(client, url, at)
            break
        except (httpx.ConnectError, NoResponse) as e:
            why.append(f"{url}: {type(e).__name__} {e.__cause__ or e}")
            # Refused, or the connection closed before any response byte (a pooled keep-alive
            # connection the draining ingress closed as the request went out): the next ingress,
            # as a balancer does, and as the OpenAI and Anthropic SDKs retry connection errors.
            # The ledger check below would show it if the first attempt had been served.
            rerouted = True
    else:
        o = Outcome("lost", None, "no ingress answered", at)
    o.rerouted = rerouted
    o.reroute_why = "; ".join(why)
    o.end = time.monotonic() - t0
    return o


async def attempt(client: httpx.AsyncClient, url: str, at: float) -> Outcome:
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    rid = None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                 headers=NO_CACHE) as r:
            rid = r.headers.get("x-request-id")
            worker = r.headers.get("x-switchyard-worker")
            if r.status_code != 200:
                text = (await r.aread()).decode()
                try:
                    err = json.loads(text)["error"]
                    return Outcome("failed", rid, f"{r.status_code} {err['type']}", at,
                                   message=f"{err.get('code')}: {err.get('message')}")
                except (ValueError, KeyError, TypeError):
                    return Outcome("lost", rid, f"{r.status_code} without an error body: {text[:80]}", at)
            finished = done = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                ev = json.loads(data)
                if "error" in ev:
                    return Outcome("failed", rid, f"stream error {ev['error'].get('type')}", at=at, worker=worker,
                                   message=f"{ev['error'].get('code')}: {ev['error'].get('message')}")
                if any(ch.get("finish_reason") for ch in ev.get("choices", [])):
                    finished = True
            if finished and done:
                return Outcome("ok", rid, "", at=at, worker=worker)
            return Outcome("lost", rid, f"stream ended without finish/[DONE]/error (finish={finished})", at)
    except httpx.ConnectError:
        raise
    except (httpx.ReadError, httpx.RemoteProtocolError) as e:
        if rid is None:
            raise NoResponse() from e
        return Outcome("lost", rid, f"{type(e).__name__}: {e}", at)
    except httpx.HTTPError as e:
        return Outcome("lost", rid, f"{type(e).__name__}: {e}", at)


class NoResponse(Exception):
    """The connection closed before a response header arrived."""


@dataclass
class Row:
    scenario: str
    sent: int = 0
    ok: int = 0
    failed: int = 0
    lost: int = 0
    rerouted: int = 0
    admitted: int = 0
    charges: int = 0
    mismatch: int = 0
    recover_s: float = 0.0
    slowest_s: float = 0.0
    ledger_lag_s: float = 0.0
    errors: dict = field(default_factory=dict)

    def md(self) -> str:
        errs = ", ".join(f"{k} ×{v}" for k, v in sorted(self.errors.items())) or "-"
        return (f"| {self.scenario} | {self.sent} | {self.ok} | {self.failed} | {self.lost} | {self.rerouted} "
                f"| {self.admitted} | {self.charges} | {self.mismatch} | {self.recover_s:.1f} "
                f"| {self.slowest_s:.1f} | {self.ledger_lag_s:.1f} | {errs} |")


HEADER = ("| scenario | sent | succeeded | failed (clear error) | lost | rerouted | admitted | charge rows "
          "| ledger mismatch | recovery s | slowest s | ledger lag s | errors |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


async def load(urls: list[str], fault, t0: float, duration_s: float) -> tuple[list[Outcome], float]:
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
        tasks = []
        fault_task = None
        fault_at = duration_s
        n = int(RATE * duration_s)
        for i in range(n):
            due = t0 + i / RATE
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # pacing the load, not synchronisation
            if fault_task is None and time.monotonic() - t0 >= FAULT_AT_S:
                fault_at = time.monotonic() - t0
                fault_task = asyncio.create_task(asyncio.to_thread(fault))
            tasks.append(asyncio.create_task(one(client, [urls[i % 2], urls[(i + 1) % 2]], t0)))
        results = await asyncio.gather(*tasks)
        if fault_task is not None:
            await fault_task
        return list(results), fault_at


def total_charges(c: Cluster) -> int:
    return int(psql(c.db, "SELECT count(*) FROM usage_events WHERE kind='charge'"))


def run_scenario(c: Cluster, name: str, fault, duration_s: float = DURATION_S,
                 probes: int = 0) -> tuple[Row, list[Outcome]]:
    """`probes`: requests the fault itself sends (each one charge row)."""
    wait_until(f"{name}: the cluster settled before the fault", c.settled, 90.0, interval_s=0.5)
    before = total_charges(c)
    t0 = time.monotonic()
    outcomes, fault_at = asyncio.run(load(c.ingress(), fault, t0, duration_s))
    load_end = time.monotonic()
    row = Row(name, sent=len(outcomes))
    for o in outcomes:
        setattr(row, o.kind, getattr(row, o.kind) + 1)
        row.rerouted += o.rerouted
        if o.kind != "ok":
            row.errors[o.detail] = row.errors.get(o.detail, 0) + 1
    # Time to recover: from the fault until the last failed request had its answer.
    bad = [o.end for o in outcomes if o.kind != "ok"]
    row.recover_s = max(0.0, max(bad) - fault_at) if bad else 0.0
    row.slowest_s = max(o.end - o.at for o in outcomes)
    admitted = {o.request_id for o in outcomes if o.request_id}
    row.admitted = len(admitted)
    ids = ",".join(f"'{r}'" for r in admitted) or "''"

    def charged() -> int:
        return int(psql(c.db, f"SELECT count(*) FROM usage_events WHERE kind='charge' AND request_id IN ({ids})"))

    # Billing drains the usage stream asynchronously: wait for every admitted request's charge.
    try:
        wait_until(f"{name}: charge rows for {len(admitted)} admitted requests",
                   lambda: charged() >= len(admitted), 90.0, interval_s=0.5)
    except TimeoutError:
        pass  # reported as a mismatch below
    row.ledger_lag_s = time.monotonic() - load_end
    rows = psql(c.db, f"SELECT request_id, count(*) FROM usage_events WHERE kind='charge' "
                      f"AND request_id IN ({ids}) GROUP BY request_id")
    charged_ids = {line.split("|")[0]: int(line.split("|")[1]) for line in rows.splitlines() if line}
    row.charges = sum(charged_ids.values())
    # Rows of no admitted request (a retried request served twice, a probe): every charge row
    # written during the scenario is counted, not only those of admitted ids.
    orphans = total_charges(c) - before - row.charges - probes
    if orphans:
        # Which requests they were, and what each process logged of them, for the failure report.
        extra = psql(c.db, f"SELECT request_id, ts_ms, status, latency_ms FROM usage_events WHERE kind='charge' "
                           f"AND request_id NOT IN ({ids}) ORDER BY ts_ms DESC LIMIT {abs(orphans) + probes + 3}")
        print(f"  charge rows of no admitted request (newest first):\n{extra}", flush=True)
        for line in extra.splitlines()[:5]:
            rid = line.split("|")[0]
            for log in sorted((c.dir / "logs").glob("*.log")):
                hits = [h for h in log.read_text(errors="replace").splitlines() if rid in h]
                for h in hits[:6]:
                    print(f"  {log.name}: {h[:400]}", flush=True)
    row.mismatch = len(admitted ^ set(charged_ids)) + sum(n - 1 for n in charged_ids.values()) + abs(orphans)
    # What the failures said, for a report that explains the error column.
    said: dict[str, int] = {}
    for o in outcomes:
        if o.kind != "ok":
            key = f"{o.detail} ({o.message[:160]})" if o.message else o.detail
            said[key] = said.get(key, 0) + 1
    for key, n in sorted(said.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  ×{n} {key}", flush=True)
    # A refused connection is the expected reroute; any other kind is printed one by one.
    refused = [o for o in outcomes if o.rerouted and "ConnectError" in o.reroute_why]
    if refused:
        print(f"  rerouted after a refused connection: {len(refused)}", flush=True)
    for o in outcomes:
        if o.rerouted and o not in refused:
            print(f"  rerouted at {o.at:.1f} s: {o.reroute_why} -> {o.kind} {o.request_id}", flush=True)
    slow = sorted(outcomes, key=lambda o: o.at - o.end)[:3]
    print(f"{row.md()}\n  load average {os.getloadavg()[0]:.1f}; slowest: " + "; ".join(
        f"{o.kind} sent at {o.at:.1f} s took {o.end - o.at:.1f} s{' (rerouted)' if o.rerouted else ''}"
        for o in slow), flush=True)
    return row, outcomes


def kill9(c: Cluster, name: str) -> None:
    os.kill(c.pid(name), signal.SIGKILL)


def serving_worker(c: Cluster) -> tuple[str, str]:
    """(process name, worker id) of the worker that answers now. NATS prefers queue subscribers
    on the publisher's own server, so one worker may take all the load: kill that one."""
    r = httpx.post(f"{c.ingress()[0]}/v1/chat/completions", timeout=30, headers=NO_CACHE,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "which worker"}]})
    wid = r.headers["x-switchyard-worker"]
    for name in ("worker1", "worker2"):
        if f"worker={wid}" in (c.dir / "logs" / f"{name}.log").read_text():
            return name, wid
    raise AssertionError(f"no worker log names {wid}")


def test_cluster_chaos(cluster: Cluster):
    c = cluster
    status = c.run("status", str(c.dir))
    assert "JetStream meta leader: n" in status, status
    # Every stream and bucket the services created is at R3.
    streams = [line.split("\t") for line in status.splitlines() if line.startswith(("KV_", "SY_", "OBJ_"))]
    assert streams and all(s[1] == "3" for s in streams), status
    assert USAGE_STREAM in {s[0] for s in streams}, status

    def nats_node():
        kill9(c, "n2")
        time.sleep(5)  # the outage being measured
        c.run("start", "n2", str(c.dir))

    leader: list[str] = []

    def stream_leader():
        leader.append(c.streams()[USAGE_STREAM]["cluster"]["leader"])
        kill9(c, leader[0])
        time.sleep(5)
        c.run("start", leader[0], str(c.dir))

    victim: list[str] = []

    def worker():
        # Chosen under load (after the NATS scenarios moved connections around).
        victim.extend(serving_worker(c))
        kill9(c, victim[0])
        time.sleep(5)
        c.run("start", victim[0], str(c.dir))

    def billing():
        c.run("stop", "billing", str(c.dir))
        time.sleep(3)
        c.run("start", "billing", str(c.dir))

    def ingress():
        c.run("stop", "ingress1", str(c.dir))  # SIGTERM: stops accepting, drains its streams
        c.run("start", "ingress1", str(c.dir))  # returns once /readyz is 200

    cut_off: list[str] = []

    def partition():
        for f in c.routes:
            f.cut()
        # n3 alone: no route left (its monitoring port is not behind the forwarders).
        n3 = f"http://127.0.0.1:{c.base + 23}"
        wait_until("n3 without routes", lambda: httpx.get(f"{n3}/routez", timeout=2).json()["num_routes"] == 0, 5.0)
        conns = httpx.get(f"{n3}/connz", params={"auth": "true", "limit": "1024"}, timeout=2).json()
        users: dict[str, int] = {}
        for conn in conns.get("connections", []):
            users[conn.get("authorized_user", "?")] = users.get(conn.get("authorized_user", "?"), 0) + 1
        cut_off.append(", ".join(f"{u} ×{n}" for u, n in sorted(users.items())) or "no clients")
        time.sleep(10)
        for f in c.routes:
            f.heal()

    def postgres():
        c.pg.cut()
        time.sleep(PG_OUTAGE_S)
        c.pg.heal()

    print(f"\n{HEADER}", flush=True)
    # SY_CHAOS_ONLY=postgres,worker (the functions' names) runs only those scenarios, to
    # reproduce one locally; CI runs all.
    only = {n.strip().replace("-", "_") for n in os.environ.get("SY_CHAOS_ONLY", "").split(",") if n.strip()}

    def want(fault) -> bool:
        return not only or fault.__name__ in only

    rows: list[Row] = []
    by_worker: dict = {}
    if want(nats_node):
        rows.append(run_scenario(c, "kill 1 of 3 NATS servers (SIGKILL, back after 5 s)", nats_node)[0])
    if want(stream_leader):
        row, _ = run_scenario(c, "kill the usage stream's leader (SIGKILL, back after 5 s)", stream_leader)
        row.scenario += f" [{leader[0]}]"
        rows.append(row)
    if want(worker):
        row, outcomes = run_scenario(c, "kill a worker mid-stream (SIGKILL, back after 5 s)", worker, probes=1)
        rows.append(row)
        for o in outcomes:
            by_worker[o.worker] = by_worker.get(o.worker, 0) + 1
    if want(billing):
        rows.append(run_scenario(c, "restart the billing consumer (SIGTERM, back after 3 s)", billing)[0])
    if want(ingress):
        rows.append(run_scenario(c, "restart an ingress (SIGTERM, drained, started again)", ingress)[0])
    if want(partition):
        row, _ = run_scenario(c, "partition 1 of 3 NATS servers from the others for 10 s", partition, DURATION_S + 6)
        row.scenario += f" [its clients: {cut_off[0]}]"
        rows.append(row)
    if want(postgres):
        rows.append(run_scenario(c, f"PostgreSQL unreachable for {PG_OUTAGE_S:.0f} s", postgres,
                                 FAULT_AT_S + PG_OUTAGE_S + 7)[0])
    assert rows, f"SY_CHAOS_ONLY={os.environ.get('SY_CHAOS_ONLY')} names no scenario"

    table = "\n".join([HEADER, *(r.md() for r in rows)])
    print(f"\nchaos table (load {RATE} rps of ~1 s streams, fault at {FAULT_AT_S:.0f} s):\n{table}")
    if os.environ.get("SY_CHAOS_TABLE"):
        Path(os.environ["SY_CHAOS_TABLE"]).write_text(table + "\n")
    # The killed worker was carrying load when it died.
    assert not victim or by_worker.get(victim[1]), f"{victim} served nothing: {by_worker}"
    for r in rows:
        assert r.lost == 0, f"{r.scenario}: {r.lost} lost\n{table}"
        assert r.mismatch == 0, f"{r.scenario}: ledger mismatch {r.mismatch}\n{table}"
        assert r.ok + r.failed == r.sent, table
        assert r.slowest_s <= SLOWEST_S, f"{r.scenario}: a request took {r.slowest_s:.1f} s\n{table}"
