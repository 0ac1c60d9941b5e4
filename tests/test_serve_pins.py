"""Named cache pins through a real `kvgraft serve` on the real Gemma 3 270M: Anthropic's `cache_control`
and OpenAI's `prompt_cache_key` pin a prefix by name; with a cache budget of one byte every other state
is evicted, the pinned one stays, survives a restart and is grafted; `kvgraft cache unpin` ends it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import anthropic
import openai

from kvgraft.library.library import Library
from tests.serve_fixture import ServerProcess

SYSTEM = (
    "You answer questions about the harbor of Paquka. The harbor opens at dawn. Fishing boats leave in a "
    "fixed order: the red ones first, then the blue ones, and the small white skiffs last. "
) * 4


def _wait(home, check, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with Library(home) as lib:
            got = check(lib)
        if got:
            return got
        time.sleep(0.3)
    with Library(home) as lib:
        held = [(e.id, e.n_tokens) for e in lib.entries()]
        raise AssertionError(f"timed out: pins {lib.cache.cache_pins()}, entries {held}")


def _cli(home, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVGRAFT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "kvgraft", *args], capture_output=True, text=True, env=env, timeout=60)


def test_a_pinned_prefix_outlives_the_budget_and_a_restart_then_unpin_ends_it(tmp_path):
    home = tmp_path / "home"
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    srv = ServerProcess(home, "--cache-budget", "1").start()  # one byte: every unpinned state is evicted
    try:
        c = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)
        q = [{"role": "user", "content": "Which boats leave first?"}]
        first = c.messages.create(model="any", max_tokens=4, system=system, messages=q)
        assert first.usage.cache_creation_input_tokens > 0
        pin = _wait(home, lambda lib: next((p for p in lib.cache.cache_pins() if p.state == "pinned"), None))
        assert pin.name.startswith("cache_control:") and pin.n_tokens == first.usage.cache_creation_input_tokens
        other = [{"role": "user", "content": "Something else entirely, with no system prompt."}]
        c.messages.create(model="any", max_tokens=4, messages=other)
        time.sleep(1.5)  # its states are stored in idle time, then evicted past the budget
        with Library(home) as lib:
            assert [e.id for e in lib.entries() if e.kind == "cache"] == [pin.entry_id]
    finally:
        srv.stop()
    srv = ServerProcess(home, "--cache-budget", "1").start()
    try:
        c = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)
        again = c.messages.create(
            model="any", max_tokens=4, system=system, messages=[{"role": "user", "content": "Who leaves last?"}]
        )
        assert again.usage.cache_read_input_tokens >= pin.n_tokens  # grafted from the pinned state
        assert again.usage.cache_creation_input_tokens == 0
        listed = json.loads(_cli(home, "cache", "list", "--json").stdout)
        assert [(p["name"], p["state"]) for p in listed] == [(pin.name, "pinned")]
        assert _cli(home, "cache", "unpin", pin.name).returncode == 0
        c.messages.create(model="any", max_tokens=2, messages=[{"role": "user", "content": "One more, unpinned."}])
        _wait(home, lambda lib: pin.entry_id not in [e.id for e in lib.entries()])  # evicted like any other now
        assert _cli(home, "cache", "unpin", pin.name).returncode != 0
    finally:
        srv.stop()


def test_prompt_cache_key_pins_the_conversation_before_the_last_turn(tmp_path):
    home = tmp_path / "home"
    srv = ServerProcess(home).start()
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        msgs = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Which boats leave first?"},
            {"role": "assistant", "content": "The red ones."},
            {"role": "user", "content": "And then?"},
        ]
        r = c.chat.completions.create(model="any", messages=msgs, max_tokens=2, prompt_cache_key="harbor-agent")
        pins = r.model_extra["kvgraft"]["pins"]
        assert [p["name"] for p in pins] == ["harbor-agent"] and pins[0]["n_tokens"] < r.usage.prompt_tokens
        got = _wait(
            home,
            lambda lib: lib.cache.cache_pin("harbor-agent") if lib.cache.cache_pin("harbor-agent").entry_id else None,
        )
        with Library(home) as lib:
            assert lib.get(got.entry_id).n_tokens == pins[0]["n_tokens"]
    finally:
        srv.stop()
