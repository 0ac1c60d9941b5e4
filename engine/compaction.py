"""Canonical snapshots: whole-state bytes with the K and V of dead sliding-window cells zeroed.

In a sliding-window cache, a query at position p attends only to cells at positions q with
p - q < n_swa (llama.cpp's standard window, `is_masked_swa`). Once a snapshot holds positions
0..n-1, every later token sits at n or beyond, so a cell at q <= n-1-n_swa is masked for every
token that can ever follow: its K and V bytes never reach an output. Setting them to zero gives
bit-identical logits after a graft (tests/test_compaction.py; FINDINGS.md measured it first) and
a canonical form whose SHA-256 is the content address, with long zero runs that the blob
container does not store (library/container.py).

The canonical form is a pure function of the bytes and two model hyperparameters: the window
n_swa (from llama.cpp, `llama_model_n_swa`, which reads the GGUF) and which KV cache holds the
sliding-window layers. llama.cpp writes a sliding-window model's state as two caches, the
global layers' first and the window layers' second (`llama_kv_cache_iswa::state_write`); a model
without a window writes one cache and is left untouched. Global layers keep every cell.

Pure Python + numpy: no llama.cpp, so it runs anywhere a snapshot's bytes are (fsck, import).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .state import ParsedState

# Architectures whose window is not llama.cpp's standard causal one (chunked or symmetric): a cell
# far behind may still be seen, so they are never compacted.
NON_STANDARD_WINDOWS = frozenset({"llama4", "gemma-embedding", "modern-bert"})


@dataclass(frozen=True)
class WindowSpec:
    """What canonicalization needs to know about a model: its window and which cache has it."""

    n_swa: int  # 0: no sliding window, canonicalization is the identity
    swa_caches: tuple[int, ...] = ()

    @property
    def active(self) -> bool:
        return self.n_swa > 0 and bool(self.swa_caches)

    @classmethod
    def for_model(cls, n_swa: int, architecture: str, n_caches: int) -> "WindowSpec":
        """The spec for a model with window `n_swa` whose snapshots hold `n_caches` KV caches."""
        if n_swa <= 0 or architecture in NON_STANDARD_WINDOWS or n_caches != 2:
            return cls(0, ())
        return cls(int(n_swa), (1,))

    def as_dict(self) -> dict:
        return {"n_swa": self.n_swa, "swa_caches": list(self.swa_caches)}


def dead_cells(n_tokens: int, n_swa: int) -> int:
    """How many leading cells (positions 0..d-1) no later token can attend to."""
    return max(0, n_tokens - n_swa) if n_swa > 0 else 0


def dead_ranges(parsed: ParsedState, spec: WindowSpec) -> np.ndarray:
    """The (offset, length) byte ranges of dead cells' K and V, sorted, as an (n, 2) uint64 array.

    K (and V when not transposed) is one row per cell, so the dead cells are one run per layer.
    Transposed V (flash attention off) is one row per embedding element across all cells, so the
    dead cells are a run at the start of each of the layer's n_embd rows.
    """
    if not spec.active:
        return np.zeros((0, 2), dtype=np.uint64)
    n = parsed.n_tokens
    d = dead_cells(n, spec.n_swa)
    if d == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    out = []
    for span in parsed.spans:
        if span.cache not in spec.swa_caches:
            continue
        cache = parsed.layout.caches[span.cache]
        if span.kind == "k":
            out.append(np.array([[span.offset, d * cache.k_rows[span.layer][1]]], dtype=np.uint64))
        elif not cache.v_trans:
            out.append(np.array([[span.offset, d * cache.v_rows[span.layer][1]]], dtype=np.uint64))
        else:
            _, el, n_embd = cache.v_rows[span.layer]
            starts = span.offset + np.arange(n_embd, dtype=np.uint64) * np.uint64(n * el)
            out.append(np.stack([starts, np.full(n_embd, d * el, dtype=np.uint64)], axis=1))
    if not out:
        return np.zeros((0, 2), dtype=np.uint64)
    ranges = np.concatenate(out)
    return ranges[np.argsort(ranges[:, 0], kind="stable")]


def canonicalize(buf, parsed: ParsedState, spec: WindowSpec) -> np.ndarray:
    """Zero the dead cells of `buf` (writable, parsed as `parsed`) in place; return the ranges.

    Idempotent: the ranges depend only on the layout and n_tokens, which zeroing does not touch.
    """
    ranges = dead_ranges(parsed, spec)
    if len(ranges):
        arr = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
        if not arr.flags.writeable:
            raise TypeError("canonicalize needs a writable buffer")
        _zero_dead(arr, parsed, spec)
    return ranges


def _zero_dead(arr: np.ndarray, parsed: ParsedState, spec: WindowSpec) -> None:
    """Zero dead cells a layer at a time, one numpy assignment each (a 2-D one for transposed V)."""
    for view in _dead_views(arr, parsed, spec):
        view[...] = 0


def _dead_views(arr: np.ndarray, parsed: ParsedState, spec: WindowSpec):
    """The dead cells of `arr` as one numpy view per layer's K or V (2-D for transposed V): the same
    bytes as `dead_ranges`, without a Python step per range."""
    n = parsed.n_tokens
    d = dead_cells(n, spec.n_swa)
    if not spec.active or d == 0:
        return
    for span in parsed.spans:
        if span.cache not in spec.swa_caches:
            continue
        cache = parsed.layout.caches[span.cache]
        if span.kind == "v" and cache.v_trans:
            _, el, n_embd = cache.v_rows[span.layer]
            yield arr[span.offset : span.offset + span.size].reshape(n_embd, n * el)[:, : d * el]
        else:
            row = cache.k_rows[span.layer][1] if span.kind == "k" else cache.v_rows[span.layer][1]
            yield arr[span.offset : span.offset + d * row]


def is_canonical(data, parsed: ParsedState, spec: WindowSpec) -> bool:
    arr = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    return not any(view.any() for view in _dead_views(arr, parsed, spec))
