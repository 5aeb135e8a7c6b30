"""Acceptance: Claude Code (`@anthropic-ai/claude-code` from npm, pinned in
scripts/install-claude-code, installed lazily into .tools/claude-code) runs non-interactively
(`claude -p`) with default settings against Switchyard, telemetry and auto-update off, and
completes a 3-turn tool-using run: turn 1 calls Bash, whose output asks for turn 2 (Read), whose
result ends the run with a text answer (turn 3). Once behind an Anthropic-format upstream
(`demo/claude`), once behind an OpenAI-format one (`demo/mock`), both the mock.

The mock drives the run with `#mock call=<tool>:<json>` lines: the prompt asks for the Bash call,
the Bash command's output is the line asking for the Read call, the file read holds none.
Every request Claude Code sent is logged (pytest -s / the report) for the record of which fields
it uses.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest

from conftest import DEFAULT_TEXT, REPO_ROOT

KEY = "sk-sy-claude-code-0123456789"
KEYS_YAML = f"""\
keys:
  - id: claude-code
    tenant: acceptance
    key: "{KEY}"
"""


def claude_bin() -> str:
    out = subprocess.run([str(REPO_ROOT / "scripts" / "install-claude-code")], check=True,
                         capture_output=True, text=True, timeout=600)
    return out.stdout.strip().splitlines()[-1]


def directive(tool: str, args: dict) -> str:
    return f"#mock call={tool}:{quote(json.dumps(args, separators=(',', ':')), safe='')}"


@pytest.mark.config_extra(KEYS_YAML, ready_key=KEY)
@pytest.mark.parametrize("model", ["demo/claude", "demo/mock"])
def test_claude_code_three_turn_tool_run(gateway, tmp_path, model):
    exe = claude_bin()
    work = tmp_path / "work"
    work.mkdir()
    notes = work / "notes.txt"
    notes.write_text("The secret number is 42.\n")
    read_step = directive("Read", {"file_path": str(notes)})
    bash_step = directive("Bash", {"command": f"echo '{read_step}'", "description": "Print the next step"})
    prompt = f"Follow the steps.\n{bash_step}"
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": gateway.base_url,
        "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    run = subprocess.run(
        [exe, "-p", prompt, "--output-format", "json", "--allowedTools", "Bash(echo:*)", "Read",
         "--max-turns", "6"],
        cwd=work, env=env, capture_output=True, text=True, timeout=180)
    requests = [r for r in gateway.mock.requests() if r["path"].endswith(("/messages", "/chat/completions"))]
    log = tmp_path / "claude-code-requests.json"
    log.write_text(json.dumps(requests, indent=1))
    for i, r in enumerate(requests):
        body = dict(r["body"], system="…", tools=[t.get("name") or t.get("function", {}).get("name")
                                                  for t in r["body"].get("tools", [])])
        print(f"--- Claude Code request {i} ({r['path']}, headers {r['headers']}): {json.dumps(body)[:3000]}")
    assert run.returncode == 0, f"stdout: {run.stdout}\nstderr: {run.stderr}"
    result = json.loads(run.stdout)
    print("result:", json.dumps(result)[:2000])
    assert result["is_error"] is False, result
    assert result["result"] == DEFAULT_TEXT
    assert result["num_turns"] == 3, result
    # Claude Code's own requests (the fixture's readiness probe has no tools): three turns, the
    # second carrying the Bash call and its output, the third the Read call and the file.
    turns = [json.dumps(r["body"]) for r in requests if r["body"].get("tools")]
    assert len(turns) == 3, turns
    assert "call=Read" in turns[1] and "Bash" in turns[1]
    assert "The secret number is 42." not in turns[1]
    assert "The secret number is 42." in turns[2]
    first = next(r for r in requests if r["body"].get("tools"))
    if model == "demo/claude":
        # What Claude Code sends reached the Anthropic upstream unchanged.
        body = first["body"]
        for field in ("thinking", "context_management", "output_config", "metadata"):
            assert field in body, field
        assert dict(first["headers"]).get("anthropic-beta", "").startswith("claude-code-")
        # Its prompt-caching breakpoints too: on system blocks and on the conversation's last block.
        assert any("cache_control" in b for b in body["system"])
        last = requests[-1]["body"]["messages"][-1]["content"]
        assert "cache_control" in last[-1], last
