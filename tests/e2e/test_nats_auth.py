"""NATS authentication end to end (docs/security.md): `switchyard up`'s generated credentials,
and the compose topology (config/nats-server.conf, one identity per service process)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import stat
import subprocess

import httpx
from openai import OpenAI

from conftest import (DEFAULT_TEXT, MODEL, READY_DEADLINE_S, REPO_ROOT, START_DEADLINE_S, chat_ok,
                      http_ok, nats_server_bin, pick_free_port, start_up, switchyard_bin,
                      wait_until, write_config)

IDENTITIES = ["admin", "billing", "cache", "ingress", "worker"]


def nats_handshake(port: int, connect: dict) -> bytes:
    """Sends CONNECT + PING on a raw NATS connection; returns the server's answer
    (`PONG` when admitted, `-ERR 'Authorization Violation'` when not)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.recv(4096)  # INFO
        s.sendall(f"CONNECT {json.dumps({'verbose': False, **connect})}\r\nPING\r\n".encode())
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer.split(b"\r\n")[0]


def chat_content(base_url: str) -> str:
    client = OpenAI(base_url=f"{base_url}/v1", api_key="sk-anything", max_retries=0, timeout=30.0)
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    return out.choices[0].message.content


def test_up_writes_private_credentials_reuses_them_and_serves(procs, tmp_path):
    data = tmp_path / "up-data"
    nats_port = pick_free_port()
    up = start_up(procs, data, "--nats-port", str(nats_port), "--no-local-model")
    creds_file = data / "nats-credentials.json"
    assert stat.S_IMODE(creds_file.stat().st_mode) == 0o600
    conf = data / "nats" / "switchyard-nats.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    creds = json.loads(creds_file.read_text())
    assert sorted(creds) == IDENTITIES
    assert all(len(pw) == 32 for pw in creds.values())
    assert len(set(creds.values())) == 5

    assert nats_handshake(nats_port, {}) == b"-ERR 'Authorization Violation'"
    assert nats_handshake(nats_port, {"user": "worker", "pass": "guess"}) == \
        b"-ERR 'Authorization Violation'"
    assert nats_handshake(nats_port, {"user": "admin", "pass": creds["admin"]}) == b"PONG"
    assert chat_content(up.base_url) == DEFAULT_TEXT
    # No password reaches the log.
    assert not [pw for pw in creds.values() if pw in up.proc.log()]

    # The next `up` on the same data dir keeps the passwords.
    up.proc.stop()
    again = start_up(procs, data, "--nats-port", str(nats_port), "--no-local-model",
                     name="switchyard-up-2")
    assert json.loads(creds_file.read_text()) == creds
    assert chat_content(again.base_url) == DEFAULT_TEXT


def test_compose_topology_each_service_on_its_own_identity(procs, tmp_path, mock_upstream):
    """The compose setup without docker: nats-server on config/nats-server.conf with the
    passwords in its environment, each service with SWITCHYARD_NATS_USER/_PASSWORD/_INBOX_PREFIX,
    and ingress also with the admin identity (SWITCHYARD_ADMIN_NATS_USER/_PASSWORD, as
    compose.yaml gives it) for the admin API's writes."""
    exe = switchyard_bin()
    env_lines = subprocess.run([exe, "nats-config", "--passwords"], check=True,
                               capture_output=True, text=True).stdout
    passwords = dict(line.split("=", 1) for line in env_lines.splitlines())
    assert sorted(passwords) == [f"SWITCHYARD_NATS_PASSWORD_{i.upper()}" for i in IDENTITIES]
    generated = subprocess.run([exe, "nats-config"], check=True, capture_output=True,
                               text=True).stdout
    assert generated == (REPO_ROOT / "config" / "nats-server.conf").read_text()

    port, mport = pick_free_port(), pick_free_port()
    (tmp_path / "nats").mkdir()
    nats = procs.start("nats-server", [
        nats_server_bin(), "-c", str(REPO_ROOT / "config" / "nats-server.conf"),
        "-a", "127.0.0.1", "-p", str(port), "-m", str(mport), "-js", "-sd", str(tmp_path / "nats"),
    ], env=passwords)
    wait_until("nats-server /healthz", lambda: http_ok(f"http://127.0.0.1:{mport}/healthz"),
               START_DEADLINE_S, [nats])
    url = f"nats://127.0.0.1:{port}"
    listen = f"127.0.0.1:{pick_free_port()}"
    admin_key = "sy-topology-admin-key-0123456789abcdef"
    config = write_config(tmp_path, listen,
                          'admin:\n  keys:\n    - {id: ops, key: "env:SY_TOPO_ADMIN_KEY"}\n')

    def as_identity(name: str) -> dict:
        return {"SWITCHYARD_NATS_URL": url, "SWITCHYARD_NATS_USER": name,
                "SWITCHYARD_NATS_PASSWORD": passwords[f"SWITCHYARD_NATS_PASSWORD_{name.upper()}"],
                "SWITCHYARD_NATS_INBOX_PREFIX": f"_INBOX.{name}"}

    ledger = tmp_path / "ledger.db"
    billing = procs.start("billing", [exe, "billing", "--config", str(config),
                                      "--database-url", f"sqlite://{ledger}?mode=rwc"],
                          env=as_identity("billing"))
    worker = procs.start("worker", [exe, "worker", "--config", str(config),
                                    "--mock-url", f"{mock_upstream.base_url}/v1"],
                         env=as_identity("worker"))
    cache = procs.start("cache", [exe, "cache", "--config", str(config)], env=as_identity("cache"))
    ingress = procs.start("ingress", [exe, "ingress", "--config", str(config), "--listen", listen],
                          env={**as_identity("ingress"), "SY_TOPO_ADMIN_KEY": admin_key,
                               "SWITCHYARD_ADMIN_NATS_USER": "admin",
                               "SWITCHYARD_ADMIN_NATS_PASSWORD":
                                   passwords["SWITCHYARD_NATS_PASSWORD_ADMIN"]})
    base = f"http://{listen}"
    services = [billing, worker, cache, ingress]
    wait_until("a chat through the authenticated topology", lambda: chat_ok(base), READY_DEADLINE_S,
               services)
    assert chat_content(base) == DEFAULT_TEXT

    def ledger_rows() -> int:
        if not ledger.exists():
            return 0
        con = sqlite3.connect(ledger)
        try:
            return con.execute("SELECT COUNT(*) FROM usage_events").fetchone()[0]
        finally:
            con.close()

    # Two requests (readiness probe and the chat above), an upstream and a charge row each.
    wait_until("4 ledger rows", lambda: ledger_rows() == 4, 10.0, services)

    # A live config push: refused for a worker's credentials, taken with admin's.
    pushed = config.read_text().replace(
        "models:\n", "models:\n  - id: demo/pushed\n    targets: [mock]\n", 1)
    (tmp_path / "pushed.yaml").write_text(pushed)
    refused = subprocess.run([exe, "config", "push", str(tmp_path / "pushed.yaml")],
                             env={**os.environ, **as_identity("worker")}, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1, refused.stderr
    admin = subprocess.run([exe, "config", "push", str(tmp_path / "pushed.yaml")],
                           env={**os.environ, **as_identity("admin")}, capture_output=True,
                           text=True, timeout=60)
    assert admin.returncode == 0, admin.stderr
    assert admin.stdout.startswith("config version 1 is live")

    def model_listed() -> bool:
        r = httpx.get(f"{base}/v1/models", headers={"authorization": "Bearer sk-x"}, timeout=5)
        return any(m["id"] == "demo/pushed" for m in r.json()["data"])

    wait_until("ingress to reload the pushed config", model_listed, 10.0, services)

    # The admin API writes the live config through ingress's admin connection: a key created
    # there (201, shown once) serves a chat at once.
    r = httpx.post(f"{base}/admin/keys", json={"id": "made", "tenant": "t"},
                   headers={"authorization": f"Bearer {admin_key}"}, timeout=10)
    assert r.status_code == 201, r.text
    created = r.json()["key"]
    assert chat_ok(base, api_key=created)
    r = httpx.post(f"{base}/v1/chat/completions", headers={"authorization": "Bearer sk-nope"},
                   json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert r.status_code == 401, r.text
    for p in services:
        assert "Permissions Violation" not in p.log(), p.name
        p.check_alive()


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (EC P-256)."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test-ca",
             cwd=d)
    for name, ext in [("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")]:
        (d / f"{name}.ext").write_text("basicConstraints=CA:FALSE\n" + ext)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
                 cwd=d)


def test_tls_with_ca_and_client_certificate(procs, tmp_path):
    """--nats-tls-ca, --nats-tls-cert/--nats-tls-key and a token against a nats-server that
    requires TLS with verified client certificates."""
    pki = tmp_path / "pki"
    pki.mkdir()
    make_pki(pki)
    port = pick_free_port()
    conf = tmp_path / "tls.conf"
    conf.write_text(
        f'tls {{ cert_file: "{pki}/server.pem", key_file: "{pki}/server.key", '
        f'ca_file: "{pki}/ca.pem", verify: true }}\n'
        'authorization { token: "tls-test-token" }\n')
    (tmp_path / "js").mkdir()
    nats = procs.start("nats-server-tls", [nats_server_bin(), "-c", str(conf), "-a", "127.0.0.1",
                                          "-p", str(port), "-js", "-sd", str(tmp_path / "js")])

    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    wait_until("nats-server (TLS) to listen", listening, START_DEADLINE_S, [nats])
    config = write_config(tmp_path, "127.0.0.1:1")
    exe = switchyard_bin()
    url = f"tls://127.0.0.1:{port}"
    base = [exe, "config", "push", str(config), "--nats-url", url]
    env = {**os.environ, "SWITCHYARD_NATS_TOKEN": "tls-test-token"}
    tls = ["--nats-tls-ca", str(pki / "ca.pem"), "--nats-tls-cert", str(pki / "client.pem"),
           "--nats-tls-key", str(pki / "client.key")]

    def run(args: list[str], extra_env: dict | None = None):
        return subprocess.run(args, env={**env, **(extra_env or {})}, capture_output=True,
                              text=True, timeout=60)

    ok = run(base + tls)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "config version 1 is live\n"
    # Without the client certificate, or without the CA that signed the server's, no connection.
    no_client_cert = run(base + tls[:2])
    assert no_client_cert.returncode == 1
    assert no_client_cert.stderr.startswith(f"switchyard: connecting to NATS at {url}:")
    no_ca = run(base + tls[2:])
    assert no_ca.returncode == 1
    assert no_ca.stderr.startswith(f"switchyard: connecting to NATS at {url}:")
    # The same settings from the environment; a wrong token is refused.
    show = run([exe, "config", "show", "--nats-url", url], {
        "SWITCHYARD_NATS_TLS_CA": str(pki / "ca.pem"),
        "SWITCHYARD_NATS_TLS_CERT": str(pki / "client.pem"),
        "SWITCHYARD_NATS_TLS_KEY": str(pki / "client.key")})
    assert show.returncode == 0, show.stderr
    assert show.stdout == f"# version 1\n{config.read_text()}\n"
    wrong = run(base + tls, {"SWITCHYARD_NATS_TOKEN": "guess"})
    assert wrong.returncode == 1
    assert "authorization violation" in wrong.stderr
