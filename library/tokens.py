"""Token ids stored compactly (little-endian int32 bytes) and the hashes derived from them."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

PREFIX_BLOCK = 64  # prefix keys are kept at every multiple of this many tokens, plus the full length
KEY_BYTES = 16  # truncated SHA-256 per prefix key; a hit is always confirmed against the stored tokens


def pack_tokens(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


def unpack_tokens(blob: bytes) -> list[int]:
    return np.frombuffer(blob, dtype="<i4").tolist()


def tokens_sha256(tokens: Sequence[int]) -> str:
    """SHA-256 of the token ids as little-endian int32 (same contract as engine.session.tokens_sha256)."""
    return hashlib.sha256(pack_tokens(tokens)).hexdigest()


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefix_keys(tokens: Sequence[int], lengths: Sequence[int]) -> dict[int, bytes]:
    """Keys (truncated SHA-256 of tokens[:L]) for each L in `lengths`, hashing incrementally."""
    raw = pack_tokens(tokens)
    out: dict[int, bytes] = {}
    h = hashlib.sha256()
    done = 0
    for length in sorted(set(lengths)):
        if not 0 < length <= len(tokens):
            continue
        h.update(raw[done * 4 : length * 4])
        done = length
        out[length] = h.copy().digest()[:KEY_BYTES]
    return out


def entry_key_lengths(n_tokens: int) -> list[int]:
    """The lengths an entry of n tokens is indexed at: every block boundary, and n itself."""
    return list(range(PREFIX_BLOCK, n_tokens + 1, PREFIX_BLOCK)) + ([n_tokens] if n_tokens % PREFIX_BLOCK else [])
