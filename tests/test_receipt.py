"""One receipt type: every maker builds it the same way, every reader reads every stored shape."""

from __future__ import annotations

import pytest

from kvgraft.app.answer.chat import ChatService
from kvgraft.app.proof.prompts import DOCUMENT_PROBE, ask_suffix
from kvgraft.app.proof.receipt import ANSWER_READY_PROBE, SESSION_PROBE, Receipt, probe_for
from kvgraft.app.proof.replay import expected_tokens, replay
from kvgraft.app.service import LibraryService, open_library
from kvgraft.library.tokens import tokens_sha256

A, B = "a" * 64, "b" * 64


class _Chars:
    """A tokenizer that is one token per character: enough for probe_for's choices."""

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return ([1] if add_bos else []) + [ord(c) for c in text]


def test_compared_says_equal_only_from_the_comparison():
    same = Receipt.compared("p", [1, 2], A, A, [1, 1])
    other = Receipt.compared("p", [1, 2], A, B)
    assert same.equal is True and other.equal is False
    assert Receipt.fresh("p", [1, 2], A, computed="replay").equal is None  # nothing compared: no word for it


def test_stored_shape_reads_back_as_the_same_receipt():
    for r in (
        Receipt.compared("p", [1, 2, 3], A, B, [2, 1]),
        Receipt.fresh("p", [5], A, computed="replay"),
        Receipt.fresh(SESSION_PROBE, [7, 8], A, computed="chat", format="plain-v1"),
    ):
        assert Receipt.read(r.as_dict()) == r
    assert "logits_before_reply_sha256" in Receipt.fresh("s", [1], A, computed="chat").as_dict()


def test_older_shapes_read():
    deposit = {"probe": "q", "probe_tokens_sha256": A, "fresh_logits_sha256": A, "graft_logits_sha256": A, "equal": 1}
    assert Receipt.read(deposit).computed == "deposit" and Receipt.read(deposit).equal is True
    chat = Receipt.read({"logits_before_reply_sha256": B, "format": "plain-v1"})
    assert (chat.computed, chat.probe, chat.fresh_logits_sha256, chat.probe_tokens_sha256) == (
        "chat",
        SESSION_PROBE,
        B,
        None,
    )
    assert chat.matches([1], B) is None  # no probe hash: nothing it can be compared with


@pytest.mark.parametrize("raw", [None, [], {}, {"fresh_logits_sha256": "not a hash"}, {"probe": "p"}])
def test_what_is_not_a_receipt_reads_as_none(raw):
    assert Receipt.read(raw) is None


def test_matches_and_calls_only_for_its_own_probe():
    r = Receipt.compared("p", [4, 5, 6], A, A, [2, 1])
    assert r.matches([4, 5, 6], A) is True and r.matches([4, 5, 6], B) is False
    assert r.matches([4, 5], A) is None
    assert r.calls_for([4, 5, 6]) == [2, 1] and r.calls_for([4, 5]) is None


def test_probe_for_each_kind():
    m = _Chars()
    q = "What is 2+2?"
    assert probe_for(m, "solution", q) == (ask_suffix(q), m.tokenize(ask_suffix(q), add_bos=False))
    assert probe_for(m, "answer", q) == (ANSWER_READY_PROBE, m.tokenize(ask_suffix(q), add_bos=False)[-1:])
    assert probe_for(m, "document", None)[0] == DOCUMENT_PROBE
    assert probe_for(m, "solution", None)[0] == DOCUMENT_PROBE  # a solution without its question: the document probe


def test_every_maker_stores_the_one_shape(engine, tmp_path):
    """Deposit (a solution and its answer-ready state), replay and a chat turn: each stored receipt is
    exactly `Receipt.as_dict()` of what it reads as, and the two runs of one probe name it the same way."""
    q = "How many crates are left if 10 arrive and 3 leave?"
    with open_library(tmp_path / "home") as lib, LibraryService(engine, lib) as service:
        sol = service.deposit_solution(q, "10 - 3 = 7.", "7").entry
        ready = service.answer_ready(sol)
        assert ready is not None
        ready_schedule = ready.schedule
        turn = ChatService(service).say(ChatService(service).new_thread().id, "hello", max_tokens=4)
        stored = [sol.receipt, ready.receipt, lib.get(turn.entry_id).receipt]
    for raw in stored:
        assert Receipt.read(raw).as_dict() == raw
    r_sol, r_ready, r_chat = (Receipt.read(x) for x in stored)
    assert r_sol.equal is True and r_ready.equal is True and r_chat.computed == "chat"
    assert r_ready.probe == ANSWER_READY_PROBE and r_ready.probe_calls == (1,)
    again = replay(engine, expected_tokens(engine.model, "answer", sol.text, q), "answer", q, ready_schedule)
    assert again.receipt.probe == r_ready.probe  # one name for the answer-ready probe (it was two)
    assert again.receipt.probe_tokens_sha256 == r_ready.probe_tokens_sha256
    assert again.receipt.fresh_logits_sha256 == r_ready.fresh_logits_sha256  # the same run in its schedule
    assert r_sol.probe_tokens_sha256 == tokens_sha256(engine.model.tokenize(ask_suffix(q), add_bos=False))
