"""Worked solutions on an instruct model go through its chat template (app/proof/solution_format.py).

A synthetic model with a ChatML template (scripts/synthetic_gguf.py) stands in for the 1.5B instruct
model, through real llama.cpp: its answers are nonsense, but the tokens, the grafts, the receipts and
the checks are the ones the 1.5B gets. The embedded 270M (no template) keeps the Q/A format.
"""

from __future__ import annotations

import pytest

from kvgraft.app.answer.ask import ask
from kvgraft.app.answer.attempts import attempt, checked_answer
from kvgraft.app.answer.solve import related_entry, solve
from kvgraft.app.core.model_store import model_sha256
from kvgraft.app.lab.transfer_problems import FAMILIES, family_sets
from kvgraft.app.packs.export import export_pack
from kvgraft.app.packs.imports import import_pack
from kvgraft.app.proof.problems import Problem
from kvgraft.app.proof.prompts import QA_FORMAT, solution_text
from kvgraft.app.proof.replay import expected_tokens
from kvgraft.app.proof.solution_format import (
    TURNS_FORMAT,
    checked_part,
    entry_tokens,
    final_answer,
    is_turns_text,
    question_suffix,
    stored_text,
    user_text,
)
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
from kvgraft.library.tokens import tokens_sha256
from scripts.synthetic_gguf import write_synthetic_gguf

Q = "A depot holds 700 boxes. Every day it receives 20 boxes and ships out 35. How many at the end of day 4?"
SOLUTION = "Each day: 20 - 35 = -15.\n4 days: 4 × -15 = -60.\n700 - 60 = 640."
Q2 = "A yard holds 900 boxes. Every day it receives 40 boxes and ships out 25. How many at the end of day 6?"


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    path = write_synthetic_gguf(tmp_path_factory.mktemp("turns") / "chatml.gguf", "gemma3", seed=5, chat_template=True)
    eng = Engine.load(EngineConfig(model_path=path, n_ctx=2048), model_sha256(path))
    yield eng
    eng.close()


@pytest.fixture
def service(chatml, tmp_path):
    lib = open_library(tmp_path / "home")
    svc = LibraryService(chatml, lib)
    yield svc
    svc.close()
    lib.close()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("steps\nAnswer: 1,020", "1,020"),
        ("x\n**Answer:** 42.", "42"),
        ("Answer: 3\nthen more\nanswer: 7", "7"),
        ("the answer is 12", None),
    ],
)
def test_final_answer_reads_the_last_answer_line(text, expected):
    assert final_answer(text) == expected


def test_an_answer_line_is_what_passes(chatml):
    text = stored_text(chatml.model, Q, SOLUTION, "640")
    assert checked_part(chatml.model, text, "Each day -15.\n700 - 60 = 640.\nAnswer: 640") == "640"
    assert checked_part(chatml.model, text, "so it holds 640 boxes") is None  # no 'Answer:' line: nothing passes
    assert checked_answer("steps 12\nAnswer: 640", "640", turns=True) == ("640", True)
    assert checked_answer("steps 640\nAnswer: 12", "640", turns=True) == ("12", False)
    assert checked_answer("it is \\boxed{640}", "640", turns=True) == (None, False)
    assert checked_answer("so 12 + 628 = 640", "640", turns=False)[1] is True  # Q/A: the last number


@pytest.mark.parametrize(
    "text",
    [
        solution_text(Q, SOLUTION, "640"),  # the Q/A format, from an older library or pack
        "Notes on the depot: it ends at 640 boxes.",  # a solution deposited in free form
        "<|im_start|>user\nhi<|im_end|>\n",  # control-token strings, but not a stored exchange
    ],
)
def test_other_solution_texts_on_a_template_model_stay_plain(service, text):
    m = service.engine.model
    assert not is_turns_text(m, "solution", text)
    assert entry_tokens(m, "solution", text) == m.tokenize(text)  # control-token strings stay plain text
    e = service.deposit(text, question=Q, answer="640", kind="solution", vouched_by="you").entry
    assert e.receipt["probe"] == f"\nQ: {Q}\nA:"
    r = ask(service, Q)
    assert r.source == "graft" and r.exact is True and r.prompt_format == QA_FORMAT


def test_the_base_model_keeps_the_qa_format(engine):
    assert stored_text(engine.model, Q, SOLUTION, "640") == solution_text(Q, SOLUTION, "640")
    assert question_suffix(engine.model, solution_text(Q, SOLUTION, "640"), Q)[0] == f"\nQ: {Q}\nA:"


def test_the_stored_text_is_the_templates_exchange(chatml):
    m = chatml.model
    text = stored_text(m, Q, SOLUTION, "640")
    assert text.startswith("<|im_start|>user\n" + user_text(Q)) and text.endswith("Answer: 640<|im_end|>\n")
    tokens = entry_tokens(m, "solution", text)
    assert m.token_text(tokens[0]) == "<|im_start|>" or m.token_text(tokens[1]) == "<|im_start|>"  # parsed as control
    assert len(tokens) < len(m.tokenize(text))  # the control tokens are one token each, not their letters
    suffix, stokens = question_suffix(m, text, Q2)
    assert suffix == f"<|im_start|>user\n{user_text(Q2)}<|im_end|>\n<|im_start|>assistant\n"
    assert expected_tokens(m, "answer", text, Q2) == tokens + stokens[:-1]


def test_deposit_and_ask_on_the_template_are_exact(service):
    dep = service.deposit_solution(Q, SOLUTION, "640", vouched_by="checker:numeric")
    e = dep.entry
    assert e.receipt["graft_logits_sha256"] == e.receipt["fresh_logits_sha256"]
    assert e.receipt["probe"].startswith("<|im_start|>user\n")
    assert e.tokens_sha256 == tokens_sha256(entry_tokens(service.engine.model, "solution", e.text))
    r = ask(service, Q)
    assert r.source == "graft" and r.entry_id == e.id and r.answer_ready is True
    assert r.exact is True and r.prompt_format == TURNS_FORMAT
    assert r.answer_checked is False  # the synthetic model writes no 'Answer: 640' line: checked, and it fails


def test_graft_and_prefill_give_the_same_logits(service, engine, tmp_path):
    e = service.deposit_solution(Q, SOLUTION, "640", vouched_by="checker:numeric").entry
    b = attempt(service, Q2, "990", "graft", e, budget=12)
    c = attempt(service, Q2, "990", "prefill", e, budget=12)
    a = attempt(service, Q2, "990", "fresh", budget=12)
    assert b.logits_sha256 == c.logits_sha256 and b.text == c.text
    assert b.restored_tokens == e.n_tokens and c.prefilled_tokens == e.n_tokens + b.prefilled_tokens
    assert a.logits_sha256 != b.logits_sha256 and a.prompt_tokens < b.prompt_tokens
    with pytest.raises(ValueError, match="needs its entry"):
        attempt(service, Q2, "990", "graft", None)
    # the base model's Q/A path: the same equality
    lib = open_library(tmp_path / "base")
    with LibraryService(engine, lib) as base:
        e = base.deposit_solution(Q, SOLUTION, "640", vouched_by="checker:numeric").entry
        b, c = (attempt(base, Q2, "990", how, e, budget=6) for how in ("graft", "prefill"))
        assert b.logits_sha256 == c.logits_sha256 and b.text == c.text
    lib.close()


def test_a_template_solution_travels_in_a_pack(service, chatml, tmp_path):
    e = service.deposit_solution(Q, SOLUTION, "640", vouched_by="checker:numeric").entry
    pack = tmp_path / "turns.kvpack"
    export_pack(service, [e], pack)
    lib = open_library(tmp_path / "other")
    with LibraryService(chatml, lib) as other:
        out = import_pack(other, pack)  # the texts re-tokenized with their control tokens, the states replayed
        assert out.imported >= 1 and out.replayed >= 1
        assert ask(other, Q).exact is True
    lib.close()


def test_solve_related_grafts_a_sibling_and_names_it(service):
    stored, held = family_sets(100, 2)
    for p in stored:
        service.deposit_solution(p.question, p.solution, p.answer, vouched_by="checker:numeric")
    same = held[0]
    assert related_entry(service, same.question, 16).question == stored[0].question  # its family's solution
    assert related_entry(service, stored[0].question, 16).question != stored[0].question  # never its own numbers
    probs = [Problem("own", stored[0].question, "", stored[0].answer), Problem("new", same.question, "", same.answer)]
    out = solve(service, probs, budget=8, related=True, deposit=False)
    rows = {r.id: r for r in out.rows}
    assert rows["own"].source == "graft" and rows["own"].exact is True
    assert rows["new"].source == "fresh" and rows["new"].related.question == stored[0].question


def test_the_transfer_run_finds_every_family_and_compares_every_pair(service):
    from kvgraft.app.lab.transfer import markdown, run_transfer

    report = run_transfer(service, seed=3, held_out=1, budget=6).as_dict()
    f = report["facts"]
    assert f["held_out"] == len(FAMILIES) and f["families"] == len(FAMILIES)
    assert f["family_found"] == f["held_out"]  # the related search picked each problem's own family
    assert f["logits_equal"] == f["held_out"]  # (b) and (c): the same bits before the answer
    assert all(d["receipt_equal"] for d in report["deposits"])
    assert all(r["answer_ready"] and r["exact"] for r in report["recurring"])
    text = markdown(report)
    assert "(c) held-out, same solution prefilled" in text and f"{f['held_out']} of {f['held_out']}" in text
