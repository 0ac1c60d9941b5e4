"""Agent loops that end, on the 1.5B instruct model (`make models`) through a real `kvgraft serve`: the
OpenAI Agents SDK (chat completions and Responses), pydantic-ai and a tool loop of the `anthropic` client
each call the weather tool and end with a text answer (scripts/tool_loop.py runs the same loops against
llama-server too, and counts the answers that use the tool's result). Slow: a minute or more per loop on 2 cores."""

from __future__ import annotations

import pytest

from kvgraft.app.core.model_registry import KNOWN, fetched_path
from scripts import tool_loop
from tests.serve_fixture import ServerProcess

pytestmark = pytest.mark.slow
MODEL = KNOWN["qwen2.5-coder-1.5b"]


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    path = fetched_path(MODEL)
    if path is None:
        pytest.skip(f"{MODEL.name} is not fetched: `make models` (1.1 GB) runs these loops")
    srv = ServerProcess(tmp_path_factory.mktemp("loops") / "home", "--model", str(path)).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("loop", list(tool_loop.LOOPS))
def test_a_tool_loop_calls_its_tool_and_ends_with_an_answer(coder, loop):
    """Whether the answer uses the result is the model's (scripts/tool_loop.py counts it, beside
    llama-server): what kvgraft owes is the call parsed, the loop ended, and text to end it with."""
    calls, final = tool_loop.LOOPS[loop](coder.url)
    assert calls >= 1, "the agent never called its tool"
    assert final is not None, f"{loop} did not end within its turns ({calls} calls)"
    assert final.strip() and "<tool_call>" not in final and not final.lstrip().startswith("{"), final
