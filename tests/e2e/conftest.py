"""Fixtures for the end-to-end tests: real `switchyard` processes on a real nats-server.

Environment:
  SWITCHYARD_BIN          the switchyard binary (default: <repo>/target/debug/switchyard)
  SWITCHYARD_NATS_SERVER  nats-server >= 2.10 (default: <repo>/.tools/bin/nats-server)

Every process writes stdout+stderr to a log file under the test's tmp dir; when a test fails,
the logs of the processes it used are attached to the report ("switchyard logs" section).
Readiness is always established by polling with a deadline, never by sleeping blindly.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

#: `switchyard_mock::DEFAULT_TEXT`, streamed by the mock as one chunk per word.
DEFAULT_TEXT = "Hello from the Switchyard mock upstream. Every word arrives as its own chunk."
#: The mock's completion_tokens for DEFAULT_TEXT: whitespace-separated words.
DEFAULT_COMPLETION_TOKENS = len(DEFAULT_TEXT.split())
assert DEFAULT_COMPLETION_TOKENS == 13

MODEL = "demo/mock"
#: The local model `switchyard up` serves (SmolLM2-135M on llama.cpp, scripts/local_model.py).
LOCAL_MODEL = "local/smollm2-135m"

START_DEADLINE_S = 20.0
READY_DEADLINE_S = 30.0
#: `switchyard up` waits up to 60 s for the local model server before it starts ingress.
LOCAL_READY_DEADLINE_S = 90.0

_WORKER_ID_RE = re.compile(r"worker-[0-9a-f]{32}")


def switchyard_bin() -> str:
    path = os.environ.get("SWITCHYARD_BIN") or str(REPO_ROOT / "target" / "debug" / "switchyard")
    if not os.access(path, os.X_OK):
        pytest.fail(f"switchyard binary not found at {path}: run `cargo build -p switchyard`")
    return path


def nats_server_bin() -> str:
    path = os.environ.get("SWITCHYARD_NATS_SERVER") or str(REPO_ROOT / ".tools" / "bin" / "nats-server")
    if not os.access(path, os.X_OK):
        pytest.fail(f"nats-server not found at {path}: run scripts/bootstrap")
    return path


def pick_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt_words(*texts: str) -> int:
    """The mock's prompt_tokens: whitespace-separated words over all message text."""
    return sum(len(t.split()) for t in texts)


# --------------------------------------------------------------------------------------------
# Process management


@dataclass
class Proc:
    name: str
    args: list[str]
    log_path: Path
    popen: subprocess.Popen
    meta: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"<cannot read {self.log_path}: {e}>"

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with status {self.popen.returncode}\n"
                f"command: {' '.join(self.args)}\n--- log ---\n{self.log()}"
            )

    def sigkill(self) -> None:
        """SIGKILL this process only and reap it."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM, wait up to `grace_s`, then SIGKILL; finally SIGKILL anything left in the
        process group this fixture created (e.g. the private nats-server of `switchyard up`)."""
        if self.alive():
            try:
                self.popen.send_signal(signal.SIGTERM)
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.popen.send_signal(signal.SIGKILL)
                self.popen.wait(timeout=10)
        try:
            # The process was started with start_new_session=True: its group id is its pid.
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class ProcessGroup:
    """The processes one fixture started; stops them all on close."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[Proc] = []

    def start(self, name: str, args: list[str], env: dict | None = None) -> Proc:
        log_path = self.tmp / f"{name}.log"
        full_env = dict(os.environ)
        full_env.setdefault("RUST_LOG", "info")
        full_env["NO_COLOR"] = "1"
        full_env["SWITCHYARD_NATS_SERVER"] = nats_server_bin()
        if env:
            full_env.update(env)
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=self.tmp,
                start_new_session=True,
            )
        proc = Proc(name=name, args=args, log_path=log_path, popen=popen)
        self.procs.append(proc)
        _LIVE_PROCS.append(proc)
        return proc

    def close(self) -> None:
        # Reverse start order: clients before the nats-server they talk to.
        for proc in reversed(self.procs):
            try:
                proc.stop()
            finally:
                if proc in _LIVE_PROCS:
                    _LIVE_PROCS.remove(proc)


_LIVE_PROCS: list[Proc] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _LIVE_PROCS:
        parts = []
        for proc in _LIVE_PROCS:
            state = "running" if proc.alive() else f"exited {proc.popen.returncode}"
            parts.append(f"===== {proc.name} (pid {proc.pid}, {state}) {proc.log_path}\n{proc.log()}")
        report.sections.append(("switchyard logs", "\n".join(parts)))


def pytest_configure(config):
    config.addinivalue_line("markers", "workers(n): number of worker processes the gateway fixture starts")
    config.addinivalue_line("markers", "config_extra(yaml, ready_key=None, files={}): top-level YAML appended "
                            "to the gateway fixture's config (@TMP@ = the test's tmp dir, where `files` "
                            "are written first), and the API key its readiness probe sends")


# --------------------------------------------------------------------------------------------
# Polling helpers


def wait_until(what: str, check: Callable[[], bool], deadline_s: float, procs: list[Proc] = (),
               interval_s: float = 0.05) -> None:
    """Polls `check` until it returns True; fails with the logs of `procs` after the deadline or as
    soon as one of them exits."""
    end = time.monotonic() + deadline_s
    last_exc: Exception | None = None
    while True:
        for p in procs:
            p.check_alive()
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - readiness probes fail in many ways
            last_exc = e
        if time.monotonic() > end:
            logs = "\n".join(f"--- {p.name} ---\n{p.log()}" for p in procs)
            raise TimeoutError(f"timed out after {deadline_s}s waiting for {what} "
                               f"(last error: {last_exc!r})\n{logs}")
        time.sleep(interval_s)


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=2.0).status_code == 200


def chat_ok(base_url: str, model: str = MODEL, api_key: str = "sk-ready", **params) -> bool:
    r = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "ping"}], **params},
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30.0,
    )
    return r.status_code == 200


# --------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


@dataclass
class Nats:
    url: str
    port: int
    monitor_url: str
    proc: Proc

    def connz(self) -> dict:
        return httpx.get(f"{self.monitor_url}/connz?limit=1024", timeout=2.0).json()

    def connections_named(self, name: str) -> int:
        return sum(1 for c in self.connz().get("connections", []) if c.get("name") == name)

    def jsz(self) -> dict:
        return httpx.get(f"{self.monitor_url}/jsz", timeout=2.0).json()


@pytest.fixture
def procs(tmp_path):
    group = ProcessGroup(tmp_path)
    yield group
    group.close()


@pytest.fixture
def nats(procs, tmp_path) -> Nats:
    port, mport = pick_free_port(), pick_free_port()
    store = tmp_path / "nats"
    store.mkdir()
    proc = procs.start("nats-server", [
        nats_server_bin(), "-a", "127.0.0.1", "-p", str(port), "-m", str(mport),
        "-js", "-sd", str(store),
    ])
    monitor = f"http://127.0.0.1:{mport}"
    # /healthz of the monitoring port is 200 once the server (and JetStream) is ready.
    wait_until("nats-server /healthz", lambda: http_ok(f"{monitor}/healthz"), START_DEADLINE_S, [proc])
    return Nats(url=f"nats://127.0.0.1:{port}", port=port, monitor_url=monitor, proc=proc)


@dataclass
class Mock:
    base_url: str  # http://127.0.0.1:PORT (no /v1)
    proc: Proc

    def requests(self) -> list:
        return httpx.get(f"{self.base_url}/_mock/requests", timeout=5.0).json()


@pytest.fixture
def mock_upstream(procs) -> Mock:
    port = pick_free_port()
    proc = procs.start("mock-upstream", [switchyard_bin(), "mock-upstream", "--listen", f"127.0.0.1:{port}"])
    base = f"http://127.0.0.1:{port}"
    wait_until("mock upstream /health", lambda: http_ok(f"{base}/health"), START_DEADLINE_S, [proc])
    return Mock(base_url=base, proc=proc)


def write_config(tmp: Path, listen: str, extra: str = "") -> Path:
    data_dir = tmp / "data"
    data_dir.mkdir(exist_ok=True)
    path = tmp / "switchyard.yaml"
    path.write_text(
        f"""\
listen: "{listen}"
subject_prefix: sy
data_dir: "{data_dir}"
targets:
  - id: mock
    provider: openai
    base_url: builtin:mock
    upstream_model: mock
  - id: claude
    provider: anthropic
    base_url: builtin:mock
    upstream_model: claude-test
  - id: oai-responses
    provider: openai
    base_url: builtin:mock
    upstream_model: gpt-4.1-mini
    api: responses
models:
  - id: {MODEL}
    targets: [mock]
    owned_by: switchyard
  - id: demo/claude
    targets: [claude]
    owned_by: switchyard
  - id: demo/oai-responses
    targets: [oai-responses]
    owned_by: switchyard
"""
        + extra
    )
    return path


@dataclass
class Gateway:
    base_url: str  # http://127.0.0.1:PORT (no /v1)
    nats: Nats
    mock: Mock
    ingress: Proc
    billing: Proc
    workers: list[Proc]
    config_path: Path
    procs: ProcessGroup

    def worker_id(self, worker: Proc) -> str:
        return worker.meta["worker_id"]

    def kill_worker(self, worker: Proc) -> None:
        """SIGKILL one worker and wait until nats-server has dropped its connection (so no
        request can be routed to its dead subscription any more)."""
        worker.sigkill()
        alive = sum(1 for w in self.workers if w.alive())
        wait_until(
            f"nats-server to drop the killed worker's connection ({alive} left)",
            lambda: self.nats.connections_named("switchyard-worker") == alive,
            10.0,
            [self.nats.proc, self.ingress],
        )


def _start_worker(procs: ProcessGroup, index: int, config: Path, nats: Nats, mock: Mock) -> Proc:
    w = procs.start(f"worker-{index}", [
        switchyard_bin(), "worker", "--config", str(config), "--nats-url", nats.url,
        "--mock-url", f"{mock.base_url}/v1",
    ])
    return w


@pytest.fixture
def gateway(request, procs, tmp_path, nats, mock_upstream) -> Gateway:
    """ingress + N workers (marker `@pytest.mark.workers(n)`, default 1) + billing, against the
    `nats` and `mock_upstream` fixtures."""
    marker = request.node.get_closest_marker("workers")
    n_workers = marker.args[0] if marker else 1
    port = pick_free_port()
    listen = f"127.0.0.1:{port}"
    extra = request.node.get_closest_marker("config_extra")
    for name, text in (extra.kwargs.get("files", {}) if extra else {}).items():
        (tmp_path / name).write_text(text)
    extra_yaml = extra.args[0].replace("@TMP@", str(tmp_path)) if extra else ""
    config = write_config(tmp_path, listen, extra_yaml)
    ready_key = (extra.kwargs.get("ready_key") if extra else None) or "sk-ready"
    exe = switchyard_bin()

    # Billing first: it creates the usage stream and its durable consumer.
    ledger = tmp_path / "ledger.db"
    billing = procs.start("billing", [
        exe, "billing", "--config", str(config), "--nats-url", nats.url,
        "--database-url", f"sqlite://{ledger}?mode=rwc",
    ])
    wait_until("billing to create its JetStream consumer",
               lambda: nats.jsz().get("consumers", 0) >= 1, START_DEADLINE_S, [billing, nats.proc])

    workers = [_start_worker(procs, i, config, nats, mock_upstream) for i in range(n_workers)]
    ingress = procs.start("ingress", [
        exe, "ingress", "--config", str(config), "--nats-url", nats.url, "--listen", listen,
    ])
    base = f"http://{listen}"
    wait_until("ingress /healthz", lambda: http_ok(f"{base}/healthz"), START_DEADLINE_S, [ingress])

    # Each worker logs its id once it has subscribed its queues.
    def ids_known() -> bool:
        for w in workers:
            if "worker_id" not in w.meta:
                m = _WORKER_ID_RE.search(w.log())
                if m:
                    w.meta["worker_id"] = m.group(0)
        return all("worker_id" in w.meta for w in workers)

    wait_until("workers to log their ids", ids_known, START_DEADLINE_S, workers)
    wait_until(
        f"nats-server to see {n_workers} worker connection(s)",
        lambda: nats.connections_named("switchyard-worker") == n_workers,
        START_DEADLINE_S, workers,
    )
    wait_until("a chat request to succeed through the gateway", lambda: chat_ok(base, api_key=ready_key),
               READY_DEADLINE_S, [ingress, billing, *workers])
    return Gateway(base_url=base, nats=nats, mock=mock_upstream, ingress=ingress, billing=billing,
                   workers=workers, config_path=config, procs=procs)


_LOCAL_READY_RE = re.compile(r"local model ready(?: \(restarted\))? url=(\S+) pid=(\d+)")


@dataclass
class Up:
    base_url: str
    data_dir: Path
    proc: Proc

    @property
    def ledger_path(self) -> Path:
        return self.data_dir / "ledger.db"

    def local_model_starts(self) -> list[tuple[str, int]]:
        """(url, pid) of every local model server start `switchyard up` logged, oldest first."""
        return [(m.group(1), int(m.group(2))) for m in _LOCAL_READY_RE.finditer(self.proc.log())]


def start_up(procs: ProcessGroup, data_dir: Path, *extra_args: str, name: str = "switchyard-up",
             local_model: bool = False) -> Up:
    """`switchyard up` on a free port with `data_dir`; returns once a demo/mock chat succeeds and,
    with `local_model`, once the local model answers too (it fails fast when `up` logs that the
    local model is disabled)."""
    port = pick_free_port()
    proc = procs.start(name, [
        switchyard_bin(), "up", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}",
        *extra_args,
    ])
    base = f"http://127.0.0.1:{port}"
    deadline = LOCAL_READY_DEADLINE_S if local_model else READY_DEADLINE_S

    def healthy() -> bool:
        if local_model and "local model disabled" in proc.log():
            pytest.fail(f"switchyard up did not start the local model (run scripts/bootstrap)\n"
                        f"{proc.log()}")
        return http_ok(f"{base}/healthz")

    wait_until("switchyard up /healthz", healthy, deadline, [proc])
    wait_until("a chat request to succeed through switchyard up", lambda: chat_ok(base),
               READY_DEADLINE_S, [proc])
    if local_model:
        wait_until(f"a {LOCAL_MODEL} chat request to succeed through switchyard up",
                   lambda: chat_ok(base, LOCAL_MODEL, max_tokens=1, temperature=0),
                   READY_DEADLINE_S, [proc])
    return Up(base_url=base, data_dir=data_dir, proc=proc)


@pytest.fixture
def up(procs, tmp_path) -> Up:
    """`switchyard up` (private nats-server, built-in mock, model demo/mock, and the local model
    when installed) on a free port."""
    return start_up(procs, tmp_path / "up-data")


@pytest.fixture(scope="module")
def up_local(tmp_path_factory) -> Up:
    """One `switchyard up` for a whole test module, with the local model server (its log line
    `local model ready url=… pid=…` tells the tests where it is); fails when the local model is
    not installed."""
    tmp = tmp_path_factory.mktemp("up-local")
    group = ProcessGroup(tmp)
    try:
        yield start_up(group, tmp / "data", name="switchyard-up-local", local_model=True)
    finally:
        group.close()
