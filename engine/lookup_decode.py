"""Prompt-lookup decoding: the verify call, the drafter the decode loop uses, and the replay of its calls.

Each step of greedy decoding (engine/decoding.py, `lookup` > 0) feeds the chosen token and the tokens
`NgramIndex.draft` guessed after it in ONE llama_decode call that reads the logits at every fed position,
keeps the chosen token and the longest drafted prefix the model's own argmax agrees with, and removes the
rest from the cache (`Session.trim`). The call's shape is part of the bits (a token's cells can differ
with the batch it was decoded in), so every call is recorded as `{"fed": [...], "kept": n}` (the rejected
ids too): `replay_calls` repeats them in a fresh context and must give the same cells and logits
(tests/test_lookup_decode.py). Greedy only, lowest id on ties; drafts never hold an end-of-generation
token, so one is never decoded into the context. Asking for logits at every position leaves the cells as
a plain prefill makes them (tests/test_scoring.py measures it for scored prefills).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import EngineError
from .lookup import NgramIndex, accepted_prefix
from .scoring import logits_row

MAX_N, MIN_N = 4, 2  # drafts follow the longest earlier occurrence of the last 4..2 tokens
FIRST = 4  # the first draft's length (then doubled while all accepted, up to k)
TRUST = 0.7  # draft only while at least this share of drafted tokens was accepted (the first draft always)
EMA = 0.2  # weight of the newest measurement in the engine's running estimates (DraftStats)
RETRY = 8  # after generations whose drafts lost time, one in RETRY drafts again (the content may have changed)


@dataclass
class DraftStats:
    """What an engine has learnt about its drafts (`Engine.draft_stats`): a one-token decode call's wall
    time and the seconds recent generations' verify calls saved (negative: lost), both running averages."""

    decode_cost: float | None = None
    gain: float | None = None
    skipped: int = 0  # generations since the last one that drafted while drafts lose

    def note_call(self, seconds: float) -> None:
        self.decode_cost = seconds if self.decode_cost is None else (1 - EMA) * self.decode_cost + EMA * seconds

    def note_generation(self, saved: float) -> None:
        self.gain = saved if self.gain is None else (1 - EMA) * self.gain + EMA * saved

    def worth_trying(self) -> bool:
        """Draft in this generation: unless recent ones lost time (then one in RETRY, to learn again)."""
        if self.gain is None or self.gain >= 0:
            return True
        self.skipped += 1
        if self.skipped >= RETRY:
            self.skipped = 0
            return True
        return False


def feed(session, fed: Sequence[int], keep: int | None = None) -> tuple[list[int], int]:
    """One verify call: decode `fed` after the context in one call with logits at every position; keep
    fed[0] and the drafted tokens the argmax agrees with (or exactly `keep` tokens, for a replay), trim
    the rest. Returns (argmax at each fed position, how many were kept)."""
    fed = session._fitting(fed)
    if not fed or len(fed) > session.engine.config.n_batch:
        raise EngineError(f"a verify call feeds 1 to n_batch tokens (got {len(fed)})")
    before = session.n_past
    session._decode(fed, want_last_logits=True, logit_rows=slice(0, len(fed)))
    argmax = [int(np.argmax(logits_row(session, i))) for i in range(len(fed))]  # first max: lowest id on ties
    kept = 1 + accepted_prefix(fed[1:], argmax[:-1]) if keep is None else keep
    if not 1 <= kept <= len(fed):
        raise EngineError(f"a verify call keeps 1 to {len(fed)} tokens (got {kept})")
    if kept < len(fed):
        session.trim(before + kept)
    return argmax, kept


class Drafter:
    """The drafting half of the decode loop (engine/decoding.py): an n-gram index over the session's
    tokens when generation starts (the request's own context: grafted and prefilled alike) and each
    token decoded since; `step` decodes a chosen token with its draft.

    A drafted position costs llama.cpp a row of logits over the whole vocabulary (for the 270M model
    about as much as the rest of the token: README, prompt lookup), so drafts are kept to what is
    likely to be accepted: they end before a token holding the first character of a stop string (the
    generation ends there and plain decoding would not decode it), the first is FIRST tokens long, the
    length doubles (up to k) while every drafted token is accepted and falls to the accepted count when
    one is not, and once fewer than TRUST of the drafted tokens were accepted nothing more is drafted.

    And drafting turns itself off where it does not pay: each verify call's wall time is weighed against
    what its kept tokens would have cost one call each (the engine's running estimate of a one-token
    call, `DraftStats`); once the calls of this generation cost more than they saved it decodes one
    token per call to the end, and while recent generations' drafts lost time only one generation in
    RETRY drafts at all (engine/decoding.py asks `DraftStats.worth_trying` before it makes a Drafter).
    So on requests with nothing to copy drafting costs a first short draft now and then, and where
    answers copy their context it pays (scripts/prompt_lookup.py)."""

    def __init__(self, session, k: int, stops=()) -> None:
        self.session, self.k = session, k
        self.index = NgramIndex(session.tokens, max_n=MAX_N)
        model = session.engine.model
        self.is_eog, self.token_bytes = model.is_eog, model.token_bytes
        self.stop_starts = {s[0].encode("utf-8") for s in stops if s}
        self.length = min(k, FIRST)  # the next draft's length
        self.drafted = self.accepted = self.verified = 0
        self.saved = 0.0  # seconds the verify calls saved against one call per kept token (negative: lost)
        self.stats: DraftStats = session.engine.draft_stats

    def finish(self) -> None:
        """Generation ended: what its verify calls saved goes into the engine's running average."""
        if self.verified:
            self.stats.note_generation(self.saved)

    def _draft(self, n: int) -> list[int]:
        if self.accepted + 1 < TRUST * (self.drafted + 1):  # mostly rejected: drafts cost more than they save
            return []
        if self.saved < 0 or self.stats.decode_cost is None:  # lost time, or nothing to weigh it against yet
            return []
        draft = self.index.draft(n, min_n=MIN_N)
        for i, d in enumerate(draft):
            if self.is_eog(d) or any(c in self.token_bytes(d) for c in self.stop_starts):
                return draft[:i]
        return draft

    def step(self, tok: int, room: int) -> tuple[list[int], int | dict]:
        """Decode `tok` and up to k drafted tokens (no more than `room` - 1, nor past the context) in one
        call. Returns the choices known after it (the accepted drafted tokens, decoded, then the next
        choice, not decoded) and the call as a schedule records it: 1 when nothing was drafted (a plain
        one-token decode, choices []), else {"fed": [...], "kept": n}."""
        s = self.session
        self.index.extend([tok])
        n = min(self.length, room - 1, s.n_ctx - s.n_past - 1, s.engine.config.n_batch - 1)
        draft = self._draft(n) if n > 0 else []
        t0 = time.perf_counter()
        if not draft:
            s.decode_one(tok)
            self.stats.note_call(time.perf_counter() - t0)
            return [], 1
        argmax, kept = feed(s, [tok, *draft])
        self.saved += kept * self.stats.decode_cost - (time.perf_counter() - t0)
        self.verified += 1
        self.index.extend(draft[: kept - 1])
        self.drafted, self.accepted = self.drafted + len(draft), self.accepted + kept - 1
        self.length = min(self.k, 2 * len(draft)) if kept - 1 == len(draft) else max(1, kept - 1)
        return argmax[:kept], {"fed": [tok, *draft], "kept": kept}


def replay_calls(session, calls: Sequence, tokens: Sequence[int]) -> None:
    """Decode `tokens` after what `session` holds in the recorded `calls`: an int n decodes the next n
    tokens in one call (logits at the last), {"fed", "kept"} repeats a verify call, whose kept tokens
    must be the next ones (EngineError otherwise: the schedule does not describe these tokens)."""
    total = sum(map(call_size, calls))
    if total != len(tokens):
        raise EngineError(f"the calls decode {total} tokens, not {len(tokens)}")
    at = 0
    for call in calls:
        if isinstance(call, int):
            session.prefill(tokens[at : at + call])
            at += call
            continue
        kept = call["kept"]
        if list(call["fed"][:kept]) != list(tokens[at : at + kept]):
            raise EngineError(f"a verify call keeps other tokens than the ones at position {at}")
        feed(session, call["fed"], keep=kept)
        at += kept


def call_size(call) -> int:
    """How many tokens a recorded call left in the context."""
    return call if isinstance(call, int) else call["kept"]
