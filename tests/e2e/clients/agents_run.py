"""One OpenAI Agents SDK run through Switchyard (run by tests/e2e/test_responses_agents.py with the
separate venv .tools/agents-venv, because openai-agents needs openai>=3 while the main venv pins
openai<3). Default model class (the Responses API), one function tool; prints a JSON summary.

Usage: agents_run.py BASE_URL MODEL
"""

from __future__ import annotations

import asyncio
import json
import sys

from openai import AsyncOpenAI

from agents import (Agent, OpenAIResponsesModel, Runner, function_tool, set_default_openai_client,
                    set_tracing_disabled)

CALLS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    CALLS.append(city)
    return f"sunny in {city}"


async def main(base_url: str, model: str) -> None:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-agents", max_retries=0)
    set_default_openai_client(client)
    # The SDK's default model class, named explicitly: a model string with a `/` is read as a
    # provider prefix (`demo/…` → "Unknown prefix").
    agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather],
                  model=OpenAIResponsesModel(model=model, openai_client=client))
    prompt = "Weather in Paris?\n#mock tool_calls=1"
    result = await Runner.run(agent, prompt)
    streamed = Runner.run_streamed(agent, prompt)
    kinds = []
    async for event in streamed.stream_events():
        kinds.append(event.type)
    print(json.dumps({
        "final_output": result.final_output,
        "streamed_final_output": streamed.final_output,
        "calls": CALLS,
        "raw_responses": len(result.raw_responses),
        "response_ids": [r.response_id for r in result.raw_responses],
        "stream_event_types": sorted(set(kinds)),
    }))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
