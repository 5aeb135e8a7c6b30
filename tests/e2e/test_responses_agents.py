"""Agent frameworks on their default Responses API path through Switchyard, against the
OpenAI-style (`demo/mock`) and the Anthropic-style (`demo/claude`) mock upstream:

- the OpenAI Agents SDK (`openai-agents`, default model class = Responses), run from its own venv
  `.tools/agents-venv` (it needs openai>=3; the main venv pins openai<3), see clients/agents_run.py;
- the Vercel AI SDK (`ai` + `@ai-sdk/openai`: `openai(model)` is the Responses API), installed by
  scripts/install-ai-sdk into `.tools/ai-sdk`, see clients/ai_sdk_run.mjs;
- the Codex CLI (`@openai/codex`, `codex exec`) with a custom model provider at Switchyard
  (`wire_api = "responses"`), installed by scripts/install-codex into `.tools/codex`. Its web
  search tool is turned off in its config: hosted tools are a 400 naming them (README, "OpenAI
  Responses API"), and Codex sends `web_search` by default.

Both are installed by scripts/bootstrap; a missing install fails the test (CI must have them).
"""

from __future__ import annotations

import json
import os
import urllib.parse
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


CODEX_CONFIG = """\
model = "{model}"
model_provider = "switchyard"
web_search = "disabled"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.switchyard]
name = "Switchyard"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "SWITCHYARD_KEY"
"""


@pytest.mark.parametrize("model", MODELS)
def test_codex_exec_runs_a_tool(gateway, model, tmp_path):
    codex = TOOLS / "codex" / "node_modules" / ".bin" / "codex"
    if not codex.exists():
        pytest.fail(f"{codex} missing: run scripts/bootstrap")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(CODEX_CONFIG.format(model=model, base_url=gateway.base_url))
    # The mock calls Codex's first tool (exec_command) once with these arguments.
    args = urllib.parse.quote(json.dumps({"cmd": "echo switchyard-tool-ran"}))
    prompt = f"Run the command.\n#mock tool_calls=1 tool_args={args}"
    proc = subprocess.run([str(codex), "exec", "--skip-git-repo-check", prompt], cwd=work, timeout=180,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env={**os.environ, "CODEX_HOME": str(home), "SWITCHYARD_KEY": "sk-codex"})
    assert proc.returncode == 0, f"codex failed:\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    # `codex exec` prints the final message last on stdout.
    assert proc.stdout.strip().splitlines()[-1] == DEFAULT_TEXT, proc.stdout
    # The second model call carried the command's output back as the tool result.
    follow = gateway.mock.requests()[-1]["body"]
    last = follow["messages"][-1]
    if model == "demo/mock":
        assert last["role"] == "tool"
        result = last["content"]
    else:
        block = last["content"][-1]
        assert block["type"] == "tool_result"
        result = json.dumps(block["content"])
    assert "switchyard-tool-ran" in result, follow["messages"][-1]
