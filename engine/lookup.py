"""Prompt-lookup drafts: guess the next tokens from where the output's recent n-gram occurred before.

The groundwork of prompt-lookup decoding (issue: decode at prefill speed when the answer is in the
context): the tokens being decoded are often already in the context (a stored solution's `A: <answer>`
line, a retrieved document's name, a quoted passage). `NgramIndex` holds every n-gram (n = 1..max_n) of a
token sequence, the context and then each accepted output token, mapped to where its most recent earlier
occurrence ended; `draft(k)` looks up the longest suffix of the sequence that occurred before and proposes
the up to k tokens that followed it there. One lookup costs O(max_n) dictionary probes, never a scan of
the context, and `extend` indexes each new token in O(max_n).

Pure Python, no llama.cpp: whether a draft is accepted is decided by the model, in a verify call that reads
the logits at every drafted position (engine/lookup_decode.py; not yet used by ask, chat or the server).
"""

from __future__ import annotations

from typing import Iterable, Sequence


class NgramIndex:
    """n-gram -> end (exclusive) of its most recent occurrence that is not the sequence's own suffix."""

    def __init__(self, tokens: Iterable[int] = (), max_n: int = 4) -> None:
        if max_n < 1:
            raise ValueError(f"max_n must be at least 1 (got {max_n})")
        self.max_n = max_n
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens (context, then accepted output). The n-grams ending at the last token are indexed
        only once another token follows, so a lookup never finds the suffix it is looking up."""
        for t in tokens:
            self._index_last()
            self.tokens.append(int(t))

    def _index_last(self) -> None:
        seq, end = self.tokens, len(self.tokens)
        for n in range(1, min(self.max_n, end) + 1):
            self._ends[tuple(seq[end - n : end])] = end

    def draft(self, k: int, min_n: int = 1) -> list[int]:
        """Up to `k` tokens that followed the longest suffix (max_n down to min_n tokens) that occurred
        earlier, at its most recent earlier occurrence; [] when no suffix did."""
        if k <= 0:
            return []
        seq, end = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, end), min_n - 1, -1):
            at = self._ends.get(tuple(seq[end - n : end]))
            if at is not None:
                return seq[at : at + k]
        return []


def accepted_prefix(draft: Sequence[int], argmax: Sequence[int]) -> int:
    """How many drafted tokens a verify call accepts: `argmax[i]` is the model's greedy choice after the
    token before draft[i] (the fed token, then each drafted one), so draft[i] stands while it equals
    argmax[i]; the first disagreement ends it (argmax there is the next token either way)."""
    n = 0
    for d, a in zip(draft, argmax, strict=False):
        if d != a:
            break
        n += 1
    return n
