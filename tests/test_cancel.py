"""One cancel protocol (engine/errors.Cancelled): a callback stops work by raising Cancelled, never by
what it returns. A prefill lets it through (the context stays consistent: reset and reused, or closed by
the service); a generation catches it and returns the part decoded, stop_reason "callback"."""

from __future__ import annotations

import pytest

from kvgraft.app.answer.ask import ask
from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.app.service import LibraryService
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.errors import Cancelled
from kvgraft.library.library import Library

CHUNK = 64


@pytest.fixture(scope="module")
def small_batch(engine):
    """The real model, decoded in 64-token chunks: a few hundred tokens make several chunks."""
    return engine.with_config(engine.config.replace(n_batch=CHUNK, n_ubatch=CHUNK))


def cancel_at(n_calls: int, seen: list):
    def on_progress(done: int, total: int) -> None:
        seen.append((done, total))
        if len(seen) == n_calls:
            raise Cancelled("stop")

    return on_progress


def test_a_raising_progress_callback_stops_a_prefill_and_the_context_is_reusable(small_batch):
    tokens = prefix_tokens(small_batch.model, 5 * CHUNK, seed=3)
    with small_batch.session() as fresh:
        fresh.prefill(tokens)
        want = logits_sha256(fresh.logits())
    seen: list = []
    with small_batch.session() as s:
        with pytest.raises(Cancelled):
            s.prefill(tokens, on_progress=cancel_at(2, seen))
        assert seen == [(CHUNK, len(tokens)), (2 * CHUNK, len(tokens))]  # no chunk after the raise
        assert s.n_past == 2 * CHUNK and s.tokens == tokens[: 2 * CHUNK]  # what was decoded, as documented
        s.reset()
        s.prefill(tokens)
        assert logits_sha256(s.logits()) == want  # reused after reset: the same bits as a new context


def test_a_progress_callback_returning_false_does_not_cancel(small_batch):
    """The old second protocol is gone: a return value means nothing."""
    tokens = prefix_tokens(small_batch.model, 3 * CHUNK, seed=4)
    seen = []
    with small_batch.session() as s:
        s.prefill(tokens, on_progress=lambda d, t: seen.append(d) or False)
        assert s.n_past == len(tokens) and seen == [CHUNK, 2 * CHUNK, 3 * CHUNK]


def test_a_cancelled_prefill_in_the_service_closes_its_warm_context(small_batch, tmp_path):
    tokens = prefix_tokens(small_batch.model, 3 * CHUNK, seed=5)
    with Library(tmp_path / "lib") as lib, LibraryService(small_batch, lib) as service:
        with pytest.raises(Cancelled), service.session() as warm:
            warm.prefill(tokens, on_progress=cancel_at(1, []))
        assert warm.closed  # LibraryService.session closes its warm context on any exception
        with service.session() as again:
            assert again is not warm and again.n_past == 0
            again.prefill(tokens)
            assert again.n_past == len(tokens)


def test_a_generation_stopped_by_cancelled_returns_the_part_decoded(engine, probe):
    prompt = prefix_tokens(engine.model, 40, seed=6) + probe
    with engine.session() as s:
        s.prefill(prompt)
        whole = s.generate(6, stop_at_eog=False)
        s.reset()
        s.prefill(prompt)
        seen = []

        def stop_at_third(token: int, piece: str) -> None:
            seen.append(token)
            if len(seen) == 3:
                raise Cancelled("enough")

        gen = s.generate(40, on_token=stop_at_third, stop_at_eog=False)
        assert gen.stop_reason == "callback"
        assert gen.tokens == seen == whole.tokens[:3]  # the third was chosen and is returned...
        assert s.n_past == len(prompt) + 2  # ...but not decoded into the context
        raw = b"".join(engine.model.token_bytes(t) for t in gen.tokens)
        assert gen.text == raw.decode("utf-8", errors="replace") and gen.text  # the partial text, returned
        assert whole.text.startswith(gen.text)


def test_a_token_callback_returning_false_does_not_stop(engine, probe):
    with engine.session() as s:
        s.prefill(prefix_tokens(engine.model, 40, seed=7) + probe)
        gen = s.generate(5, on_token=lambda t, p: False, stop_at_eog=False)
        assert gen.stop_reason == "max_tokens" and len(gen.tokens) == 5


def test_ask_stopped_by_on_text_returns_a_cancelled_answer_shown_whole(engine, tmp_path):
    """on_text raising Cancelled (on every piece once it wants to stop, as the window's does): the answer
    is the part decoded, marked cancelled and not depositable, and the pieces shown add up to it."""
    pieces: list[str] = []

    def on_text(piece: str) -> None:
        pieces.append(piece)
        if "".join(pieces).strip():
            raise Cancelled("stop")

    with Library(tmp_path / "lib") as lib, LibraryService(engine, lib) as service:
        r = ask(service, "Write a long story about a lighthouse keeper.", use_library=False, on_text=on_text)
    assert r.stop_reason == "callback" and r.cancelled and not r.depositable
    assert r.answer and "".join(pieces) == r.answer
    assert r.tokens_decoded < 128
