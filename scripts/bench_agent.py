"""A tool-using agent loop against kvgraft serve and llama-server, side by side in one run.

    python scripts/bench_agent.py --llama-server PATH [--model qwen2.5-coder-1.5b] [--steps 10] [--stock]

Both servers run the same GGUF, context, batch and threads (llama-server with `--jinja`, so both render
the model's own chat template with its tools section). The agent: a system prompt and 5 tool schemas
(about 1,500 tokens together), a task, then `--steps` steps, each a `/v1/chat/completions` request with
`tool_choice: required` (one call per step) whose call is answered with a tool result; then both servers
are stopped and started again and the next step is asked. Per server: the prompt time per step as the
server reports it (`timings.prompt_ms`: the time to first token less one decode step) and the wall time
per step, their medians, the total wall, the cached tokens, and the calls that parsed and validated
against their tool's schema. The restart row compares the first step after the restart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.bench_invariance import add_stock_option, build_overrides, check_stock_option  # noqa: E402
from scripts.bench_serve import LlamaServer  # noqa: E402
from tests.serve_fixture import ServerProcess  # noqa: E402

CITIES = ["Oslo", "Lima", "Pune", "Cork", "Kobe", "Bonn", "Riga", "Nice", "Bern", "Faro", "Ghent", "Turku"]


def _tool(name: str, what: str, props: dict, required: list[str]) -> dict:
    detail = (
        f"{what} The result is a JSON object. Call it once per city; the agent that calls it must pass the "
        "arguments exactly as described, with no extra keys, and must not guess values it was not given. "
    ) * 3
    params = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": detail, "parameters": params}}


CITY = {"type": "string", "description": "The city's name, as the user wrote it, without the country."}
TOOLS = [
    _tool(
        "get_weather", "The current weather in a city.", {"city": CITY, "unit": {"enum": ["c", "f"]}}, ["city", "unit"]
    ),
    _tool("get_time", "The local time in a city.", {"city": CITY}, ["city"]),
    _tool("get_population", "The population of a city.", {"city": CITY, "year": {"type": "integer"}}, ["city"]),
    _tool("get_airport", "The main airport of a city.", {"city": CITY}, ["city"]),
    _tool("get_currency", "The currency used in a city.", {"city": CITY}, ["city"]),
]
SYSTEM = (
    "You are a travel research agent. You answer by calling the tools, one call per step, and you never "
    "invent a result. When a tool returns, go on with the next city in the user's list. "
) * 6
TASK = "For each of these cities, in order, look up the weather in celsius: " + ", ".join(CITIES) + "."


def step(url: str, messages: list[dict]) -> dict:
    body = {
        "model": "m",
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 60,
        "temperature": 0,
    }
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=900)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    out = r.json()
    msg = out["choices"][0]["message"]
    calls, valid = msg.get("tool_calls") or [], 0
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in calls:
        try:
            jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])
            valid += 1
        except (ValueError, KeyError, jsonschema.ValidationError):
            pass
    usage = out.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = (out.get("timings") or {}).get("cache_n")
    return {
        "prompt_ms": (out.get("timings") or {}).get("prompt_ms"),
        "wall": wall,
        "calls": calls,
        "valid": valid and valid == len(calls),
        "cached": cached or 0,
        "prompt_tokens": usage.get("prompt_tokens") or 0,
        "content": msg.get("content"),
    }


def _after(messages: list[dict], res: dict, i: int) -> list[dict]:
    """The step's call and a tool result (or, where the model wrote no call, its text and a nudge)."""
    if not res["calls"]:
        return messages + [
            {"role": "assistant", "content": res["content"] or ""},
            {"role": "user", "content": "Call the tool for the next city."},
        ]
    call = res["calls"][0]
    result = json.dumps({"city": CITIES[i % len(CITIES)], "temperature": 10 + i, "sky": "clear", "wind_kmh": 12})
    return messages + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result},
    ]


def run(name: str, start, stop, steps: int) -> dict:
    url = start()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    t0 = time.perf_counter()
    rows = []
    for i in range(steps):
        res = step(url, messages)
        rows.append(res)
        messages = _after(messages, res, i)
    total = time.perf_counter() - t0
    stop()
    url = start()
    after = step(url, messages)
    stop()
    ms = [r["prompt_ms"] for r in rows if r["prompt_ms"] is not None]
    return {
        "name": name,
        "prompt_ms": statistics.median(ms) if ms else float("nan"),
        "first_prompt_ms": rows[0]["prompt_ms"],
        "wall": statistics.median(r["wall"] for r in rows),
        "total": total,
        "cached": sum(r["cached"] for r in rows),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "valid": sum(bool(r["valid"]) for r in rows),
        "steps": steps,
        "restart_prompt_ms": after["prompt_ms"],
        "restart_wall": after["wall"],
        "restart_cached": after["cached"],
        "restart_tokens": after["prompt_tokens"],
        "restart_valid": bool(after["valid"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True, help="the llama-server binary (llama-cpp-server --info)")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    add_stock_option(ap)
    args = ap.parse_args()
    check_stock_option(ap, args.stock)
    root = Path(tempfile.mkdtemp(prefix="kvgraft-bench-agent-"))

    def kvgraft(name: str, home: Path, env: dict | None) -> dict:
        kv = {"srv": None}

        def kv_start():
            kv["srv"] = ServerProcess(home, "--model", args.model, "--threads", str(args.threads), env=env)
            kv["srv"].start(timeout=600)
            return kv["srv"].url

        return run(name, kv_start, lambda: kv["srv"].stop(), args.steps)

    results = [kvgraft("kvgraft serve", root / "home", None)]
    if args.stock:  # its own home: the stock build's states are another engine's
        stock_env = build_overrides("default", args.stock)
        results.append(kvgraft("kvgraft serve (stock build)", root / "home-stock", stock_env))
    from kvgraft.app.core.runtime import Settings, resolve_model_path

    path = resolve_model_path(Settings(model=args.model))
    ls = {"srv": None}

    def ls_start():
        ls["srv"] = LlamaServer(args.llama_server, path, 8192, args.threads, extra=["--jinja"]).start()
        return ls["srv"].url

    def ls_stop():
        ls["srv"].stop()

    results.append(run("llama-server", ls_start, ls_stop, args.steps))
    k, s = results[0], results[-1]
    print(
        "| server | prompt time per step (median) | first step | wall per step (median) | total wall | cached tokens "
        "| calls that parsed and validated | after restart: prompt time | wall | cached |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['name']} | {r['prompt_ms']:.0f} ms | {r['first_prompt_ms']:.0f} ms | {r['wall']:.2f} s | "
            f"{r['total']:.1f} s | {r['cached']} of {r['prompt_tokens']} | {r['valid']} of {r['steps']} | "
            f"{r['restart_prompt_ms']:.0f} ms | {r['restart_wall']:.2f} s | "
            f"{r['restart_cached']} of {r['restart_tokens']} |"
        )
    restart = s["restart_prompt_ms"] / k["restart_prompt_ms"]
    print(
        f"ratios (llama-server / kvgraft): prompt time per step {s['prompt_ms'] / k['prompt_ms']:.2f}x, wall per step "
        f"{s['wall'] / k['wall']:.2f}x, after the restart: prompt time {restart:.1f}x, "
        f"wall {s['restart_wall'] / k['restart_wall']:.1f}x"
    )
    if args.stock:
        st = results[1]
        print(
            f"ratios (kvgraft on the stock build / on its exact kernels): prompt time per step "
            f"{st['prompt_ms'] / k['prompt_ms']:.2f}x, wall per step {st['wall'] / k['wall']:.2f}x, total wall "
            f"{st['total'] / k['total']:.2f}x, after the restart: prompt time "
            f"{st['restart_prompt_ms'] / k['restart_prompt_ms']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
