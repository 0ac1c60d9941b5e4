"""Closing a constrained answer within its token budget: a grammar answer that parses at any max_tokens.

`close_path(matcher, facts, limit)` finds a way from a grammar state to one the grammar accepts in at
most `limit` tokens, on a copy of llguidance's matcher (the state it is asked about is never moved):
the tokens the grammar forces are taken as they are (`compute_ff_tokens`), and where it leaves a
choice, the first allowed of a fixed list of closers (`"}`, `"]`, `}`, `]`, `"`, then the shortest
values `""`, `0`, `[]`, `{}`, `null`, ..., then `,`; inside a string, where `}` is a character, what
ends the string comes first), else the shortest allowed token. It is greedy, so
a path it finds is an upper bound on the shortest one, not always the shortest.

The decode loop (engine/decoding.py, through `Constraint.within`) keeps one such path from the current
state that fits the tokens left: the model's own choice is taken whenever a path still fits after it,
and where none would, the path's next token is taken instead; so when max_tokens is reached the grammar
accepts what was written. A request whose grammar has no path within max_tokens from the start is
refused before anything is decoded (`Constraint.shortest`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# what ends a structure first, then the shortest values (with the space the ": " separator leaves), then
# what goes on to the next required member
_VALUES = (b'""', b"0", b"[]", b"{}", b"null", b"true", b"false", b'"', b"[", b"{")
CLOSERS = (
    (b'"}', b'"]', b"}", b"]", b"]}", b"}}", b'"')
    + tuple(v for value in _VALUES for v in (value, b" " + value))
    + (b" ", b",", b", ", b'", ', b'",')  # " ": the separator's space before a digit
)
IN_STRING = (b'"}', b'"]', b'",', b'", ', b'"')  # inside a string "}" is a character, not a closer


@dataclass(frozen=True)
class VocabFacts:
    """What the closer reads of a model's vocabulary: each token's byte length (0 for control and
    whitespace-only tokens, chosen only where nothing else is allowed) and the ids of the closers, in
    CLOSERS' order."""

    lengths: np.ndarray
    closers: tuple[int, ...]
    in_string: tuple[int, ...] = ()  # what ends a string, tried first where a string is open
    probe: int | None = None  # "Q": allowed only inside a string (JSON spells nothing else with it)

    @classmethod
    def from_pieces(cls, pieces: list[bytes], control: list[bool]) -> "VocabFacts":
        """From each token's bytes and whether it is a control token (engine/constraint.py builds both)."""
        lengths = np.array([0 if c or not p.strip() else len(p) for p, c in zip(pieces, control, strict=True)])
        found: dict[bytes, int] = {}
        for i, (p, c) in enumerate(zip(pieces, control, strict=True)):
            if not c and p in CLOSERS and p not in found:
                found[p] = i
        probe = next((i for i, (p, c) in enumerate(zip(pieces, control, strict=True)) if p == b"Q" and not c), None)
        ids = tuple(found[c] for c in CLOSERS if c in found)
        return cls(lengths.astype(np.int32), ids, tuple(found[c] for c in IN_STRING if c in found), probe)


def close_path(matcher, facts: VocabFacts, bits: np.ndarray, limit: int) -> list[int] | None:
    """Tokens that take a copy of `matcher` to an accepting state, at most `limit` of them; None when the
    closer finds no such path (or the grammar fails). `bits` is a scratch mask buffer of the vocab's size."""
    m = matcher.deep_copy()
    path: list[int] = []
    n = len(facts.lengths)
    while not m.is_accepting():
        if m.is_error() or m.is_stopped() or len(path) >= limit:
            return None
        forced = m.compute_ff_tokens()
        if forced:
            if len(path) + len(forced) > limit or not m.consume_tokens(forced):
                return None
            path += forced
            continue
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if m.is_error():
            return None
        first = facts.in_string if facts.probe is not None and _allowed(bits, facts.probe) else ()
        tok = next((t for t in (*first, *facts.closers) if _allowed(bits, t)), None)
        if tok is None:
            ok = np.unpackbits(bits.view(np.uint8), bitorder="little")[:n].astype(bool)
            if not ok.any():
                return None
            # the shortest allowed that is not whitespace alone, lowest id on ties
            tok = int(np.argmin(np.where(ok & (facts.lengths > 0), facts.lengths, np.iinfo(np.int32).max)))
        if not m.consume_token(tok):
            return None
        path.append(tok)
    return path


def _allowed(bits: np.ndarray, token: int) -> bool:
    """Whether llguidance's mask (32 tokens a word, lowest bit first) allows `token`."""
    return bool((bits[token >> 5] >> (token & 31)) & 1)
