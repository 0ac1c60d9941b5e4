"""An agent framework end to end against a real `kvgraft serve` on the real Gemma 3 270M: the OpenAI
Agents SDK (over the Responses API) runs an agent with one Python function tool. Checked at the HTTP
level: the tool was called with valid arguments, and its result went back to the server in the next
request. (The small model's final wording, and whether it stops calling the tool, are not the test.)"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from openai import AsyncOpenAI


def test_the_openai_agents_sdk_calls_a_tool_and_sends_its_result_back(agent_server):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from agents.exceptions import MaxTurnsExceeded

    set_tracing_disabled(True)  # no network: traces would go to OpenAI
    sent: list[dict] = []

    async def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content or b"{}"))

    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is 18 degrees and sunny in {city}."

    async def run():
        http = httpx.AsyncClient(event_hooks={"request": [record]}, timeout=120)
        client = AsyncOpenAI(base_url=agent_server.url + "/v1", api_key="unused", http_client=http, max_retries=0)
        agent = Agent(
            name="weather",
            instructions="Use the tool to answer.",
            tools=[get_weather],
            model=OpenAIResponsesModel("any", client),
            # the first turn must call the tool (the SDK then resets the choice to auto, so no loop is forced)
            model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=80),
        )
        try:
            return (await Runner.run(agent, "What is the weather in Paris?", max_turns=2)).final_output
        except MaxTurnsExceeded:  # the 270M may call the tool again instead of answering
            return None
        finally:
            await http.aclose()

    asyncio.run(run())
    assert calls and all(isinstance(c, str) and c for c in calls)  # the SDK validated the arguments and ran it
    assert len(sent) >= 2 and sent[0]["tool_choice"] == "required"
    outputs = [i for i in sent[1]["input"] if isinstance(i, dict) and i.get("type") == "function_call_output"]
    assert outputs and outputs[0]["output"] == f"It is 18 degrees and sunny in {calls[0]}."
    called = [i for i in sent[1]["input"] if isinstance(i, dict) and i.get("type") == "function_call"]
    assert called[0]["call_id"] == outputs[0]["call_id"] and json.loads(called[0]["arguments"]) == {"city": calls[0]}


@pytest.fixture(autouse=True)
def _no_openai_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "unused")  # the SDK reads it at import in some versions
