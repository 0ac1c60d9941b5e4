"""A tool call and a structured answer from `kvgraft serve`, with the official `openai` client.

    python scripts/tools_demo.py [--model qwen2.5-coder-1.5b] [--url http://127.0.0.1:8080]

Without --url it starts `kvgraft serve --model MODEL` on a free loopback port (a fresh data dir in the
temp dir), runs the three requests below and stops it. The README quotes its output on the known
1.5B instruct model (`make models` fetches it):
1. a question with a `get_weather` tool (tool_choice "auto"): the model's call, as `tool_calls`;
2. the tool's result sent back (tool_choice "none"): the model's answer from it;
3. a `response_format` json_schema request: the JSON, checked against the schema here.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import httpx
from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    }
]
HARBOR = {
    "type": "object",
    "properties": {
        "harbor": {"type": "string"},
        "opens": {"type": "string"},
        "boat_order": {"type": "array", "items": {"type": "string", "enum": ["red", "blue", "white"]}},
    },
    "required": ["harbor", "opens", "boat_order"],
    "additionalProperties": False,
}
NOTE = (
    "The harbor of Paquka opens at dawn. Fishing boats leave in a fixed order: the red ones first, "
    "then the blue ones, and the small white skiffs last."
)


def start(model: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tempfile.mkdtemp(prefix="kvgraft-tools-demo-")
    cmd = [sys.executable, "-m", "kvgraft", "serve", "--port", str(port), "--model", model]
    proc = subprocess.Popen(cmd, env={**os.environ, "KVGRAFT_HOME": home}, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"kvgraft serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url + "/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    sys.exit("kvgraft serve did not become healthy")


def show(title: str, seconds: float, reason: str, what: str) -> None:
    print(f"{title} ({seconds:.1f} s, finish_reason {reason}): {what}")


def run(client: OpenAI) -> None:
    model = client.models.list().data[0].id
    ask = [{"role": "user", "content": "What's the weather like in Lisbon right now, in celsius?"}]
    t = time.perf_counter()
    r = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=120)
    msg = r.choices[0].message
    calls = " ".join(f"{c.function.name} {c.function.arguments}" for c in msg.tool_calls or [])
    show("1. tool call", time.perf_counter() - t, r.choices[0].finish_reason, calls or repr(msg.content))
    if msg.tool_calls:
        call = msg.tool_calls[0]
        ask += [
            {
                "role": "assistant",
                "content": msg.content,
                "tool_calls": [call.model_dump(include={"id", "type", "function"})],
            },
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 19, "sky": "clear"})},
        ]
        t = time.perf_counter()
        # tool_choice "none": answer from the result (with "auto" this 1.5B coder model calls the tool again)
        r = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice="none", max_tokens=80)
        show(
            "2. answer from the result",
            time.perf_counter() - t,
            r.choices[0].finish_reason,
            r.choices[0].message.content,
        )
    fmt = {"type": "json_schema", "json_schema": {"name": "harbor", "schema": HARBOR, "strict": True}}
    t = time.perf_counter()
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": NOTE}, {"role": "user", "content": "Summarize the harbor's rules."}],
        response_format=fmt,
        max_tokens=120,
    )
    content = r.choices[0].message.content
    show("3. structured answer", time.perf_counter() - t, r.choices[0].finish_reason, content)
    try:
        import jsonschema

        jsonschema.validate(json.loads(content), HARBOR)
        print("   valid against the schema: True")
    except Exception as exc:  # noqa: BLE001 (the demo says what failed)
        print(f"   valid against the schema: False ({exc})")


@contextmanager
def served(doc: str):
    """The demo's server: --url's, or `kvgraft serve --model MODEL` started for the demo and stopped after.
    Yields the base URL (no /v1)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a GGUF file or a known model")
    ap.add_argument("--url", help="a running server's base URL, e.g. http://127.0.0.1:8080 (then --model is unused)")
    args = ap.parse_args()
    if args.url:
        yield args.url.rstrip("/").removesuffix("/v1")
        return
    proc, v1 = start(args.model)
    try:
        yield v1.removesuffix("/v1")
    finally:
        proc.terminate()
        proc.wait(120)


def main() -> None:
    with served(__doc__) as base:
        run(OpenAI(base_url=base + "/v1", api_key="unused", timeout=600))


if __name__ == "__main__":
    main()
