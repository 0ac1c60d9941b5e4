"""The exactness experiment: graft a snapshot into a fresh context and compare with a fresh run.

fresh:   new context, prefill P, snapshot, prefill Q, logits, greedy N tokens
grafted: new context, graft the snapshot, prefill Q, logits, greedy N tokens
Equal means the SHA-256 of the float32 logits after Q match and the N greedy tokens match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from .compare import compare_logits
from .engine import Engine


@dataclass(frozen=True)
class ExactnessRecord:
    prefix_tokens: int
    probe_tokens: int
    snapshot_sha256: str
    snapshot_bytes: int
    fresh_logits_sha256: str
    graft_logits_sha256: str
    sha256_equal: bool
    kl: float
    argmax_agree: bool
    max_abs_diff: float
    fresh_tokens: list[int]
    graft_tokens: list[int]
    tokens_equal: bool
    prefill_s: float
    graft_ms: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def graft_vs_fresh(engine: Engine, prefix: Sequence[int], probe: Sequence[int], n_gen: int = 16) -> ExactnessRecord:
    with engine.session() as fresh:
        t0 = time.perf_counter()
        fresh.prefill(prefix)
        prefill_s = time.perf_counter() - t0
        snap = fresh.snapshot()
        fresh.prefill(probe)
        fresh_logits = fresh.logits()
        fresh_gen = fresh.generate(n_gen, stop_at_eog=False)
    with engine.session() as grafted:
        g = grafted.graft(snap)
        grafted.prefill(probe)
        graft_logits = grafted.logits()
        graft_gen = grafted.generate(n_gen, stop_at_eog=False)
    cmp = compare_logits(fresh_logits, graft_logits)
    return ExactnessRecord(
        prefix_tokens=len(prefix),
        probe_tokens=len(probe),
        snapshot_sha256=snap.sha256,
        snapshot_bytes=len(snap.data),
        fresh_logits_sha256=cmp.sha256_a,
        graft_logits_sha256=cmp.sha256_b,
        sha256_equal=cmp.sha256_equal,
        kl=cmp.kl,
        argmax_agree=cmp.argmax_agree,
        max_abs_diff=cmp.max_abs_diff,
        fresh_tokens=fresh_gen.tokens,
        graft_tokens=graft_gen.tokens,
        tokens_equal=fresh_gen.tokens == graft_gen.tokens,
        prefill_s=prefill_s,
        graft_ms=g.total_ms,
    )
