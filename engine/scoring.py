"""Scoring a text by the model's own reading: each token's log-probability given all before it.

The evidence for "this document explains this question" (issue: questions in a person's own words):
graft the document, then decode the question asking for the logits at every position. Decoded in the
same n_batch calls as `Session.prefill`; the context then holds the tokens, as after a prefill.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .bindings import llama
from .errors import EngineError
from .sampling import log_softmax


def prefill_scored(session, tokens: Sequence[int]) -> np.ndarray:
    """Decode `tokens` like `prefill` (the same n_batch calls), asking llama.cpp for the logits at
    every position; returns the natural-log probability of each token after the first given all
    before it (float64, len(tokens) - 1 values). Whether asking for every position's logits
    changes the bits of the cache is measured by `scripts/scored_prefill_bits.py`."""
    if len(tokens) < 2:
        raise EngineError("scoring needs at least two tokens")
    tokens = session._fitting(tokens)
    n_vocab = session.engine.model.info.n_vocab
    out = np.empty(len(tokens) - 1, dtype=np.float64)
    n_batch = session.engine.config.n_batch
    for start in range(0, len(tokens), n_batch):
        chunk = tokens[start : start + n_batch]
        session._decode(chunk, want_last_logits=True, all_logits=True)
        for i in range(len(chunk)):
            at = start + i
            if at + 1 >= len(tokens):
                break
            ptr = llama.llama_get_logits_ith(session._ctx, i)
            out[at] = log_softmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,)))[tokens[at + 1]]
    return out
