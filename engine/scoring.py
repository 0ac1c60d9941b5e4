"""Scoring a text by the model's own reading: each token's log-probability given all before it.

The evidence for "this document explains this question" (issue: questions in a person's own words):
graft the document, then decode the question asking for the logits at the question's positions. Decoded in the
same n_batch calls as `Session.prefill`; the context then holds the tokens, as after a prefill.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .bindings import llama
from .errors import EngineError
from .sampling import log_softmax


def logits_row(session, i: int) -> np.ndarray:
    """A view of the logits llama.cpp holds for row `i` of the session's last decode call (-1: the last
    row); valid until the next decode. Rows exist only where that call asked for logits."""
    ptr = llama.llama_get_logits_ith(session._ctx, i)
    if not ptr:
        raise EngineError("llama.cpp returned no logits")
    return np.ctypeslib.as_array(ptr, shape=(session.engine.model.info.n_vocab,))


def prefill_scored(session, tokens: Sequence[int], first: int = 1, end: int | None = None) -> np.ndarray:
    """Decode `tokens` like `prefill` (the same n_batch calls), asking llama.cpp for the logits at the
    positions that predict tokens[first:end] (and at the last position, as `prefill` does); returns
    the natural-log probability of each of those tokens given all before it (float64, end - first
    values; `end` defaults to len(tokens)). Whether asking for those logits changes the bits of the
    cache is measured by `scripts/scored_prefill_bits.py` and tested (tests/test_scoring.py)."""
    n = len(tokens)
    end = n if end is None else end
    if not 1 <= first < end <= n:
        raise EngineError(f"scoring needs at least two tokens and 1 <= first < end <= {n} (got {first}, {end})")
    tokens = session._fitting(tokens)
    out = np.empty(end - first, dtype=np.float64)
    n_batch = session.engine.config.n_batch
    for start in range(0, n, n_batch):
        chunk = tokens[start : start + n_batch]
        lo, hi = max(first - 1 - start, 0), min(end - 1 - start, len(chunk))  # rows predicting first..end-1
        session._decode(chunk, want_last_logits=start + len(chunk) == n, logit_rows=slice(lo, max(lo, hi)))
        for i in range(lo, hi):
            out[start + i + 1 - first] = log_softmax(logits_row(session, i))[tokens[start + i + 1]]
    return out
