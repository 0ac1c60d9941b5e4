"""Scoring a text by the model's own reading (engine/scoring.py): real llama.cpp, real Gemma."""

from __future__ import annotations

import numpy as np
import pytest

from kvgraft.engine.errors import EngineError
from kvgraft.engine.sampling import log_softmax


def test_each_score_is_the_tokens_log_probability_given_all_before_it(engine):
    tokens = engine.model.tokenize("The town of Ashdunash was first recorded in the year 1762.")
    with engine.session() as s:
        scores = s.prefill_scored(tokens)
        assert s.tokens == tokens and s.n_past == len(tokens)
        last = s.logits()
    assert scores.shape == (len(tokens) - 1,) and np.all(scores <= 0)
    # the same probability from a context that stops there: another decode schedule (one call of i+1
    # tokens, not n), so other bits (FINDINGS.md: up to a few tenths), never another position's value
    want = []
    for i in range(len(tokens) - 1):
        with engine.session() as s:
            s.prefill(tokens[: i + 1])
            want.append(log_softmax(s.logits())[tokens[i + 1]])
    assert np.abs(scores - np.array(want)).max() < 0.3
    assert np.abs(scores[1:] - np.array(want)[:-1]).max() > 1.0  # one position off is far off
    assert np.isfinite(last).all()


def test_a_document_raises_the_likelihood_of_a_question_it_answers(engine):
    doc = engine.model.tokenize("The town of Ashdunash was first recorded in the year 1762 by a travelling monk.")
    other = engine.model.tokenize("Boats leave the harbor of Paquka at dawn, the red ones first.")
    q = engine.model.tokenize("\nQuestion: When does Ashdunash first appear in the records?", add_bos=False)
    gains = []
    for d in (doc, other):
        with engine.session() as s:
            s.prefill(d)
            gains.append(float(s.prefill_scored(q).mean()))
    assert gains[0] > gains[1]


def test_scoring_refuses_what_it_cannot_score(engine):
    with engine.session() as s:
        with pytest.raises(EngineError, match="two tokens"):
            s.prefill_scored([engine.model.bos])
        with pytest.raises(EngineError, match="vocabulary"):
            s.prefill_scored([1, 10**9])


def test_scoring_a_span_leaves_the_bits_of_a_plain_prefill(engine):
    """The reading's scoring pass is the winner's answer prefill (app/answer/reading.py): asking for the
    logits at the question's positions must leave the cache and the last logits as a plain prefill does."""
    from kvgraft.app.core.textgen import prefix_tokens
    from kvgraft.engine.compare import logits_sha256

    doc = prefix_tokens(engine.model, 300, 3)
    q = engine.model.tokenize("\n\nQ: Who is in charge of the port at Belmor?\nA:", add_bos=False)
    first, end = 4, len(q) - 2
    runs = []
    for scored in (False, True, None):
        with engine.session() as s:
            s.prefill(doc)
            lp = s.prefill(q) if scored is False else s.prefill_scored(q, first, end) if scored else s.prefill_scored(q)
            runs.append((logits_sha256(s.logits()), s.snapshot().sha256, lp))
    assert runs[1][:2] == runs[0][:2] == runs[2][:2]
    span, whole = runs[1][2], runs[2][2]
    assert span.shape == (end - first,)
    assert np.allclose(span, whole[first - 1 : end - 1], atol=1e-3)
    with engine.session() as s, pytest.raises(EngineError, match="first < end"):
        s.prefill_scored(q, 3, 3)
