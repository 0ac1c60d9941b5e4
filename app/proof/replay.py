"""Replay: recompute an entry's state here, in the schedule it was made with, to prove its origin.

A KV state is opaque: nobody can read a blob and see that it is the state of its text. What can be
checked is that prefilling the text here, in the same decode schedule, reproduces the blob's
content address (the SHA-256 of its canonical bytes, engine/compaction.py). An entry whose state
was replayed that way has proof "replayed" (docs/exact-graft.md).

The schedule (docs/exact-graft.md): one prefill of the tokens from position 0 in chunks of n_batch,
llama.cpp splitting each chunk into n_ubatch micro-batches. An entry records the (n_batch,
n_ubatch) it was made with, and the calls after that prefill ("then": a chat turn's reply, one call
per token or, with prompt-lookup decoding, verify calls {"fed", "kept"}); a replay uses the same
where the schedule decides the bits. On a batch-invariant engine (`Engine.batch_invariant`: its probe
found every split of a prompt into calls gives the same bits) it does not: there a replay is one
prefill of the tokens, whatever schedule was recorded (`prefill_in_schedule`, `decode_in_calls`,
`engine_for`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from kvgraft.app.proof.receipt import Receipt, probe_for
from kvgraft.app.proof.solution_format import entry_tokens, question_suffix
from kvgraft.engine.compaction import canonicalize
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.engine import Engine
from kvgraft.engine.errors import EngineError
from kvgraft.engine.lookup_decode import call_size, replay_calls
from kvgraft.engine.state import parse_state
from kvgraft.library.schedule import parse_schedule  # noqa: F401 (the replay's callers read schedules here too)


def decode_in_calls(session, tokens: Sequence[int], calls: Sequence | None = None) -> None:
    """Decode `tokens` as the given consecutive calls, as one call when `calls` is None or the engine is
    batch-invariant: an int is a call of that many tokens, {"fed", "kept"} a verify call of prompt-lookup
    decoding (engine/lookup_decode.py)."""
    calls = list(calls) if calls and not session.engine.batch_invariant else [len(tokens)]
    try:  # replay_calls checks that the calls decode exactly these tokens
        replay_calls(session, calls, tokens)
    except EngineError as exc:
        raise ValueError(f"the recorded decode calls do not describe these tokens: {exc}") from exc


def schedule_of(engine: Engine) -> dict:
    """The decode schedule a deposit on `engine` uses, as entries record it."""
    return {"prefill": "chunks", "n_batch": engine.config.n_batch, "n_ubatch": engine.config.n_ubatch}


def prefill_in_schedule(
    session, tokens: Sequence[int], schedule: dict | None, on_progress: Callable[[int, int], None] | None = None
) -> None:
    """Decode `tokens` from position 0 the way `schedule` says: n_batch chunks, then the `then` calls
    (n_batch chunks only, on a batch-invariant engine)."""
    then = [] if session.engine.batch_invariant else (schedule or {}).get("then") or []
    head = len(tokens) - sum(call_size(c) for c in then)
    if head < 1:
        raise ValueError(f"a schedule's calls {then} leave nothing of {len(tokens)} tokens for the chunked prefill")
    session.prefill(tokens[:head], on_progress=on_progress)
    if then:
        decode_in_calls(session, tokens[head:], then)


def expected_tokens(model, kind: str, text: str, question: str | None) -> list[int]:
    """The tokens an entry's state holds: its text, and for an answer-ready state ("answer") the
    question suffix after it but its last token."""
    tokens = entry_tokens(model, kind, text)
    if kind == "answer":
        tokens += question_suffix(model, text, question)[1][:-1]
    return tokens


def engine_for(engine: Engine, schedule: dict | None) -> Engine:
    """`engine`, or one sharing its model with the batch shape the schedule names (where the batching
    decides the bits).

    A batch larger than this context is cut to n_ctx: an entry holds at most n_ctx tokens, so it is
    decoded in the same chunks either way."""
    schedule = parse_schedule(schedule)
    if not schedule or engine.batch_invariant:
        return engine
    n_batch = min(schedule["n_batch"], engine.config.n_ctx)
    n_ubatch = min(schedule["n_ubatch"], n_batch)
    if (n_batch, n_ubatch) == (engine.config.n_batch, engine.config.n_ubatch):
        return engine
    return engine.with_config(engine.config.replace(n_batch=n_batch, n_ubatch=n_ubatch))


@dataclass(frozen=True)
class Replay:
    sha256: str  # canonical snapshot SHA-256: the content address it must reproduce
    raw_sha256: str  # the same state as llama.cpp wrote it (the address blobs had before compaction)
    receipt: Receipt  # the probe's logits after the state, computed here (graft not compared)
    seconds: float


def replay(
    engine: Engine,
    tokens: Sequence[int],
    kind: str,
    question: str | None,
    schedule: dict | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    text: str | None = None,
) -> Replay:
    """Prefill `tokens` fresh in the entry's schedule; hash the state; prefill the receipt's probe after it."""
    eng = engine_for(engine, schedule)
    probe, probe_tokens = probe_for(eng.model, kind, question, text)
    t0 = time.perf_counter()
    with eng.session() as s:
        prefill_in_schedule(s, tokens, schedule, on_progress=on_progress)
        data, _ = s.canonical_state(canonical=False)  # one read of the state: hashed as written, then canonical
        raw = hashlib.sha256(data).hexdigest()
        canonicalize(data, parse_state(data, eng.layout, max_cells=eng.config.n_ctx), eng.window)
        canonical = hashlib.sha256(data).hexdigest()
        s.prefill(probe_tokens)
        fresh = logits_sha256(s.logits())
    receipt = Receipt.fresh(probe, probe_tokens, fresh, computed="replay")
    return Replay(canonical, raw, receipt, time.perf_counter() - t0)


def signer_vouch(signer_name: str, verified_by) -> str | None:
    """A trusted signer vouches for an answer only where its signed manifest says someone vouched
    (a JSONL's stated answers stay stated even in a signed pack)."""
    if not isinstance(verified_by, str) or not verified_by.strip():
        return None
    return f"signer:{signer_name} ({verified_by.strip()[:80]})"
