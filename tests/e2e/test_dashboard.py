"""The live dashboard (issue 15, Deliver 4) after a short traffic run through `switchyard up`:
`GET /admin/dashboard.json` holds the exact figures of the run, the browser sign-in gives an
HttpOnly cookie accepted on the dashboard's data route only, and headless Chromium (Debian
`chromium`, installed by scripts/bootstrap) renders every chart of `GET /dashboard` with data.

It also renders `switchyard report daily --format html` of the same ledger and checks that the
page fits 1,400 px (Deliver 5). Full-page screenshots of both come from scripts/screenshot;
`SWITCHYARD_UPDATE_SCREENSHOTS=1` copies them to docs/dashboard.png and docs/report-example.png
(the README's pictures). Bounded: about 20 s here, under a minute on CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from conftest import REPO_ROOT, http_ok, start_up, switchyard_bin, wait_until

ADMIN_KEY = "sk-sy-admin-dash-0123456789abcdef"
TEAM_A = "sk-sy-team-a-dash-0123456789abcdef"
TEAM_B = "sk-sy-team-b-dash-0123456789abcdef"
TENANT_ADMIN = "sk-sy-acme-admin-dash-0123456789abcdef"

# $10 / $30 per 1M tokens for sale, $2 / $6 at cost. The mock answers 1 prompt token for a
# one-word prompt and 13 completion tokens: a charge of $0.0004 and a cost of $0.00008.
CATALOG = """\
currency: USD
as_of: 2026-12-01
upstream:
  mock: {input: 2, output: 6}
  claude-test: {input: 2, output: 6}
standard:
  demo/mock: {input: 10, output: 30}
  demo/slow: {input: 10, output: 30}
  demo/fallback: {input: 10, output: 30}
"""
CHARGE = Decimal("0.0004")
COST = Decimal("0.00008")

CHARTS = ["spend-model", "spend-tenant", "traffic", "cache", "latency", "ttft", "health",
          "budgets", "recent"]


def config(tmp: Path) -> Path:
    (tmp / "catalog.yaml").write_text(CATALOG)
    path = tmp / "dashboard.yaml"
    path.write_text(f"""\
listen: 127.0.0.1:8080
subject_prefix: sy
data_dir: ./data
pricing_file: "{tmp / 'catalog.yaml'}"
targets:
  - {{id: mock, provider: openai, base_url: "builtin:mock", upstream_model: mock}}
  - {{id: mock-slow, provider: anthropic, base_url: "builtin:mock/x/ttft_ms=40", upstream_model: claude-test}}
  - {{id: broken, provider: openai, base_url: "builtin:mock/x/status=503", upstream_model: mock,
     retry: {{max_attempts: 1}},
     breaker: {{min_calls: 2, failure_rate: 0.5, window_ms: 60000, open_ms: 60000}}}}
models:
  - {{id: demo/mock, targets: [mock]}}
  - {{id: demo/slow, targets: [mock-slow]}}
  - {{id: demo/fallback, targets: [broken, mock]}}
tenants:
  - {{id: ops}}
  - {{id: acme}}
  - {{id: globex}}
keys:
  - {{id: ready, tenant: ops, key: sk-ready}}
  - {{id: team-a, tenant: acme, key: {TEAM_A}, budget: {{daily_usd: 0.001}}}}
  - {{id: team-b, tenant: globex, key: {TEAM_B}}}
admin:
  keys:
    - {{id: ops, key: {ADMIN_KEY}}}
    - {{id: acme-admin, key: {TENANT_ADMIN}, tenant: acme}}
""")
    return path


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("chromium not found: run scripts/bootstrap (it installs Debian's chromium)")


def chat(base: str, key: str, model: str, text: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", timeout=30.0,
                      headers={"authorization": f"Bearer {key}"},
                      json={"model": model, "max_tokens": 13,
                            "messages": [{"role": "user", "content": text}]})


def dashboard(base: str) -> dict:
    r = httpx.get(f"{base}/admin/dashboard.json", timeout=15.0,
                  headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200, r.text
    return r.json()


def series(d: dict, dim: str, name: str) -> dict:
    return next((s for s in d["spend"][f"by_{dim}"] if s[dim] == name), {})


def budget_used(base: str, key_id: str) -> str | None:
    rows = (dashboard(base)["budgets"] or {}).get("data", [])
    return next((r["used"] for r in rows if r["scope"] == "key" and r["id"] == key_id), None)


def test_dashboard_shows_the_run_and_renders_in_chromium(procs, tmp_path):
    browser = chromium()
    up = start_up(procs, tmp_path / "data", "--config", str(config(tmp_path)), "--no-local-model")
    base = up.base_url
    # The cache service (embedding model included) may get ready after ingress answers; the
    # miss asserted below needs it, or the lookup is a `bypass` (no cache instance yet).
    wait_until("switchyard up /readyz (the cache service)", lambda: http_ok(f"{base}/readyz"),
               30.0, [up.proc])

    # team-a (tenant acme, $0.001 a day): two requests, each settled before the next is
    # reserved (the budget store is the event waited on), ending at 80 % of the budget.
    for i, word in enumerate(["alpha", "bravo"], start=1):
        r = chat(base, TEAM_A, "demo/mock", word)
        assert r.status_code == 200, r.text
        want = str((CHARGE * i).normalize())
        wait_until(f"team-a's budget to settle at ${want}", lambda: budget_used(base, "team-a") == want,
                   15.0, [up.proc])
    # team-b (tenant globex): a slow target's miss then its cache hit, a fallback, a client error.
    assert chat(base, TEAM_B, "demo/slow", "delta").headers.get("x-switchyard-cache") == "miss"
    hit = chat(base, TEAM_B, "demo/slow", "delta")
    assert (hit.status_code, hit.headers.get("x-switchyard-cache")) == (200, "hit")
    # Two fallbacks past the failing target: its breaker (min_calls 2) opens.
    assert chat(base, TEAM_B, "demo/fallback", "echo").status_code == 200
    assert chat(base, TEAM_B, "demo/fallback", "foxtrot").status_code == 200
    assert chat(base, TEAM_B, "demo/mock", "golf\n#mock status=400").status_code == 400

    # Billing writes the ledger asynchronously: wait until every team request is in it.
    def ledger_complete() -> bool:
        d = dashboard(base)
        return (d["spend"] is not None and sum(series(d, "tenant", "acme").get("requests", [0])) == 2
                and sum(series(d, "tenant", "globex").get("requests", [0])) == 5
                and d["latency"] is not None and d["latency"]["window"]["records"] >= 7)

    wait_until("the ledger and audit log to hold the run", ledger_complete, 20.0, [up.proc])
    d = dashboard(base)
    assert d["object"] == "dashboard" and d["errors"] == {}, d["errors"]
    assert series(d, "tenant", "acme")["total_charge_usd"] == str((2 * CHARGE).normalize())
    # globex: delta (miss), echo and foxtrot (served by the fallback) are charged; the hit and the
    # 400 are not.
    assert series(d, "tenant", "globex")["total_charge_usd"] == str((3 * CHARGE).normalize())
    assert series(d, "tenant", "globex")["requests"][-1] == 5
    assert d["traffic"]["today"]["errors"] == 1
    assert sum(d["traffic"]["requests"]) == d["traffic"]["last_24h"]["requests"]
    assert d["cache"]["today"]["hits"] >= 1
    win = d["cache"]["window"]
    assert win["hits"] >= 1 and win["unpriced_hits"] == 0
    assert Decimal(win["savings_usd"]) == COST * win["hits"]
    by_target = {t["target"]: t for t in d["latency"]["targets"]}
    assert {"mock", "mock-slow"} <= set(by_target), by_target
    assert by_target["mock-slow"]["ttft_ms"]["p50"] >= 40
    assert by_target["mock-slow"]["latency_ms"]["p99"] >= by_target["mock-slow"]["latency_ms"]["p50"]
    assert [t["target"] for t in d["targets"]] == ["mock", "mock-slow", "broken"]

    # The worker's breaker event reaches this replica's health view (plain NATS, asynchronous).
    def broken_open() -> bool:
        t = next(t for t in dashboard(base)["targets"] if t["target"] == "broken")
        return t["state"] == "unhealthy" and [b["breaker"] for b in t["breakers"]] == ["open"]

    wait_until("the broken target's breaker to show open", broken_open, 10.0, [up.proc])
    broken = next(t for t in dashboard(base)["targets"] if t["target"] == "broken")
    assert broken["breakers"][0]["reason"] == "breaker_open"
    assert broken["breakers"][0]["worker"].startswith("worker-")
    assert all(t["state"] == "healthy" for t in dashboard(base)["targets"] if t["target"] != "broken")
    budget = next(r for r in d["budgets"]["data"] if r["id"] == "team-a")
    assert (budget["limit"], budget["used"], budget["limit_value"], budget["share"], budget["near"]) == \
        ("daily_usd", "0.0008", "0.001", 0.8, True)
    assert d["budgets"]["near"] == 1
    recent = d["recent"]
    assert recent[0]["time"] >= recent[-1]["time"]
    assert {"status", "http_status", "latency_ms", "model", "target"} <= set(recent[0])
    assert not any("request_body" in r for r in recent)

    # Sign-in: the form, a wrong key, a client key, the exchange, and the cookie's reach.
    login = httpx.get(f"{base}/dashboard", timeout=5.0)
    assert login.status_code == 200 and 'action="/dashboard/login"' in login.text
    assert "frame-ancestors 'none'" in login.headers["content-security-policy"]
    assert httpx.post(f"{base}/dashboard/login", data={"key": TEAM_A}, timeout=5.0).status_code == 401
    # Gateway-wide figures: a tenant admin key can neither sign in nor read the JSON.
    assert httpx.post(f"{base}/dashboard/login", data={"key": TENANT_ADMIN}, timeout=5.0).status_code == 403
    assert httpx.get(f"{base}/admin/dashboard.json", timeout=5.0,
                     headers={"authorization": f"Bearer {TENANT_ADMIN}"}).status_code == 403
    ok = httpx.post(f"{base}/dashboard/login", data={"key": ADMIN_KEY}, timeout=5.0)
    assert (ok.status_code, ok.headers["location"]) == (303, "/dashboard")
    cookie = ok.headers["set-cookie"]
    for attr in ("HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"):
        assert attr in cookie, cookie
    # A signed session naming the admin key's id, never the key itself.
    assert cookie.startswith("switchyard_admin=v1.") and ADMIN_KEY not in cookie, cookie
    jar = {"cookie": cookie.split(";")[0]}
    assert httpx.get(f"{base}/admin/dashboard.json", headers=jar, timeout=15.0).status_code == 200
    # The cookie is good for the dashboard's read-only data route only.
    assert httpx.get(f"{base}/admin/keys", headers=jar, timeout=5.0).status_code == 401
    page = httpx.get(f"{base}/dashboard", headers=jar, timeout=5.0)
    assert page.status_code == 200 and 'data-chart="spend-model"' in page.text
    out = httpx.post(f"{base}/dashboard/logout", headers=jar, timeout=5.0)
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]

    # Headless Chromium: `?key=` is exchanged for the cookie (303), the page fetches its data,
    # and every chart marks itself rendered with the number of data marks it drew.
    profile = tmp_path / "chromium-profile"
    shot = tmp_path / "dashboard.png"
    flags = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
             "--window-size=1400,1560", "--virtual-time-budget=8000"]
    url = f"{base}/dashboard?key={ADMIN_KEY}"
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=45)
    assert dom.returncode == 0, dom.stderr[-3000:]
    assert 'data-loaded="' in dom.stdout, dom.stdout[-3000:]
    for name in CHARTS:
        tag = re.search(r'<section[^>]*data-chart="%s"[^>]*>' % re.escape(name), dom.stdout)
        assert tag, f"chart {name} missing"
        points = re.search(r'data-points="(\d+)"', tag.group(0))
        assert 'data-rendered="1"' in tag.group(0) and points and int(points.group(1)) > 0, \
            f"chart {name} rendered no data: {tag.group(0)}"
    # The error banner stayed empty: every section answered, every refresh succeeded.
    assert re.search(r'<div id="errors"[^>]*></div>', dom.stdout), dom.stdout[:3000]
    # Full-page screenshots (scripts/screenshot: chromedriver, the page's own height): the
    # dashboard, and the HTML daily report of the same ledger, which must fit 1,400 px (issue 15,
    # Deliver 5: its table ran off the right edge).
    dash = screenshot(f"{base}/dashboard?key={ADMIN_KEY}", shot, "body[data-loaded]")
    assert dash["scroll_width"] <= 1400, dash
    report = tmp_path / "report.html"
    with open(report, "wb") as f:
        subprocess.run([switchyard_bin(), "report", "daily", "--format", "html", "--database-url",
                        f"sqlite://{up.ledger_path}"], stdout=f, check=True, timeout=30)
    assert "By tenant, model and target" in report.read_text()
    report_shot = tmp_path / "report.png"
    fit = screenshot(report.as_uri(), report_shot, None)
    assert fit["scroll_width"] <= 1400, f"the daily report runs off a 1,400 px page: {fit}"
    if os.environ.get("SWITCHYARD_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(shot, REPO_ROOT / "docs" / "dashboard.png")
        shutil.copyfile(report_shot, REPO_ROOT / "docs" / "report-example.png")


def screenshot(url: str, out: Path, wait_for: str | None) -> dict:
    """scripts/screenshot at 1,400 px: {width, scroll_width, height, out}; checks the PNG."""
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "screenshot"), url, str(out), "--width", "1400"]
    if wait_for:
        cmd += ["--wait-for", wait_for]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=45)
    assert run.returncode == 0, run.stderr[-3000:]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads(run.stdout)
