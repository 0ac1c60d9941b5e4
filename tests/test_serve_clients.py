"""The clients agents and editors run, against a real `kvgraft serve` on the real Gemma 3 270M:
LangChain's `ChatOpenAI` (bind_tools, with_structured_output) and simonw's `llm` CLI (--schema); and the
HTTP plumbing a browser front-end and an editor plugin lean on (CORS, keep-alives), in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from kvgraft.app.core.jobs import Returned, Yielded
from kvgraft.app.serve.worker import Text


class Person(BaseModel):
    model_config = {"extra": "forbid"}
    name: str = Field(max_length=24)
    admin: bool


@pytest.fixture(scope="module")
def server(agent_server):
    return agent_server


@pytest.fixture(scope="module")
def chat(server):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="any", temperature=0, max_tokens=80)


def test_langchain_bind_tools_gets_a_tool_call(chat):
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    msg = chat.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"]
    assert isinstance(msg.tool_calls[0]["args"].get("city"), str) and msg.tool_calls[0]["id"]


def test_langchain_with_structured_output_gets_typed_results(chat):
    person = chat.with_structured_output(Person, method="json_schema").invoke("Describe the harbor master.")
    assert isinstance(person, Person)
    mode = chat.with_structured_output(None, method="json_mode")
    got = mode.invoke('Reply with {"name": "Ilse", "admin": true}')  # json_mode: any object (a small model rambles)
    assert isinstance(got, dict) and got


def test_llm_schema_prints_json_that_validates(server, tmp_path):
    user = tmp_path / "llm"
    user.mkdir()
    (user / "extra-openai-models.yaml").write_text(
        f"- model_id: kvgraft\n  model_name: any\n  api_base: {server.url}/v1\n  supports_schema: true\n"
    )
    env = {**os.environ, "LLM_USER_PATH": str(user), "OPENAI_API_KEY": "unused"}
    llm = Path(sys.executable).parent / "llm"
    schema = json.dumps(Person.model_json_schema())  # closed: a small model may otherwise add keys without end
    r = subprocess.run(
        [
            str(llm),
            "-m",
            "kvgraft",
            "--schema",
            schema,
            "-o",
            "max_tokens",
            "80",
            "Describe the harbor master.",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), Person.model_json_schema())


# -- HTTP plumbing, in process (a stand-in engine: these are not claims about the answers) ----------
class _Worker:
    """Answers every job after `delay` seconds with one piece of text."""

    def __init__(self, delay: float) -> None:
        self.delay, self.load_error = delay, None
        self.ready = threading.Event()
        self.ready.set()
        model = SimpleNamespace(info=SimpleNamespace(path="/models/stand-in.gguf", sha256="0" * 64), chat_template=None)
        model.tokenize = lambda text, add_bos=True, special=False: [1] * (len(text) // 4 + 1)
        model.token_text = lambda t: ""
        model.bos = model.eos = 1
        self.service = SimpleNamespace(engine=SimpleNamespace(model=model, config=SimpleNamespace(n_ctx=4096)))
        self.depth = 0

    def submit(self, job) -> None:
        def run():
            time.sleep(self.delay)
            job.emit(Yielded("request", SimpleNamespace(prompt_tokens=3, cached_tokens=0, as_dict=dict)))
            job.emit(Yielded("request", Text("hello", [])))
            job.emit(
                Returned(
                    "request",
                    {
                        "text": "hello",
                        "completion_tokens": 1,
                        "stop_reason": "eog",
                        "decode_ms": 1.0,
                        "logprobs": [],
                        "tail_logprobs": [],
                    },
                )
            )

        threading.Thread(target=run, daemon=True).start()


def _app(delay=0.0, **config):
    from kvgraft.app.serve.http import Server, ServerConfig, build_app

    return build_app(Server(_Worker(delay), ServerConfig(**config)))


async def _post(app, body, headers=None):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        return await c.post("/v1/chat/completions", json=body, headers=headers or {})


def test_a_stream_sends_keep_alives_while_the_prompt_is_read():
    import asyncio

    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    r = asyncio.run(_post(_app(delay=1.0, keep_alive_s=0.2), body))
    assert r.status_code == 200
    text = r.text
    assert text.index('"role": "assistant"') < text.index(": keep-alive") < text.index('"content": "hello"')
    assert text.rstrip().endswith("data: [DONE]")


def test_cors_is_off_by_default_and_on_for_the_origins_named():
    import asyncio

    async def preflight(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            headers = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"}
            return await c.options("/v1/chat/completions", headers=headers), await c.get(
                "/v1/models", headers={"Origin": "http://localhost:3000"}
            )

    pre, got = asyncio.run(preflight(_app()))
    assert "access-control-allow-origin" not in pre.headers and "access-control-allow-origin" not in got.headers
    pre, got = asyncio.run(preflight(_app(cors_origins=("http://localhost:3000",))))
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert got.headers["access-control-allow-origin"] == "http://localhost:3000"
    pre, _ = asyncio.run(preflight(_app(cors_origins=("http://elsewhere.example",))))
    assert pre.headers.get("access-control-allow-origin") != "http://localhost:3000"
