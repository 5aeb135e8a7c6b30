"""Agent frameworks on their default Responses API path through Switchyard, against the
OpenAI-style (`demo/mock`) and the Anthropic-style (`demo/claude`) mock upstream:

- the OpenAI Agents SDK (`openai-agents`, default model class = Responses), run from its own venv
  `.tools/agents-venv` (it needs openai>=3; the main venv pins openai<3), see clients/agents_run.py;
- the Vercel AI SDK (`ai` + `@ai-sdk/openai`: `openai(model)` is the Responses API), installed by
  scripts/install-ai-sdk into `.tools/ai-sdk`, see clients/ai_sdk_run.mjs.

Both are installed by scripts/bootstrap; a missing install fails the test (CI must have them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import DEFAULT_TEXT, REPO_ROOT

CLIENTS = Path(__file__).resolve().parent / "clients"
TOOLS = REPO_ROOT / ".tools"
MODELS = ["demo/mock", "demo/claude"]


def run_client(args: list[str], env: dict | None = None) -> dict:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"{args[0]} failed:\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", MODELS)
def test_openai_agents_sdk_tool_run(gateway, model):
    python = TOOLS / "agents-venv" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} missing: run scripts/bootstrap")
    out = run_client([str(python), str(CLIENTS / "agents_run.py"), gateway.base_url, model])
    assert out["final_output"] == DEFAULT_TEXT
    assert out["streamed_final_output"] == DEFAULT_TEXT
    # One tool call per run (plain and streamed), each answered by a second model turn.
    assert out["calls"] == ["Paris", "Paris"]
    assert out["raw_responses"] == 2
    assert all(i.startswith("resp_") for i in out["response_ids"])
    assert "raw_response_event" in out["stream_event_types"]
    # Every model call went through the Responses front door to the upstream's own API.
    requests = gateway.mock.requests()
    expected = "/v1/chat/completions" if model == "demo/mock" else "/v1/messages"
    assert [r["path"] for r in requests[-4:]] == [expected] * 4


@pytest.mark.parametrize("model", MODELS)
def test_vercel_ai_sdk_generate_text_with_tool(gateway, model):
    node = shutil.which("node")
    script = CLIENTS / "ai_sdk_run.mjs"
    modules = TOOLS / "ai-sdk" / "node_modules"
    if node is None or not (modules / "ai").exists():
        pytest.fail(f"node or {modules}/ai missing: run scripts/bootstrap")
    # ES modules resolve imports next to the script, so it runs from the install folder.
    runner = modules.parent / "ai_sdk_run.mjs"
    shutil.copyfile(script, runner)
    out = run_client([node, str(runner), gateway.base_url, model])
    assert out["text"] == DEFAULT_TEXT
    assert out["toolCalls"] == [{"toolName": "get_weather", "input": {"city": "Paris"}}]
    assert out["steps"] == 2
    assert out["streamText"] == DEFAULT_TEXT
