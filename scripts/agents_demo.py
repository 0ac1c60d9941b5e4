"""The Responses API, the Messages API and an agent, from `kvgraft serve`, with the clients people run.

    python scripts/agents_demo.py [--model qwen2.5-coder-1.5b] [--url http://127.0.0.1:8080]

Without --url it starts `kvgraft serve --model MODEL` on a free loopback port (a fresh data dir) and
stops it after. The README quotes its output on the known 1.5B instruct model (`make models`):
1. the official `openai` client's Responses API: a question, then a follow-up by previous_response_id;
2. the official `anthropic` client's Messages API with a tool: the model's tool_use block;
3. the OpenAI Agents SDK: an agent with a Python function tool (its first turn must call it) answers from it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.tools_demo import served  # noqa: E402 (the same server start)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city's name"}},
    "required": ["city"],
}


def responses(base: str) -> None:
    from openai import OpenAI

    c = OpenAI(base_url=base + "/v1", api_key="unused", timeout=600)
    t = time.perf_counter()
    r = c.responses.create(model="any", instructions="Answer in one sentence.", input="What is a harbor master?")
    print(f"1. responses ({time.perf_counter() - t:.1f} s, {r.status}): {r.output_text}")
    t = time.perf_counter()
    r2 = c.responses.create(
        model="any", instructions="Answer in one sentence.", previous_response_id=r.id, input="And a lighthouse keeper?"
    )
    cached = r2.usage.input_tokens_details.cached_tokens
    print(
        f"   previous_response_id ({time.perf_counter() - t:.1f} s, {cached} of {r2.usage.input_tokens} "
        f"input tokens cached): {r2.output_text}"
    )


def messages(base: str) -> None:
    import anthropic

    c = anthropic.Anthropic(base_url=base, api_key="unused", timeout=600)
    tools = [{"name": "get_weather", "description": "The current weather in a city", "input_schema": WEATHER}]
    t = time.perf_counter()
    r = c.messages.create(
        model="any",
        max_tokens=120,
        system="You are a helpful assistant.",
        messages=[{"role": "user", "content": "Is it raining in Bergen right now?"}],
        tools=tools,
    )
    blocks = [f"tool_use {b.name} {json.dumps(b.input)}" if b.type == "tool_use" else repr(b.text) for b in r.content]
    print(f"2. messages ({time.perf_counter() - t:.1f} s, stop_reason {r.stop_reason}): {'; '.join(blocks)}")


def agent(base: str) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return json.dumps({"city": city, "temperature_c": 11, "sky": "light rain"})

    client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", timeout=600)
    a = Agent(
        name="weather",
        instructions="Call get_weather once, then answer the question in one sentence from its result.",
        tools=[get_weather],
        model=OpenAIResponsesModel("any", client),
        # the first turn must call the tool; the SDK then resets the choice to auto for the answer
        model_settings=ModelSettings(max_tokens=120, tool_choice="required", parallel_tool_calls=False),
    )
    t = time.perf_counter()
    result = asyncio.run(Runner.run(a, "Should I take an umbrella in Bergen today?", max_turns=4))
    print(f"3. agent ({time.perf_counter() - t:.1f} s, tool called with {calls}): {result.final_output}")


def main() -> None:
    with served(__doc__) as base:
        responses(base)
        messages(base)
        agent(base)


if __name__ == "__main__":
    main()
