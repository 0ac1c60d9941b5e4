"""Conversations (app/answer/chat.py): threads resume from their stored state, exactly in the only sense the
bits allow (the logits before a reply equal a replay of the thread's own decode schedule in a new
context), across processes, after a fork, after gc, with a chat template or the plain format.

The plain format and the cross-process case run on the real Gemma 3 270M; chat templates run on
synthetic models with a template (scripts/synthetic_gguf.py), through real llama.cpp.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvgraft.app.answer.chat import ChatError, ChatService, thread_listing, thread_view
from kvgraft.app.core.model_store import model_sha256
from kvgraft.app.proof.chat_format import PLAIN, ChatFormat
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
from kvgraft.engine.errors import Cancelled
from kvgraft.library.maintenance import gc
from scripts.synthetic_gguf import write_synthetic_gguf

REPO = Path(__file__).resolve().parent.parent
# past the 512-token window of Gemma 3 from the first turn on
NOTES = "You answer from these harbor survey notes. " + " ".join(
    f"Pier {i} holds {i * 7 % 13} boats and a {['red', 'blue', 'green'][i % 3]} crane." for i in range(60)
)
# rewrites the conversation's first line on every message: never prefix-stable
COUNTING = (
    "{{ messages|length }} messages\n{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-gguf")
    return {
        "chatml": write_synthetic_gguf(root / "chatml.gguf", "gemma3", seed=5, chat_template=True),
        "counting": write_synthetic_gguf(root / "counting.gguf", "llama", seed=6, chat_template=COUNTING),
    }


@pytest.fixture(scope="module")
def chatml_engine(synthetic):
    path = synthetic["chatml"]
    eng = Engine.load(EngineConfig(model_path=path, n_ctx=2048), model_sha256(path))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def counting_engine(synthetic):
    path = synthetic["counting"]
    eng = Engine.load(EngineConfig(model_path=path, n_ctx=2048), model_sha256(path))
    yield eng
    eng.close()


def _chats(engine, home):
    lib = open_library(home)
    service = LibraryService(engine, lib)
    return ChatService(service), service, lib


def _close(service, lib):
    service.close()
    lib.close()


# -- the plain format, the real model, across processes --------------------------------------------
def _cli(home: Path, *args: str) -> dict:
    env = {**os.environ, "KVGRAFT_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "kvgraft", "chat", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_thread_resumes_exactly_in_a_new_process(model_path, tmp_path):
    home = tmp_path / "home"
    thread = _cli(home, "new", "--system", NOTES, "--title", "harbor", "--json")
    assert thread["format"] == PLAIN
    tid = str(thread["thread"])
    first = _cli(home, "say", tid, "How many boats does pier 3 hold?", "--max-tokens", "24", "--json")
    assert first["turn"] == 1 and first["tokens_restored"] == 0 and first["exact"] is None
    assert first["tokens"] > 512  # past the sliding window already
    second = _cli(home, "say", tid, "And pier 4?", "--max-tokens", "24", "--check", "--json")
    assert second["turn"] == 2
    assert second["tokens_restored"] == first["tokens"]  # the whole stored transcript, grafted
    assert 0 < second["tokens_prefilled"] <= 16  # only the new message
    assert second["exact"] is True
    shown = _cli(home, "show", tid, "--json")
    assert [t["tokens"] for t in shown["turns"]] == [first["tokens"], second["tokens"]]
    assert all(len(t["blob_sha256"]) == 64 for t in shown["turns"])


def test_flash_attention_on_resumes_exactly(engine, engine_fa, tmp_path):
    chats, service, lib = _chats(engine_fa, tmp_path)
    try:
        t = chats.new_thread(system=NOTES)
        a = chats.say(t.id, "Which crane is on pier 2?", max_tokens=12)
        b = chats.say(t.id, "And on pier 5?", max_tokens=12, check=True)
        assert b.tokens_restored == a.tokens and b.exact is True
        # the thread remembers the engine it was made under: flash attention off is another engine
        with pytest.raises(ChatError, match="another engine fingerprint"):
            ChatService(LibraryService(engine, lib)).say(t.id, "hello")
    finally:
        _close(service, lib)


def test_the_check_can_fail(engine, tmp_path):
    """The replay of the same tokens in the same schedule gives the same bits; of other tokens, not."""
    chats, service, lib = _chats(engine, tmp_path)
    try:
        t = chats.new_thread(system="Be brief.")
        r = chats.say(t.id, "Say a color.", max_tokens=4)
        target = lib.threads.turns(t.id)[0].tokens[: r.tokens - r.tokens_decoded]
        schedule = {"prefill": "chunks", "n_batch": 512, "n_ubatch": 512}
        assert chats.replay_matches(target, schedule, r.logits_sha256) is True
        changed = [target[0], target[1] + 1, *target[2:]]
        assert chats.replay_matches(changed, schedule, r.logits_sha256) is False
    finally:
        _close(service, lib)


# -- chat templates ---------------------------------------------------------------------------------
def test_template_segments_are_prefix_stable_and_exact(chatml_engine, tmp_path):
    fmt = ChatFormat.for_model(chatml_engine.model)
    assert fmt.name.startswith("template:") and fmt.stops == ()
    chats, service, lib = _chats(chatml_engine, tmp_path)
    try:
        t = chats.new_thread(system="You are terse.")
        a = chats.say(t.id, "hello there", max_tokens=6)
        b = chats.say(t.id, "and again", max_tokens=6, check=True)
        assert not b.fallback and b.tokens_restored == a.tokens and b.exact is True
        # what the new message added is exactly the template's own rendering of it
        seg = fmt.next(chatml_engine.model, "You are terse.", [("hello there", a.reply)], "and again")
        assert b.tokens_prefilled == len(seg)
        text = chatml_engine.model.detokenize(lib.threads.turns(t.id)[-1].tokens)
        assert "and again" in text
        im_start = chatml_engine.model.tokenize("<|im_start|>", add_bos=False, special=True)
        assert len(im_start) == 1  # the control token, not its characters
    finally:
        _close(service, lib)


def test_a_template_that_rewrites_history_falls_back_to_the_longest_stored_prefix(counting_engine, tmp_path):
    chats, service, lib = _chats(counting_engine, tmp_path)
    try:
        doc = service.deposit("the river carries seven stones to the quiet harbor " * 8, kind="document").entry
        t = chats.new_thread(from_entry=doc.id)
        a = chats.say(t.id, "which word", max_tokens=5)
        assert a.tokens_restored == doc.n_tokens and not a.fallback
        b = chats.say(t.id, "why", max_tokens=5, check=True)
        # "1 messages" became "3 messages": no turn's state is a prefix any more; the document's is
        assert b.fallback and b.tokens_restored == doc.n_tokens and b.exact is True
    finally:
        _close(service, lib)


# -- forks, gc, limits, stops ---------------------------------------------------------------------
def test_fork_gc_and_limits(chatml_engine, tmp_path):
    chats, service, lib = _chats(chatml_engine, tmp_path)
    try:
        t = chats.new_thread(title="main")
        turns = [chats.say(t.id, f"message {i}", max_tokens=4) for i in range(3)]
        fork = chats.fork(t.id, 1)
        f = chats.say(fork.id, "another way", max_tokens=4, check=True)
        assert f.tokens_restored == turns[0].tokens and f.exact is True
        with pytest.raises(Exception, match="has no turn 9"):
            chats.fork(t.id, 9)

        removed = gc(lib, grace_s=0)
        # turn 2's state went; turn 1 (a fork point) and each thread's newest stayed
        assert removed["removed_sessions"] == 1
        view = thread_view(lib, t.id)
        assert [x["blob_sha256"] is not None for x in view["turns"]] == [True, False, True]
        again = chats.say(t.id, "after gc", max_tokens=4, check=True)
        assert again.tokens_restored == turns[2].tokens and again.exact is True
        rows = {r["thread"]: r for r in thread_listing(lib)}
        assert rows[t.id]["turns"] == 4 and rows[fork.id]["forked_from"] == t.id
        assert rows[t.id]["session_bytes"] > 0
        assert set(lib.stats()["session_bytes_by_thread"]) == {str(t.id), str(fork.id)}

        small = ChatService(
            LibraryService(
                chatml_engine.with_config(chatml_engine.config.replace(n_ctx=64, n_batch=64, n_ubatch=64)), lib
            )
        )
        with pytest.raises(ChatError, match="start a new thread, or fork an earlier turn"):
            small.say(t.id, "one more", max_tokens=4)
        assert len(lib.threads.turns(t.id)) == 4  # nothing half-written
    finally:
        _close(service, lib)


def test_a_stopped_reply_leaves_a_consistent_thread(chatml_engine, tmp_path):
    chats, service, lib = _chats(chatml_engine, tmp_path)
    try:
        t = chats.new_thread()
        seen = []

        def stop_after_three(piece):
            seen.append(piece)
            if len(seen) == 3:
                raise Cancelled("enough")

        r = chats.say(t.id, "tell me a long story", max_tokens=40, on_text=stop_after_three)
        assert r.stop_reason == "callback" and r.tokens_decoded == 2  # the third token was seen, not decoded
        nxt = chats.say(t.id, "go on", max_tokens=4, check=True)
        assert nxt.tokens_restored == r.tokens and nxt.exact is True
    finally:
        _close(service, lib)


def test_sessions_are_not_knowledge_and_verify_by_replay(chatml_engine, tmp_path):
    from kvgraft.app.verify.batch import verify_targets

    chats, service, lib = _chats(chatml_engine, tmp_path)
    try:
        t = chats.new_thread()
        chats.say(t.id, "remember the silver bridge", max_tokens=4)
        assert lib.search("silver bridge") == []
        assert lib.stats()["by_kind"] == {"session": 1}
        outcome = verify_targets(service, entries=lib.entries(), replay=True)
        assert outcome.ok, outcome.as_dict()
    finally:
        _close(service, lib)


def test_the_interactive_loop(synthetic, kvgraft_home, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from kvgraft.entry import cli

    monkeypatch.setenv("KVGRAFT_MODEL_DIR", str(tmp_path / "models"))
    args = ["chat", "--model", str(synthetic["chatml"]), "--n-ctx", "1024", "--max-tokens", "3"]
    result = CliRunner().invoke(cli, args, input="hello\n/fork 1\nagain\n/fork x\n/new\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "usage: /fork N" in result.output
    with open_library(kvgraft_home) as lib:
        rows = thread_listing(lib)
    assert [(r["turns"], r["forked_from"]) for r in rows] == [(1, None), (2, 1), (0, None)]


def test_ask_puts_a_fresh_question_through_an_instruct_models_template(chatml_engine, engine, tmp_path):
    from kvgraft.app.answer.ask import ask

    q = "which word came up most often"
    for eng, expect in ((chatml_engine, "template:"), (engine, "qa-v1")):
        chats, service, lib = _chats(eng, tmp_path / expect.strip(":"))
        try:
            r = ask(service, q, budget=4, use_library=False)
        finally:
            _close(service, lib)
        assert r.source == "fresh" and r.prompt_format.startswith(expect)
    fmt = ChatFormat.for_model(chatml_engine.model)
    prompt = fmt.first(chatml_engine.model, None, q, after_state=False)
    text = fmt.render(chatml_engine.model, [{"role": "user", "content": q}], True)
    assert text == f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
    assert len(prompt) < len(chatml_engine.model.tokenize(text))  # the markers are single control tokens


@pytest.mark.parametrize("turns", [100, pytest.param(200, marks=pytest.mark.slow)])
def test_a_long_thread(synthetic, tmp_path, turns):
    """Store size and resume time at the last turn (plain format on the synthetic llama, one reply token a
    turn; gc every 20 turns keeps one state per thread): 100 turns in `make test`, 200 in `make test-slow`."""
    path = tmp_path / "plain.gguf"
    write_synthetic_gguf(path, "llama", seed=7)
    eng = Engine.load(EngineConfig(model_path=path, n_ctx=8192), model_sha256(path))
    chats, service, lib = _chats(eng, tmp_path / "home")
    try:
        t = chats.new_thread(system="notes")
        for i in range(turns - 1):
            chats.say(t.id, f"m{i % 10}", max_tokens=1)
            if i % 20 == 19:
                gc(lib, grace_s=0)
        last = chats.say(t.id, "last", max_tokens=1, check=True)
        gc(lib, grace_s=0)
        segment = eng.model.tokenize("\nUser: last\nAssistant:", add_bos=False)
        assert last.turn == turns and last.exact is True and last.tokens_prefilled == len(segment)
        assert last.tokens_restored == last.tokens - len(segment) - last.tokens_decoded
        assert lib.stats()["by_kind"] == {"session": 1}  # only the newest state is kept
        one_state = thread_listing(lib)[0]["session_bytes"]
        print(f"turn {turns}: {last.tokens:,} tokens, {one_state:,} B stored, resumed in {last.resume_ms:.1f} ms")
        assert one_state < 2 * last.tokens * eng.layout.bytes_per_token()
    finally:
        _close(service, lib)
        eng.close()


# -- the window's turn actions: check a stored turn, regenerate, rename ----------------------------
def test_check_a_stored_turn_replays_its_logits_and_its_state(engine, tmp_path):
    chats, service, lib = _chats(engine, tmp_path)
    try:
        t = chats.new_thread(system=NOTES)
        a = chats.say(t.id, "Which crane is on pier 2?", max_tokens=8)
        b = chats.say(t.id, "And on pier 5?", max_tokens=8)
        turns = lib.threads.turns(t.id)
        assert [x.decoded for x in turns] == [a.tokens_decoded, b.tokens_decoded]
        assert turns[1].restored == a.tokens and turns[1].prefilled == b.tokens_prefilled and turns[1].checked is None
        for n in (1, 2):
            out = chats.check_turn(t.id, n)
            assert out["logits_equal"] is True and out["state_equal"] is True and out["exact"] is True
        assert [x.checked for x in lib.threads.turns(t.id)] == [1, 1]
        # the check can fail: a turn whose recorded logits are not what its tokens give
        lib._db.execute("UPDATE turns SET logits_sha256 = ? WHERE thread_id = ? AND n = 2", ["0" * 64, t.id])
        lib._db.conn.commit()
        bad = chats.check_turn(t.id, 2)
        assert bad["exact"] is False and bad["logits_equal"] is False and bad["state_equal"] is True
        assert lib.threads.turns(t.id)[1].checked == 0
        with pytest.raises(ChatError, match="no turn 3"):
            chats.check_turn(t.id, 3)
    finally:
        _close(service, lib)


def test_regenerate_takes_back_the_last_turn_and_answers_again(chatml_engine, tmp_path):
    from kvgraft.engine.sampling import SamplingParams

    chats, service, lib = _chats(chatml_engine, tmp_path)
    try:
        t = chats.new_thread(system="Be brief.")
        first = chats.say(t.id, "hello", max_tokens=6)
        chats.say(t.id, "name a fruit", max_tokens=6)
        again = chats.regenerate(t.id, max_tokens=6, sampling=SamplingParams(temperature=1.0, seed=7))
        turns = lib.threads.turns(t.id)
        assert [x.user for x in turns] == ["hello", "name a fruit"] and again.turn == 2
        assert again.tokens_restored == first.tokens  # resumed from the state before the taken-back turn
        assert chats.check_turn(t.id, 2)["exact"] is True  # sampled tokens, the same schedule: replayable
        renamed = lib.threads.rename_thread(t.id, "  fruit  ")
        assert renamed.title == "fruit"
    finally:
        _close(service, lib)


def test_a_reply_decoded_with_prompt_lookup_is_checked_and_resumed_exactly(drafting_engine, tmp_path):
    """A reply that copies the notes is decoded in verify calls (several tokens per call); the turn records
    them where the batching decides the bits, "Check this turn" recomputes the turn (logits and state), and the
    next turn resumes on it exactly."""
    engine = drafting_engine
    chats, service, lib = _chats(engine, tmp_path)
    try:
        t = chats.new_thread(system=NOTES)
        a = chats.say(t.id, "Repeat the notes word for word.", max_tokens=32)
        turn = lib.threads.turns(t.id)[0]
        assert a.decode_calls < a.tokens_decoded, a.reply  # several tokens per verify call
        if engine.batch_invariant:  # no call sizes decide the bits: none recorded, the check is one prefill
            assert "then" not in turn.schedule
        else:
            assert [c for c in turn.schedule["then"] if isinstance(c, dict)], turn.schedule["then"]
        out = chats.check_turn(t.id, 1)
        assert out["logits_equal"] is True and out["state_equal"] is True
        b = chats.say(t.id, "Which crane is on pier 5?", max_tokens=8, check=True)
        assert b.exact is True and b.tokens_restored == a.tokens
        assert chats.check_turn(t.id, 2)["exact"] is True
    finally:
        _close(service, lib)
