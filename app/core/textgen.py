"""Deterministic synthetic text for experiments and tests (no data files, no network)."""

from __future__ import annotations

import random

_WORDS = (
    "the a river stone light garden number market window silver quiet engine morning story "
    "bridge careful seven orange winter paper letter mountain kitchen answer reason simple "
    "table forest signal yellow seventeen coffee harbor village circle measure thunder"
).split()
_VERBS = "carries finds holds opens follows counts builds keeps watches crosses marks turns".split()


def synthetic_text(n_words: int, seed: int) -> str:
    """Readable-ish sentences from a fixed vocabulary; the same (n_words, seed) gives the same text."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n_words:
        k = rng.randint(4, 9)
        words = [rng.choice(_WORDS) for _ in range(k)]
        words.insert(rng.randint(1, k - 1), rng.choice(_VERBS))
        words[0] = words[0].capitalize()
        out.extend(words)
        out[-1] += "."
    return " ".join(out[:n_words])


def prefix_tokens(model, n_tokens: int, seed: int) -> list[int]:
    """Exactly `n_tokens` tokens: BOS, then synthetic text (tokens/word is ~1.3 for this vocabulary)."""
    words = max(8, n_tokens)
    toks = model.tokenize(synthetic_text(words, seed), add_bos=True)
    while len(toks) < n_tokens:
        words *= 2
        toks = model.tokenize(synthetic_text(words, seed), add_bos=True)
    return toks[:n_tokens]
