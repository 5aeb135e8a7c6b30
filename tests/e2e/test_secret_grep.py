"""Secrets never leak (issue 13, acceptance): a `switchyard up` run with a client key, a usage-admin
client key, an admin API key (`admin.keys`, `env:` reference), a provider key in `${ENV}` and a
second one given as `enc:v1:` ciphertext under `SWITCHYARD_MASTER_KEY` serves successful,
streamed, failing, embeddings, Anthropic and Responses requests — including upstream 401s that
echo the credential they were sent, as OpenAI's "Incorrect API key provided" does — and admin API
calls (create a key, list keys, view the config, read usage); the created key is used too. Then
every byte it produced is searched for every secret (the master key and the created key
included): each response body and header, every log line, every row of every ledger table, and
every file of the data dir (the JetStream store holds every KV value and stream message, the
config bucket included). Zero hits.
"""

from __future__ import annotations

import http.server
import json
import base64
import os
import socket
import sqlite3
import subprocess
import threading
from pathlib import Path

import httpx

from conftest import READY_DEADLINE_S, chat_ok, http_ok, pick_free_port, switchyard_bin, wait_until

CLIENT_KEY = "sk-client-e2e-7f3a9c1d2b4e6f80SECRET"
ADMIN_KEY = "sk-admin-e2e-0a1b2c3d4e5f6789SECRET"
PROVIDER_KEY = "sk-upstream-e2e-9e8d7c6b5a493827SECRET"
#: An admin API key (`admin.keys`, given to ingress as `env:SY_E2E_ADMIN_API_KEY`).
ADMIN_API_KEY = "sy-admin-api-e2e-55aa66bb77cc88ddSECRET"
#: The provider key of the `echo-enc` target, in config only as `enc:v1:` ciphertext.
SEALED_PROVIDER_KEY = "sk-sealed-e2e-0f1e2d3c4b5a6978SECRET"
#: 32 random bytes, base64: the master key the sealed provider key is encrypted under.
MASTER_KEY = base64.b64encode(os.urandom(32)).decode()
#: A key nobody configured, sent by a client: refused, and not written down either.
WRONG_KEY = "sk-wrong-e2e-1122334455667788SECRET"
#: The secrets of the run; the key the admin API creates is appended when it is shown.
SECRETS = [CLIENT_KEY, ADMIN_KEY, ADMIN_API_KEY, PROVIDER_KEY, SEALED_PROVIDER_KEY, MASTER_KEY,
           WRONG_KEY]


class EchoUpstream(http.server.BaseHTTPRequestHandler):
    """An upstream that refuses every call, quoting the credential it was sent: 401 with the
    `Authorization` / `x-api-key` value in the message, or (path `/bad/…`) a 400 whose message
    contains the bare key."""

    def do_POST(self):  # noqa: N802 (http.server naming)
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        sent = self.headers.get("authorization") or self.headers.get("x-api-key") or ""
        bare = sent.removeprefix("Bearer ")
        if self.path.startswith("/bad/"):
            status, message = 400, f"Invalid value for api_key={bare}; check your key {bare}"
        else:
            status, message = 401, f"Incorrect API key provided: {sent}. Find your key at ..."
        if "/messages" in self.path:
            body = {"type": "error", "error": {"type": "authentication_error", "message": message}}
        else:
            body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                              "code": None if status == 400 else "invalid_api_key"}}
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        # An upstream echoing the key in a header too.
        self.send_header("x-echo-key", bare)
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


class NatsTap:
    """A raw NATS client that records every byte the server sends it for `subjects` (with the
    generated credentials of `identity`): the messages of the run as they flow. Subjects the
    identity may not subscribe to are answered with a permissions error, recorded too."""

    def __init__(self, port: int, user: str, password: str, subjects: list[str]):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.recv(4096)  # INFO
        connect = {"verbose": False, "pedantic": False, "headers": True, "protocol": 1,
                   "user": user, "pass": password, "name": f"secret-tap-{user}"}
        cmds = f"CONNECT {json.dumps(connect)}\r\n"
        cmds += "".join(f"SUB {s} {i}\r\n" for i, s in enumerate(subjects, 1))
        self.sock.sendall((cmds + "PING\r\n").encode())
        self.buf = bytearray()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                return
            self.buf += chunk
            if b"PING\r\n" in chunk:
                self.sock.sendall(b"PONG\r\n")

    def close(self) -> bytes:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        return bytes(self.buf)


def seal(value: str) -> str:
    """`switchyard secret encrypt` (credential on stdin) under MASTER_KEY: the `enc:v1:` text."""
    out = subprocess.run([switchyard_bin(), "secret", "encrypt"], input=value, text=True,
                         capture_output=True, timeout=30, check=True,
                         env={**os.environ, "SWITCHYARD_MASTER_KEY": MASTER_KEY})
    sealed = out.stdout.strip()
    assert sealed.startswith("enc:v1:") and value not in sealed, sealed
    assert value not in out.stderr and MASTER_KEY not in out.stdout + out.stderr
    return sealed


def config(echo_port: int, sealed: str) -> str:
    echo = f"http://127.0.0.1:{echo_port}"
    return f"""
subject_prefix: sy
targets:
  - {{id: mock, provider: openai, base_url: "builtin:mock", upstream_model: mock, api_key: "${{SY_E2E_PROVIDER_KEY}}"}}
  - {{id: claude, provider: anthropic, base_url: "builtin:mock", upstream_model: claude-test, api_key: "${{SY_E2E_PROVIDER_KEY}}"}}
  - {{id: echo, provider: openai, base_url: "{echo}/v1", upstream_model: echo, api_key: "${{SY_E2E_PROVIDER_KEY}}"}}
  - {{id: echo-bad, provider: openai, base_url: "{echo}/bad/v1", upstream_model: echo, api_key: "${{SY_E2E_PROVIDER_KEY}}"}}
  - {{id: echo-claude, provider: anthropic, base_url: "{echo}", upstream_model: echo, api_key: "${{SY_E2E_PROVIDER_KEY}}"}}
  - {{id: echo-enc, provider: openai, base_url: "{echo}/v1", upstream_model: echo, api_key: "{sealed}"}}
  - {{id: mock-enc, provider: openai, base_url: "builtin:mock", upstream_model: mock, api_key: "{sealed}"}}
models:
  - {{id: demo/mock, targets: [mock]}}
  - {{id: demo/claude, targets: [claude]}}
  - {{id: demo/echo, targets: [echo]}}
  - {{id: demo/echo-bad, targets: [echo-bad]}}
  - {{id: demo/echo-claude, targets: [echo-claude]}}
  - {{id: demo/echo-enc, targets: [echo-enc]}}
  - {{id: demo/mock-enc, targets: [mock-enc]}}
keys:
  - {{id: team-a, tenant: a, key: "${{SY_E2E_CLIENT_KEY}}"}}
  - {{id: ops, tenant: ops, key: "${{SY_E2E_ADMIN_KEY}}", admin: true}}
admin:
  keys:
    - {{id: root, key: "env:SY_E2E_ADMIN_API_KEY"}}
"""


def test_no_secret_in_any_log_row_kv_value_or_body(procs, tmp_path):
    echo = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EchoUpstream)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    try:
        run(procs, tmp_path, echo.server_address[1])
    finally:
        echo.shutdown()
        echo.server_close()


def run(procs, tmp_path: Path, echo_port: int) -> None:
    secrets = list(SECRETS)
    cfg = tmp_path / "secrets.yaml"
    cfg.write_text(config(echo_port, seal(SEALED_PROVIDER_KEY)))
    data = tmp_path / "up-data"
    port, nats_port = pick_free_port(), pick_free_port()
    base = f"http://127.0.0.1:{port}"
    up = procs.start("switchyard-up", [
        switchyard_bin(), "up", "--config", str(cfg), "--data-dir", str(data),
        "--listen", f"127.0.0.1:{port}", "--no-local-model", "--nats-port", str(nats_port),
    ], env={
        "SY_E2E_CLIENT_KEY": CLIENT_KEY, "SY_E2E_ADMIN_KEY": ADMIN_KEY,
        "SY_E2E_PROVIDER_KEY": PROVIDER_KEY, "SY_E2E_ADMIN_API_KEY": ADMIN_API_KEY,
        "SWITCHYARD_MASTER_KEY": MASTER_KEY,
        # As verbose as an operator debugging it would run it.
        "RUST_LOG": "debug",
    })
    wait_until("switchyard up /healthz", lambda: http_ok(f"{base}/healthz"), READY_DEADLINE_S, [up])
    wait_until("a chat with the client key", lambda: chat_ok(base, api_key=CLIENT_KEY),
               READY_DEADLINE_S, [up])

    # Taps on every subject: the admin identity sees all but requests and replies, a worker's
    # the requests, ingress's the replies (frames).
    creds = json.loads((data / "nats-credentials.json").read_text())
    taps = [NatsTap(nats_port, "admin", creds["admin"], [">"]),
            NatsTap(nats_port, "worker", creds["worker"], ["sy.req.>"]),
            NatsTap(nats_port, "ingress", creds["ingress"], ["sy.inbox.>", "_INBOX.ingress.>"])]
    produced: list[str] = []
    http = httpx.Client(base_url=base, timeout=30.0)

    def call(method: str, path: str, key: str = CLIENT_KEY, anthropic: bool = False, **kw):
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"} if anthropic \
            else {"authorization": f"Bearer {key}"}
        r = http.request(method, path, headers=headers, **kw)
        produced.append(f"{r.status_code} {dict(r.headers)} {r.text}")
        return r

    chat = lambda model, **extra: {"model": model,  # noqa: E731
                                   "messages": [{"role": "user", "content": "hi"}], **extra}
    assert call("POST", "/v1/chat/completions", json=chat("demo/mock")).status_code == 200
    r = call("POST", "/v1/chat/completions", json=chat("demo/mock", stream=True,
                                                      stream_options={"include_usage": True}))
    assert r.status_code == 200 and "[DONE]" in r.text
    assert call("POST", "/v1/embeddings", json={"model": "demo/mock", "input": "x"}).status_code == 200
    msg = {"model": "demo/claude", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    assert call("POST", "/v1/messages", anthropic=True, json=msg).status_code == 200
    assert call("POST", "/v1/messages", anthropic=True, json={**msg, "stream": True}).status_code == 200
    assert call("POST", "/v1/responses", json={"model": "demo/mock", "input": "hi"}).status_code == 200

    # Upstream 401 echoing the key: non-streamed, streamed, Anthropic door and provider, Responses.
    r = call("POST", "/v1/chat/completions", json=chat("demo/echo"))
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_auth_failed"
    r = call("POST", "/v1/chat/completions", json=chat("demo/echo", stream=True))
    assert r.status_code == 502, r.text
    r = call("POST", "/v1/messages", anthropic=True, json={**msg, "model": "demo/echo-claude"})
    assert r.status_code == 502, r.text
    assert r.json()["type"] == "error"
    r = call("POST", "/v1/responses", json={"model": "demo/echo", "input": "hi"})
    assert r.status_code == 502, r.text
    # A 400 whose message quotes the bare key.
    r = call("POST", "/v1/chat/completions", json=chat("demo/echo-bad"))
    assert r.status_code == 400, r.text
    assert "[redacted]" in r.json()["error"]["message"]
    # The sealed provider key: the worker decrypts it (a 200 from the mock), and the echo
    # upstream's 401 quoting the plaintext is redacted like the others.
    assert call("POST", "/v1/chat/completions", json=chat("demo/mock-enc")).status_code == 200
    r = call("POST", "/v1/chat/completions", json=chat("demo/echo-enc"))
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_auth_failed", r.text
    # The admin API with the admin key: create a key (shown once), use it, list keys, view the
    # config (the stored text, with the `enc:v1:` ciphertext and no secret), read usage.
    r = call("POST", "/admin/keys", key=ADMIN_API_KEY, json={"id": "made-e2e", "tenant": "a"})
    assert r.status_code == 201, r.text
    created = r.json()["key"]
    assert len(created) >= 32 and r.json()["id"] == "made-e2e"
    # Shown once: in that response (which is then not searched for it), nowhere else.
    shown_once = produced.pop()
    assert created in shown_once
    secrets.append(created)
    assert call("POST", "/v1/chat/completions", key=created, json=chat("demo/mock")).status_code == 200
    r = call("GET", "/admin/keys", key=ADMIN_API_KEY)
    assert r.status_code == 200, r.text
    assert {"team-a", "ops", "made-e2e"} <= {k["id"] for k in r.json()["data"]}, r.text
    r = call("GET", "/admin/config", key=ADMIN_API_KEY)
    assert r.status_code == 200 and "enc:v1:" in r.text and "made-e2e" in r.text, r.text
    assert call("GET", "/admin/usage", key=ADMIN_API_KEY).status_code == 200
    # The admin API key is no client key, nor a wrong admin key an admin key.
    assert call("POST", "/v1/chat/completions", key=ADMIN_API_KEY,
                json=chat("demo/mock")).status_code == 401
    assert call("GET", "/admin/keys", key=WRONG_KEY).status_code == 401
    assert call("GET", "/admin/keys", key=CLIENT_KEY).status_code == 401
    # A wrong client key, and the admin key reading usage.
    assert call("POST", "/v1/chat/completions", key=WRONG_KEY, json=chat("demo/mock")).status_code == 401
    assert call("POST", "/v1/messages", key=WRONG_KEY, anthropic=True, json=msg).status_code == 401
    usage = wait_for_usage(call)
    assert usage.status_code == 200, usage.text
    tapped = b"".join(t.close() for t in taps)
    # Graceful stop: every buffered log line and ledger row is written.
    up.stop(grace_s=20.0)

    hits: list[str] = [f"nats message: {s}" for s in secrets if s.encode() in tapped]
    # Positive control: the taps saw this run's requests (prompt "hi") and usage (key id).
    assert b"team-a" in tapped and b'"hi"' in tapped, tapped[:2000]
    assert b"MSG sy.req." in tapped and b"Permissions Violation" not in tapped
    for i, text in enumerate(produced):
        hits += [f"response {i}: {s}" for s in secrets if s in text]
    hits += [f"key-create response: {s}" for s in secrets if s != created and s in shown_once]
    log = up.log()
    # Positive control: the upstream failures are logged (their sanitised messages).
    assert "upstream returned HTTP 401" in log and "upstream returned HTTP 400" in log, \
        "the failures were not logged"
    for n, line in enumerate(log.splitlines(), 1):
        hits += [f"log line {n}: {s}" for s in secrets if s in line]
    ledger = data / "ledger.db"
    assert ledger.exists()
    db = sqlite3.connect(ledger)
    tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    # Positive controls: the searches do read what this run wrote (the key id, the echo target).
    seen_in_ledger = seen_in_files = False
    for t in tables:
        for row in db.execute(f'SELECT * FROM "{t}"'):
            text = " ".join(str(c) for c in row)
            seen_in_ledger |= "team-a" in text and "echo" in text
            hits += [f"ledger {t}: {s}" for s in secrets if s in text]
    db.close()
    assert seen_in_ledger, "no ledger row of this run found"
    for f in data.rglob("*"):
        if f.is_file():
            raw = f.read_bytes()
            seen_in_files |= b"demo/mock" in raw
            hits += [f"file {f.relative_to(data)}: {s}" for s in secrets if s.encode() in raw]
    assert seen_in_files, "no KV value of this run found in the JetStream store"
    assert not hits, "\n".join(hits)


def wait_for_usage(call):
    """The usage API with the admin key, once billing has the rows of this run."""
    out = {}

    def ready() -> bool:
        r = call("GET", "/v1/usage", key=ADMIN_KEY)
        out["r"] = r
        return r.status_code == 200 and r.json().get("totals", {}).get("requests", 0) >= 6

    wait_until("usage rows in the ledger", ready, READY_DEADLINE_S)
    return out["r"]
