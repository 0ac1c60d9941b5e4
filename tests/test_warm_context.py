"""Instant recurring answers on the real model: a warm (cleared and reused) context, answer-ready states.

A cleared context must compute and graft bit for bit like a new one, past the sliding window, with
flash attention off and on; an answer-ready state (a solution's text and its question suffix but
the last token) must be answered with one decoded token and shown exact by comparison; entries
without one keep the old path.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import kvgraft.app.cli.common as common
from kvgraft.app.answer.ask import ask
from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.app.lab.starter_problems import starter_problems
from kvgraft.app.service import LibraryService
from kvgraft.engine.compare import logits_sha256
from kvgraft.entry import cli
from kvgraft.library.library import Library

SOLUTION = next(p for p in starter_problems(24) if 2_000 < len(p.solution) < 3_000)  # a few hundred tokens


@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
def test_a_cleared_context_computes_and_grafts_like_a_new_one(engine, engine_fa, probe, fa):
    eng = engine_fa if fa else engine
    prefix = prefix_tokens(eng.model, 700, seed=77)  # past the 512-token window
    with eng.session() as new:
        new.prefill(prefix)
        snap = new.snapshot()
        new.prefill(probe)
        want = logits_sha256(new.logits())
    with eng.session() as warm:
        warm.prefill(prefix_tokens(eng.model, 900, seed=78))  # it held something else before, longer
        warm.reset(clear_data=False)  # as the service's warm context is cleared: the old bytes stay
        warm.prefill(prefix)
        assert warm.snapshot().sha256 == snap.sha256
        warm.prefill(probe)
        assert logits_sha256(warm.logits()) == want
        for clear in (False, True):  # and grafts exactly, again and again
            warm.reset(clear_data=clear)
            warm.graft(snap)
            warm.prefill(probe)
            assert logits_sha256(warm.logits()) == want


def test_the_service_reuses_one_context(engine, tmp_path):
    with Library(tmp_path / "lib") as lib:
        service = LibraryService(engine, lib)
        with service.session() as a:
            a.prefill([engine.model.bos])
        with service.session() as b:
            assert b is a and b.n_past == 0  # the same context, emptied
            with service.session() as c:  # a nested use gets its own
                assert c is not b
        service.close()


def test_answer_ready_state_answers_in_one_token_exactly(engine, tmp_path):
    p = SOLUTION
    with Library(tmp_path / "lib") as lib:
        service = LibraryService(engine, lib)
        entry = service.deposit_solution(
            p.question, p.solution, p.answer, vouched_by="generator:starter-problems"
        ).entry
        [ready] = [e for e in lib.entries() if e.kind == "answer"]
        assert ready.proof == "local" and ready.schedule["then"] and ready.n_tokens > entry.n_tokens
        assert lib.find_question(p.question).id == entry.id  # the solution is what a question finds
        r = ask(service, p.question)
        assert r.source == "graft" and r.answer_ready and r.entry_id == entry.id
        assert r.tokens_prefilled == 1 and r.tokens_restored == ready.n_tokens
        assert r.receipt_match is True and r.exact is True and r.answer == p.answer and r.answer_checked
        assert r.ttft_ms is not None and 0 < r.ttft_ms <= r.wall_ms
        # asked in other words: the stored question's answer-ready state does not apply, the old path does
        variant = ask(service, "  " + p.question.upper())
        assert variant.source == "graft" and not variant.answer_ready and variant.answer == p.answer
        # a damaged answer-ready blob: marked damaged, and the text-only state answers instead
        path = lib.blobs.path(ready.blob_sha256)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        fallback = ask(service, p.question)
        assert not fallback.answer_ready and fallback.exact is True and fallback.answer == p.answer
        assert lib.get(ready.id).damaged
        # without the answer-ready state the solution is still answered, exactly, on the old path
        lib._db.execute("DELETE FROM prefix_keys WHERE entry_id = ?", [ready.id])
        lib._db.execute("DELETE FROM entries WHERE id = ?", [ready.id])
        lib._db.conn.commit()
        old = ask(service, p.question)
        assert not old.answer_ready and old.exact is True and old.answer == p.answer
        assert old.tokens_prefilled == len(engine.model.tokenize(f"\nQ: {p.question}\nA:", add_bos=False))
        service.close()


def test_answer_ready_states_verify_and_stay_out_of_packs(engine, monkeypatch, tmp_path):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    run = CliRunner().invoke
    q = "How many masts does the red schooner carry?"
    dep = run(
        cli,
        [
            "deposit",
            "--text",
            f"Q: {q}\nA: 3\n\nOne, two, three masts.\n\nQ: {q}\nA: 3\n",
            "--question",
            q,
            "--answer",
            "3",
            "--json",
        ],
    )
    assert dep.exit_code == 0, dep.output
    kinds = [e["kind"] for e in json.loads(run(cli, ["list", "--json"]).stdout)]
    assert kinds == ["solution", "answer"]
    r = run(cli, ["verify", "--library", "--replay", "--json"])  # the answer-ready state replays in its own schedule
    assert r.exit_code == 0, r.output
    out = tmp_path / "p.kvpack"
    r = run(cli, ["export", "--all", "-o", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["entries"] == 1
    a = json.loads(run(cli, ["ask", q, "--json"]).stdout)
    assert a["answer_ready"] is True and a["exact"] is True and a["ttft_ms"] > 0
    sid = json.loads(dep.stdout)["id"]
    r = run(cli, ["rm", str(sid), str(sid + 1)])  # the answer-ready state goes with its solution, named or not
    assert r.exit_code == 0 and r.stdout.count("removed entry") == 1, r.output
    assert json.loads(run(cli, ["list", "--json"]).stdout) == []
