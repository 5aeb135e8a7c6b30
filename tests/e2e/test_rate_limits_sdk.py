"""Key rate limits as an OpenAI SDK user meets them (FC-44): the gateway's own
`x-ratelimit-*` headers readable from `with_raw_response`, the SDK's `RateLimitError` on the
key's 429 with `Retry-After` and the headers readable from the error's response, and an
upstream 429's `retry-after: 17` reaching the SDK unchanged."""

from __future__ import annotations

import time

import openai
import pytest
from openai import OpenAI

from conftest import DEFAULT_TEXT, MODEL

READY_KEY = "sk-sy-ready-0123456789abcdef"
LIMITED_KEYS = ["sk-sy-rpm-a-0123456789abcdef", "sk-sy-rpm-b-0123456789abcdef"]

CONFIG = f"""\
keys:
  - id: ready
    tenant: ops
    key: {READY_KEY}
  - id: rpm-a
    tenant: team-a
    key: {LIMITED_KEYS[0]}
    limits: {{rpm: 2}}
  - id: rpm-b
    tenant: team-a
    key: {LIMITED_KEYS[1]}
    limits: {{rpm: 2}}
"""

pytestmark = pytest.mark.config_extra(CONFIG, ready_key=READY_KEY)


def client(base_url: str, key: str) -> OpenAI:
    return OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=30.0)


def minute() -> int:
    return int(time.time()) // 60


def test_key_rpm_headers_and_rate_limit_error_through_the_sdk(gateway):
    # A round that straddles a minute boundary sees two windows: again with the other key.
    for key in LIMITED_KEYS:
        start = minute()
        c = client(gateway.base_url, key)
        seen = []
        for _ in range(2):
            raw = c.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}])
            assert raw.parse().choices[0].message.content == DEFAULT_TEXT
            assert raw.headers["x-ratelimit-limit-requests"] == "2"
            seen.append(raw.headers["x-ratelimit-remaining-requests"])
            assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
        with pytest.raises(openai.RateLimitError) as over:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
        if minute() != start:
            continue
        assert seen == ["1", "0"]
        e = over.value
        assert e.status_code == 429
        assert e.code == "rate_limit_exceeded"
        assert e.type == "rate_limit_error"
        assert "requests per minute (RPM): limit 2, used 2" in e.message
        retry = int(e.response.headers["retry-after"])
        assert 1 <= retry <= 60
        assert e.response.headers["x-ratelimit-remaining-requests"] == "0"
        break
    else:
        pytest.fail("both rounds straddled a minute boundary")


def test_upstream_429_retry_after_reaches_the_sdk(gateway):
    c = client(gateway.base_url, READY_KEY)
    with pytest.raises(openai.RateLimitError) as over:
        c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "#mock status=429 retry_after=17"}])
    e = over.value
    assert e.status_code == 429
    assert e.response.headers["retry-after"] == "17"
    assert e.code == "rate_limit_exceeded"
    assert e.type == "rate_limit_error"
