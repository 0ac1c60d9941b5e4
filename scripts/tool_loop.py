"""Do tool loops end? The same requests and agent loops against kvgraft serve and llama-server --jinja.

    python scripts/tool_loop.py --llama-server PATH [--model qwen2.5-coder-1.5b] [--runs 2] [--only kvgraft]

Both servers run the same GGUF, context and threads (llama-server with `--jinja`: the model's own chat
template with its tools section, as kvgraft renders it). Printed per server:
1. the prompt of one chat with a call and its result in the history (`POST /apply-template` on each),
   compared token for token (llama-server's text tokenized by its own `/tokenize`);
2. what each answers to it, greedy and at each server's default temperature: text, or the call again;
3. agent loops with a weather tool whose answer names a temperature: the OpenAI Agents SDK (chat
   completions, then Responses), pydantic-ai and a tool loop by the `anthropic` client; for each run the
   tool calls made, whether it ended with an answer that uses the tool's result, and its seconds.
A server that does not serve an API a loop needs (llama-server's Responses or Messages) says so in its row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.bench_serve import LlamaServer  # noqa: E402
from tests.serve_fixture import ServerProcess  # noqa: E402

RESULT = "Bergen: 12 degrees Celsius, light rain"
QUESTION = "What is the weather in Bergen right now? Use the tool, then answer in one sentence."
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city's name"}},
    "required": ["city"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather now", "parameters": WEATHER}}
]
HISTORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": QUESTION},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Bergen"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": RESULT},
]


def used_result(text: str | None) -> bool:
    return bool(text) and "12" in text


def prompts(kv: str, ls: str | None) -> None:
    mine = httpx.post(kv + "/apply-template", json={"messages": HISTORY, "tools": TOOLS}, timeout=120).json()
    print(f"1. kvgraft's prompt ({len(mine['tokens'])} tokens):\n{mine['prompt']}")
    if ls is None:
        return
    theirs = httpx.post(ls + "/apply-template", json={"messages": HISTORY, "tools": TOOLS}, timeout=120).json()
    toks = httpx.post(
        ls + "/tokenize", json={"content": theirs["prompt"], "add_special": True, "parse_special": True}, timeout=120
    ).json()["tokens"]
    same = toks == mine["tokens"]
    print(f"   llama-server's prompt: {len(toks)} tokens, {'the same tokens' if same else 'DIFFERENT tokens'}")
    if not same:
        at = next(
            (i for i, (a, b) in enumerate(zip(toks, mine["tokens"], strict=False)) if a != b),
            min(len(toks), len(mine["tokens"])),
        )
        print(f"   first difference at token {at}; llama-server's text:\n{theirs['prompt']}")


def answers(name: str, base: str) -> None:
    from openai import OpenAI

    c = OpenAI(base_url=base + "/v1", api_key="unused", timeout=600, max_retries=0)
    for label, extra in (("greedy", {"temperature": 0}), ("default temperature", {})):
        t = time.perf_counter()
        r = c.chat.completions.create(model="any", messages=HISTORY, tools=TOOLS, max_tokens=80, **extra)
        ch = r.choices[0]
        calls = [(x.function.name, x.function.arguments) for x in ch.message.tool_calls or []]
        what = f"calls {calls}" if calls else f"text {ch.message.content!r}"
        print(f"2. {name}, {label} ({time.perf_counter() - t:.1f} s): finish={ch.finish_reason} {what}")


async def agents_sdk(base: str, responses: bool) -> tuple[int, str | None]:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.exceptions import MaxTurnsExceeded
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", timeout=600, max_retries=0)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather now in a city."""
        calls.append(city)
        return RESULT

    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(name="weather", instructions="You are a helpful assistant.", tools=[get_weather])
    agent.model = kind(model="any", openai_client=client)
    try:
        result = await Runner.run(agent, QUESTION, max_turns=4)
    except MaxTurnsExceeded:
        return len(calls), None
    finally:
        await client.close()
    return len(calls), str(result.final_output)


def pydantic_ai(base: str) -> tuple[int, str | None]:
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    model = OpenAIChatModel("any", provider=OpenAIProvider(base_url=base + "/v1", api_key="unused"))
    agent = Agent(model, instructions="You are a helpful assistant.")
    calls = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather now in a city."""
        calls.append(city)
        return RESULT

    try:
        r = agent.run_sync(QUESTION, usage_limits=UsageLimits(request_limit=4))
    except UsageLimitExceeded:
        return len(calls), None
    return len(calls), str(r.output)


def anthropic_loop(base: str) -> tuple[int, str | None]:
    import anthropic

    c = anthropic.Anthropic(base_url=base, api_key="unused", timeout=600, max_retries=0)
    tools = [{"name": "get_weather", "description": "The weather now", "input_schema": WEATHER}]
    msgs: list = [{"role": "user", "content": QUESTION}]
    calls = 0
    for _ in range(4):
        r = c.messages.create(
            model="any", max_tokens=120, system="You are a helpful assistant.", messages=msgs, tools=tools
        )
        uses = [b for b in r.content if b.type == "tool_use"]
        if not uses:
            return calls, "".join(b.text for b in r.content if b.type == "text")
        calls += len(uses)
        msgs += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": b.id, "content": RESULT} for b in uses],
            },
        ]
    return calls, None


LOOPS = {
    "Agents SDK (chat)": lambda base: asyncio.run(agents_sdk(base, responses=False)),
    "Agents SDK (Responses)": lambda base: asyncio.run(agents_sdk(base, responses=True)),
    "pydantic-ai": pydantic_ai,
    "anthropic tool loop": anthropic_loop,
}


def loops(name: str, base: str, runs: int) -> None:
    for loop, fn in LOOPS.items():
        for i in range(runs):
            t = time.perf_counter()
            try:
                calls, final = fn(base)
                verdict = (
                    "ended, uses the result"
                    if used_result(final)
                    else ("ended" if final is not None else "DID NOT END")
                )
                said = f"{final[:100]!r}" if final is not None else "-"
            except Exception as exc:  # noqa: BLE001 (a peer without this API: said in its row)
                calls, verdict, said = 0, f"error {type(exc).__name__}", str(exc)[:100]
            print(
                f"3. {name:12s} {loop:24s} run {i + 1}: {calls} calls, {verdict} "
                f"({time.perf_counter() - t:.0f} s): {said}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=shutil.which("llama-server"))
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=("kvgraft", "llama-server"))
    args = ap.parse_args()
    from kvgraft.app.core.runtime import Settings, resolve_model_path

    model = resolve_model_path(Settings(model=args.model))
    servers = []
    if args.only != "llama-server":
        home = Path(tempfile.mkdtemp(prefix="kvgraft-loop-")) / "home"
        servers.append(("kvgraft", lambda: ServerProcess(home, "--model", str(model), "--n-ctx", "8192").start()))
    if args.only != "kvgraft":
        if not args.llama_server:
            ap.error("no llama-server: pass --llama-server PATH (or --only kvgraft)")
        servers.append(
            ("llama-server", lambda: LlamaServer(args.llama_server, model, 8192, args.threads, ("--jinja",)).start())
        )
    started = {}
    try:
        for name, start in servers:
            started[name] = start()
        kv = started.get("kvgraft")
        ls = started.get("llama-server")
        if kv is not None:
            prompts(kv.url, ls.url if ls is not None else None)
        for name, srv in started.items():
            answers(name, srv.url)
        for name, srv in started.items():
            loops(name, srv.url, args.runs)
    finally:
        for srv in started.values():
            srv.stop()
    print(json.dumps({"model": args.model, "runs": args.runs}))


if __name__ == "__main__":
    main()
