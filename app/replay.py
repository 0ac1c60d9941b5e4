"""Replay: recompute an entry's state here, in the schedule it was made with, to prove its origin.

A KV state is opaque: nobody can read a blob and see that it is the state of its text. What can be
checked is that prefilling the text here, in the same decode schedule, reproduces the blob's
content address (the SHA-256 of its canonical bytes, engine/compaction.py). An entry whose state
was replayed that way has proof "replayed" (docs/exact-graft.md).

The schedule (docs/exact-graft.md): one prefill of the tokens from position 0 in chunks of n_batch,
llama.cpp splitting each chunk into n_ubatch micro-batches. An entry records the (n_batch,
n_ubatch) it was made with; a replay uses the same (the CPU backend was measured to give the same
bits across batch sizes, a GPU backend is not known to).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from engine.compare import logits_sha256
from engine.engine import Engine
from library.tokens import tokens_sha256

from .problems import DOCUMENT_PROBE, ask_suffix


def probe_text(kind: str, question: str | None) -> str:
    """The continuation an entry's receipt records: its question for a solution, else the document probe."""
    return ask_suffix(question) if kind == "solution" and question else DOCUMENT_PROBE


def schedule_of(engine: Engine) -> dict:
    """The decode schedule a deposit on `engine` uses, as entries record it."""
    return {"prefill": "chunks", "n_batch": engine.config.n_batch, "n_ubatch": engine.config.n_ubatch}


def engine_for(engine: Engine, schedule: dict | None) -> Engine:
    """`engine`, or one sharing its model with the batch shape the schedule names."""
    if not schedule:
        return engine
    n_batch = int(schedule.get("n_batch", engine.config.n_batch))
    n_ubatch = int(schedule.get("n_ubatch", min(n_batch, engine.config.n_ubatch)))
    if (n_batch, n_ubatch) == (engine.config.n_batch, engine.config.n_ubatch):
        return engine
    return engine.with_config(engine.config.replace(n_batch=n_batch, n_ubatch=n_ubatch))


@dataclass(frozen=True)
class Replay:
    sha256: str  # canonical snapshot SHA-256: the content address it must reproduce
    raw_sha256: str  # the same state as llama.cpp wrote it (the address blobs had before compaction)
    receipt: dict  # the probe's logits after the state, computed here
    seconds: float


def replay(engine: Engine, tokens: Sequence[int], kind: str, question: str | None, schedule: dict | None = None,
           on_progress: Callable[[int, int], bool | None] | None = None) -> Replay:
    """Prefill `tokens` fresh in the entry's schedule; hash the state; prefill the receipt's probe after it."""
    eng = engine_for(engine, schedule)
    probe = probe_text(kind, question)
    probe_tokens = eng.model.tokenize(probe, add_bos=False)
    t0 = time.perf_counter()
    with eng.session() as s:
        s.prefill(tokens, on_progress=on_progress)
        raw = s.snapshot(canonical=False).sha256
        canonical = s.snapshot().sha256
        s.prefill(probe_tokens)
        fresh = logits_sha256(s.logits())
    receipt = {"probe": probe, "probe_tokens_sha256": tokens_sha256(probe_tokens), "fresh_logits_sha256": fresh,
               "computed": "replay"}
    return Replay(canonical, raw, receipt, time.perf_counter() - t0)
