"""The server's prompt cache: the library's automatic states and one warm context, keyed by tokens.

Runs on the engine thread. `prepare(tokens)` leaves the context holding the whole prompt with the
logits after its last token, decoded in the prompt's aligned schedule (app/serve/schedule.py):

1. the longest reuse point of the prompt's schedule that the warm context holds (same tokens before
   it: the last request's prompt shares them) is kept and the rest trimmed (`Session.trim`);
2. unless a cache state in the library is longer: then it is grafted (read, hash-checked, restored);
3. the rest is decoded in the schedule's calls from there.

So a cold, warm or grafted run of a request decodes the same calls and gives the same logits, bit for
bit (tests/test_prompt_cache.py, tests/test_serve.py).

What is stored, and when: a prompt whose aligned part (A, its last multiple of B below n) goes past
the longest cache state already stored for it has its states at A and at n-1 (just before its last
token: the very same prompt again decodes one token) captured during the prefill (one copy of the
state each) and stored afterwards, in the engine thread's idle time (`store_one`). A prompt that only
adds a tail inside a block already stored (twenty short questions after one long system prompt) stores
nothing: the block's state serves them all, and each re-decodes at most B-1 tokens of its tail.
Cache states are `proof: local` (computed here) and evicted least recently used past the budget.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable

from kvgraft.app.proof.replay import schedule_of
from kvgraft.app.serve.schedule import BLOCK, aligned_end, calls_from, reuse_points
from kvgraft.app.service import LibraryService, model_record
from kvgraft.engine.errors import DecodeError
from kvgraft.engine.session import Session, snapshot_of

log = logging.getLogger(__name__)

MAX_PENDING = 8  # captured states waiting for idle time; past this the oldest is dropped (and counted)


class ContextLengthExceeded(DecodeError):
    """The prompt does not fit the context (with room for one token of reply)."""


@dataclass
class Prepared:
    """What getting a prompt into the context took: the `kvgraft` object of a response."""

    prompt_tokens: int
    cached_tokens: int  # not computed for this request: grafted, or still in the warm context
    source: str  # "cold", "warm" (the context held them) or "library" (a cache state grafted)
    entry_id: int | None = None
    proof: str | None = None
    tokens_restored: int = 0
    graft_ms: float = 0.0
    prefill_ms: float = 0.0
    tokens_prefilled: int = 0
    stores_queued: list[int] = field(default_factory=list)  # the lengths captured for storing

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class CacheCounters:
    hits_library: int = 0
    hits_warm: int = 0
    misses: int = 0
    tokens_prefilled: int = 0
    tokens_restored: int = 0
    tokens_warm: int = 0
    stored: int = 0
    dropped: int = 0
    evicted: int = 0
    graft_s: float = 0.0
    prefill_s: float = 0.0


class PromptCache:
    def __init__(self, service: LibraryService, budget_bytes: int, block: int = BLOCK) -> None:
        if not 0 < block <= service.engine.config.n_batch:
            raise DecodeError(f"the cache block ({block}) must be between 1 and the batch size")
        self.service = service
        self.engine = service.engine
        self.library = service.library
        self.block = block
        self.budget_bytes = budget_bytes
        self.counters = CacheCounters()
        self._session: Session | None = None
        self._points: list[int] = []  # reuse points of the prompt the warm context was last given
        self._pending: deque[tuple[int, bytearray, tuple[int, ...]]] = deque()
        self.last_size = (0, 0)  # (states, bytes) of automatic states, as of the last store: read by /metrics
        self.evict()  # a budget smaller than what an earlier run stored applies at once

    @property
    def session(self) -> Session:
        if self._session is None or self._session.closed:
            self._session = self.engine.session()
            self._points = []
        return self._session

    def warm_up(self) -> None:
        """At start, not in the first request's time: make the context, run one decode through it, and
        size the graft buffer for the largest stored state. A reset context computes like a new one
        (tests/test_warm_context.py), so this changes no bits."""
        s = self.session
        s.prefill([self.engine.model.bos])
        s.logits()
        s.reset(clear_data=False)
        self.service.reserve_graft_buffer(self.library.largest_cache_blob())

    @property
    def pending(self) -> int:
        return len(self._pending)

    def prepare(self, tokens: list[int], on_progress: Callable[[int, int], None] | None = None) -> Prepared:
        """Get `tokens` into the context (see the module doc); `on_progress(done, total)` after each call
        may raise Cancelled. On any error the warm context is dropped (the next request starts cold)."""
        n = len(tokens)
        if n == 0:
            raise DecodeError("the prompt is empty")
        if n >= self.engine.config.n_ctx:
            raise ContextLengthExceeded(
                f"the prompt has {n} tokens; this server's context holds {self.engine.config.n_ctx} "
                "(prompt and reply together)"
            )
        try:
            return self._prepare(tokens, on_progress)
        except BaseException:
            self.close_session()
            raise

    def _prepare(self, tokens: list[int], on_progress) -> Prepared:
        n, s, lib, fp = len(tokens), self.session, self.library, self.engine.fingerprint
        points = reuse_points(n, self.block)
        warm = self._warm_point(tokens, points)
        entry = lib.cached_state(tokens, [p for p in points if p > warm], fp, self.block)
        prep = Prepared(prompt_tokens=n, cached_tokens=0, source="cold")
        if entry is not None:
            s.reset(clear_data=False)
            g = self.service.graft(s, entry)
            lib.touch_cache_state(entry.id)
            start, stored = entry.n_tokens, entry.n_tokens
            prep.source, prep.entry_id, prep.proof = "library", entry.id, entry.proof
            prep.tokens_restored, prep.graft_ms = g.n_tokens, g.total_ms
            self.counters.hits_library += 1
            self.counters.tokens_restored += g.n_tokens
            self.counters.graft_s += g.total_ms / 1e3
        elif warm:
            s.trim(warm)
            start = warm
            below = lib.cached_state(tokens, [p for p in points if p <= warm], fp, self.block)
            stored = below.n_tokens if below is not None else 0
            prep.source = "warm"
            self.counters.hits_warm += 1
            self.counters.tokens_warm += warm
        else:
            s.reset(clear_data=False)
            start = stored = 0
            self.counters.misses += 1
        prep.cached_tokens = start
        a = aligned_end(n, self.block)
        keep: set[int] = set()
        if self.budget_bytes > 0 and a > stored:  # new aligned blocks: their state, and the prompt's own
            keep = {p for p in (a, n - 1) if p > stored}
        self._points = []  # until the prompt is in, the context holds no reuse point to trust
        if start in keep:  # the warm context holds it already: captured before going on
            self._queue(start, *s.capture())
            prep.stores_queued.append(start)
        t0 = time.perf_counter()
        at = start
        for c in calls_from(start, n, self.block):
            s.prefill(tokens[at : at + c])
            at += c
            if at in keep:
                self._queue(at, *s.capture())
                prep.stores_queued.append(at)
            if on_progress is not None:
                on_progress(at, n)
        prep.prefill_ms = (time.perf_counter() - t0) * 1e3
        prep.tokens_prefilled = n - start
        self._points = points
        self.counters.tokens_prefilled += n - start
        self.counters.prefill_s += prep.prefill_ms / 1e3
        return prep

    def _warm_point(self, tokens: list[int], points: list[int]) -> int:
        if self._session is None or self._session.closed or not self._points:
            return 0
        held = self._session.tokens
        common = 0
        for a, b in zip(held, tokens, strict=False):
            if a != b:
                break
            common += 1
        ours = set(self._points)
        return max((p for p in points if p in ours and p <= common), default=0)

    def _queue(self, point: int, data: bytearray, tokens: tuple[int, ...]) -> None:
        self._pending.append((point, data, tokens))
        while len(self._pending) > MAX_PENDING:
            self._pending.popleft()
            self.counters.dropped += 1

    def store_one(self) -> bool:
        """Store the oldest captured state (idle time); False when none is waiting."""
        if not self._pending:
            return False
        point, data, tokens = self._pending.popleft()
        snap = snapshot_of(self.engine, data, tokens)
        # the calls that decoded it: a prompt one token longer's, but for its last token alone
        calls = calls_from(0, len(tokens) + 1, self.block)[:-1]
        schedule = {**schedule_of(self.engine), **({"then": calls[1:]} if len(calls) > 1 else {})}
        _, created = self.library.add_cache_state(
            self.block,
            text=self.engine.model.detokenize(tokens),
            tokens=list(tokens),
            blob=snap.data,
            blob_sha256=snap.sha256,
            fingerprint=self.engine.fingerprint,
            model=model_record(self.engine),
            title=f"prompt cache: {len(tokens)} tokens",
            elided=snap.elided,
            schedule=schedule,
        )
        self.counters.stored += int(created)
        self.evict()
        return True

    def evict(self) -> int:
        """Remove least recently used cache states past the budget (after each store, and at start)."""
        removed, _ = self.library.evict_cache(self.budget_bytes)
        self.counters.evicted += removed
        self.last_size = self.library.cache_bytes()
        return removed

    def flush(self) -> int:
        """Store every captured state now (a graceful stop); returns how many were stored."""
        done = 0
        while self.store_one():
            done += 1
        return done

    def close_session(self) -> None:
        if self._session is not None:
            self._session.close()
        self._session = None
        self._points = []
