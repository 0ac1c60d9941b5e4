"""ask, one function per source: what each says about itself, and the streamed text is the answer."""

from __future__ import annotations

import pytest

from kvgraft.app.answer.ask import ask
from kvgraft.app.answer.chat import ChatService
from kvgraft.app.answer.stream import TextStream
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.service import LibraryService, open_library

DOC = (
    "Survey notes on Runrenlys\n\n"
    + synthetic_text(670, 41)
    + "\n\nThe head brewer of Runrenlys is Kolys Feosdor.\n\n"
    + synthetic_text(60, 42)
    + "\n"
)
QUESTION = "Who is the head brewer of Runrenlys?"


@pytest.fixture
def service(engine, tmp_path):
    small = engine.with_config(engine.config.replace(n_ctx=1024))  # a document of ~850 tokens nearly fills it
    with open_library(tmp_path / "home") as lib, LibraryService(small, lib) as svc:
        yield svc


def _streamed(service, question, **kw):
    pieces: list[str] = []
    r = ask(service, question, on_text=pieces.append, **kw)
    return r, pieces


def test_a_covering_document_that_does_not_fit_is_named_not_denied(service):
    """Before: a document that covers the question but does not fit the context fell through to a fresh
    answer whose provenance said no stored document covers the question."""
    doc = service.deposit(DOC, title="Survey notes on Runrenlys").entry
    fits, _ = _streamed(service, QUESTION)
    assert (fits.source, fits.entry_id) == ("retrieved", doc.id)  # it covers the question
    budget = service.engine.config.n_ctx - doc.n_tokens  # no room left for the question and this many tokens
    r, pieces = _streamed(service, QUESTION, budget=budget)
    assert r.source == "fresh" and r.entry_id is None
    assert f"document #{doc.id} covers 100% of the question's words but does not fit this context" in r.not_grafted
    words = r.provenance()
    assert "does not fit" in words and "no stored document covers" not in words
    assert "".join(pieces) == r.answer


def test_streamed_pieces_add_up_to_the_answer_from_every_source(service):
    """Before: the CLI printed each token as it came (a stop string's start, U+FFFD of a split character)."""
    q = "A depot holds 40 crates, receives 12 and ships 9. How many crates are left?"
    service.deposit_solution(q, "40 + 12 - 9 = 43.", "43", vouched_by="you")
    service.deposit(DOC, title="Survey notes on Runrenlys")
    for question, source in ((q, "graft"), (QUESTION, "retrieved"), ("Tell me a story about a fox.", "fresh")):
        r, pieces = _streamed(service, question, budget=40, use_library=source != "fresh")
        assert r.source == source
        assert "".join(pieces) == r.answer, (source, pieces, r.answer)
        assert "\ufffd" not in "".join(pieces) or "\ufffd" in r.answer


def test_a_chat_reply_streams_as_returned(service):
    chats = ChatService(service)
    pieces: list[str] = []
    r = chats.say(chats.new_thread().id, "Say hello.", max_tokens=24, on_text=pieces.append)
    assert "".join(pieces) == r.reply


class _Bytes:
    """A model whose tokens are given byte strings (a character split over two tokens, a stop string over two)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def token_bytes(self, tok: int) -> bytes:
        return self.pieces[tok]


def test_text_stream_holds_back_split_characters_and_stop_strings():
    model = _Bytes([b" H", b"\xc3", b"\xa9", b"llo", b"\nQ", b":"])
    shown: list[str] = []
    stream = TextStream(model, shown.append, stops=["\nQ:"])
    for tok in range(5):  # the engine stops at the token that completes "\nQ:" (not passed on)
        stream.on_token(tok, model.token_bytes(tok).decode("utf-8", errors="replace"))
    assert "".join(shown) == "Héllo" and "\ufffd" not in "".join(shown)
    stream.finish("Héllo")  # the answer as returned: cut before the stop, stripped
    assert "".join(shown) == "Héllo"


def test_text_stream_refuses_to_show_two_answers():
    stream = TextStream(_Bytes([b"abc"]), None)
    stream.on_token(0, "abc")
    with pytest.raises(AssertionError):
        stream.finish("xyz")
