"""API keys and budgets as SDK users meet them: unmodified `openai` and `anthropic` clients with
their own key, 401 for a wrong key, 429 `insufficient_quota` once the daily budget is spent, and
`GET /v1/usage` scoped to the key's tenant."""

from __future__ import annotations

from decimal import Decimal

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from conftest import DEFAULT_COMPLETION_TOKENS, DEFAULT_TEXT, MODEL, wait_until

TEAM_KEY = "sk-sy-team-a-0123456789abcdef"
ADMIN_KEY = "sk-sy-admin-0123456789abcdef"

# demo/mock at $10 / $30 per 1M tokens. The mock reports 1 prompt token for "Hi" and 13
# completion tokens: $0.00001 + $0.00039 = $0.0004 per request.
CATALOG = """\
currency: USD
as_of: 2026-11-29
upstream:
  mock: {input: 10, output: 30}
  claude-test: {input: 10, output: 30}
standard:
  demo/mock: {input: 10, output: 30}
  demo/claude: {input: 10, output: 30}
"""

# $0.001 a day: the first request reserves ~$0.0008 (tokenizer estimate + max_tokens 20, +10 %)
# and settles at $0.0004; the second would need $0.0004 + ~$0.0008 > $0.001.
CONFIG = f"""\
pricing_file: "@TMP@/catalog.yaml"
keys:
  - id: team-a-app
    tenant: team-a
    key: {TEAM_KEY}
    budget: {{daily_usd: 0.001}}
  - id: finance
    tenant: platform
    key: {ADMIN_KEY}
    admin: true
"""

pytestmark = pytest.mark.config_extra(CONFIG, ready_key=ADMIN_KEY, files={"catalog.yaml": CATALOG})


def client(base_url: str, key: str) -> OpenAI:
    return OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=30.0)


def test_key_budget_and_usage_through_the_sdks(gateway):
    team = client(gateway.base_url, TEAM_KEY)
    r = team.chat.completions.create(
        model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "Hi"}])
    assert r.choices[0].message.content == DEFAULT_TEXT
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (1, DEFAULT_COMPLETION_TOKENS)

    with pytest.raises(openai.RateLimitError) as over:
        team.chat.completions.create(
            model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "Hi"}])
    assert over.value.status_code == 429
    assert over.value.code == "insufficient_quota"
    assert over.value.type == "insufficient_quota"
    assert "daily budget of key `team-a-app`" in over.value.message

    with pytest.raises(openai.AuthenticationError) as bad:
        client(gateway.base_url, "sk-sy-wrong-0123456789").models.list()
    assert bad.value.status_code == 401
    assert bad.value.code == "invalid_api_key"

    # The Anthropic SDK sends its key as x-api-key; the budget applies there too.
    ant = anthropic.Anthropic(base_url=gateway.base_url, api_key=TEAM_KEY, max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        ant.messages.create(model="demo/claude", max_tokens=20,
                            messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gateway.base_url, api_key="sk-sy-wrong-0123456789",
                            max_retries=0).messages.create(
            model="demo/claude", max_tokens=20, messages=[{"role": "user", "content": "Hi"}])

    # Usage: the team key sees its tenant only, to the cent; the admin key sees every tenant.
    def usage(key: str, query: str) -> httpx.Response:
        return httpx.get(f"{gateway.base_url}/v1/usage?{query}",
                         headers={"authorization": f"Bearer {key}"}, timeout=10.0)

    def team_rows() -> list:
        resp = usage(TEAM_KEY, "group_by=tenant,model")
        assert resp.status_code == 200, resp.text
        return resp.json()["data"]

    # Billing writes asynchronously: wait for the row under a deadline.
    wait_until("the team's usage row", lambda: len(team_rows()) == 1, 20.0,
               [gateway.billing, gateway.ingress])
    rows = team_rows()
    row = rows[0]
    assert row["group"] == {"tenant": "team-a", "model": MODEL}
    assert row["requests"] == 1
    assert row["output_tokens"] == DEFAULT_COMPLETION_TOKENS
    assert Decimal(row["charge_usd"]) == Decimal("0.0004")

    forbidden = usage(TEAM_KEY, "tenant=platform")
    assert forbidden.status_code == 404
    assert forbidden.json()["error"]["code"] == "not_found"

    everyone = usage(ADMIN_KEY, "group_by=tenant")
    assert everyone.status_code == 200
    tenants = {r["group"]["tenant"] for r in everyone.json()["data"]}
    assert {"team-a", "platform"} <= tenants
