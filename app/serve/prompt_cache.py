"""The server's prompt cache: the library's automatic states and one warm context, keyed by tokens.

Runs on the engine thread. `prepare(tokens, boundaries)` leaves the context holding the whole prompt
with the logits after its last token, from the longest prefix it can reuse.

On a batch-invariant engine (`Engine.batch_invariant`: the probe found every split of a prompt into
calls gives the same bits, docs/exact-graft.md) a state is the same bits however its tokens were
batched, so:

1. the warm context keeps every token it holds (the last prompt and its reply) that the new prompt
   shares (`Session.trim` to the first difference, at most n-1: the last token is decoded for its
   logits); only what is new is decoded, as llama-server does;
2. unless the library holds a longer shared prefix (`Library.cache.cache_candidates`): then that state is
   grafted (read, hash-checked, restored) and trimmed to what the prompt shares, where a trim is exact
   (`usable`: stored states are canonical, their dead sliding-window cells zeroed, so a state longer
   than the window is used whole or one token short);
3. the rest is decoded in n_batch chunks, cut where a state is to be stored.

What is stored: the states at the prompt's boundaries: a chat request's message ends (each message's,
the last one's with the generation prompt; app/proof/chat_format.py), a completion's last blank line (a
document or a system prompt before its question); a completion without one, its last whole block of
`block` tokens and, if shorter than one block, the whole prompt; and, where the request continues a
conversation (its prompt holds the last prompt and its reply, or a chat request holds an assistant
message), the state after the reply, which the next turn extends. A turn that goes on from the warm
context's last reply stores nothing on the way: its reply's state will hold it. Each only past what was
reused and where no stored state holds those tokens already (deduplicated by prefix). A state is
captured when the context holds it (one copy) and stored when the engine thread is idle (`store_one`,
app/serve/worker.py); the state after a reply is captured then too, or before the next request changes
the context, and a next turn that goes on from it supersedes it. Automatic states are `proof: local`
(computed here) and evicted least recently used past the budget.

On an engine whose bits depend on the batching (the probe says so, or KVGRAFT_BATCH_INVARIANT=0),
every request is decoded in its aligned schedule instead (app/serve/schedule.py, `prepare_aligned`),
and only states at that schedule's boundaries are stored and reused.

Either way a cold, warm or grafted run of a request gives the same logits, bit for bit
(tests/test_prompt_cache.py, tests/test_serve.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable, Sequence

from kvgraft.app.proof.replay import schedule_of
from kvgraft.app.serve.cache_counts import CacheCounters, ContextLengthExceeded, Prepared
from kvgraft.app.serve.pins import pin_prefixes
from kvgraft.app.serve.schedule import BLOCK, aligned_calls, prepare_aligned
from kvgraft.app.service import LibraryService, model_record
from kvgraft.engine.compaction import dead_cells
from kvgraft.engine.errors import DecodeError
from kvgraft.engine.session import Session, snapshot_of
from kvgraft.library.records import Entry
from kvgraft.library.tokens import shared_prefix

log = logging.getLogger(__name__)

MAX_PENDING = 8  # captured states waiting for idle time; past this the oldest is dropped (and counted)


class PromptCache:
    def __init__(self, service: LibraryService, budget_bytes: int, block: int = BLOCK) -> None:
        if not 0 < block <= service.engine.config.n_batch:
            raise DecodeError(f"the cache block ({block}) must be between 1 and the batch size")
        self.service = service
        self.engine = service.engine
        self.library = service.library
        self.invariant = self.engine.batch_invariant
        self.block = block
        self.budget_bytes = budget_bytes
        self.counters = CacheCounters()
        self._session: Session | None = None
        # the aligned path's reuse points of the prompt the warm context was last given (app/serve/schedule.py);
        # the invariant path may reuse every token it holds once `_trusted`
        self.held_points: list[int] = []
        self._trusted = False  # the warm context holds a whole prompt (and maybe its reply), nothing half-done
        self._pending: deque[tuple[int, bytearray, tuple[int, ...], int]] = deque()
        self._prompt_n = 0  # the last prompt's length and the longest stored state it extends
        self._stored = 0
        self._continues = False  # the last prompt continued a conversation: its reply's state is worth storing
        self._deferred = 0  # the warm context's length whose state is to be captured in idle time (0: none)
        self._must_store: set[tuple[int, ...]] = set()  # captured for a pin: never dropped as served by a longer one
        self.last_prefilled = 0  # tokens the last request prefilled (the worker stores at once after a long one)
        self.last_size = (0, 0)  # (states, bytes) of automatic states, as of the last store: read by /metrics
        self.remote = None  # a fleet's shared cache (app/serve/shared_cache.py), set by `kvgraft serve --remote`
        self.evict()  # a budget smaller than what an earlier run stored applies at once

    @property
    def session(self) -> Session:
        if self._session is None or self._session.closed:
            self._session = self.engine.session()
            self._trusted = False
            self.held_points = []
        return self._session

    def warm_up(self) -> None:
        """At start, not in the first request's time: make the context, run one decode through it, and
        size the graft buffer for the largest stored state. A reset context computes like a new one
        (tests/test_warm_context.py), so this changes no bits."""
        s = self.session
        s.prefill([self.engine.model.bos])
        s.logits()
        s.reset(clear_data=False)
        self.service.reserve_graft_buffer(self.library.cache.largest_cache_blob())

    @property
    def pending(self) -> int:
        """States waiting to be stored (the one still to be captured from the warm context included)."""
        return len(self._pending) + bool(self._deferred)

    def prepare(
        self,
        tokens: list[int],
        on_progress: Callable[[int, int], None] | None = None,
        boundaries: Sequence[int] = (),
        continues: bool = False,
        pins: Sequence[tuple[str, int, float]] = (),
    ) -> Prepared:
        """Get `tokens` into the context (see the module doc); `boundaries`: where the prompt's messages
        end (token counts), states worth storing; `continues`: the prompt holds an earlier reply (a
        chat's assistant message); `pins`: (name, length, ttl_s) prefixes to pin by name (library/cache_pins.py),
        their states captured on the way where none is stored. `on_progress(done, total)` after each call
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
            prep = Prepared(prompt_tokens=n, cached_tokens=0, source="cold")
            t0 = time.perf_counter()
            force = pin_prefixes(self, tokens, pins, prep)
            if self.invariant:
                start = self._prepare_invariant(tokens, on_progress, boundaries, continues, prep, force)
            else:
                start = prepare_aligned(self, tokens, on_progress, prep)
            self._trusted = True
        except BaseException:
            self.close_session()
            raise
        prep.cached_tokens = start
        prep.prefill_ms = (time.perf_counter() - t0) * 1e3 - prep.graft_ms
        prep.tokens_prefilled = self.last_prefilled = n - start
        self.counters.tokens_prefilled += n - start
        self.counters.prefill_s += prep.prefill_ms / 1e3
        self._prompt_n = n
        return prep

    # -- the invariant path ---------------------------------------------------------------------
    def _prepare_invariant(
        self, tokens: list[int], on_progress, boundaries, continues: bool, prep: Prepared, force=frozenset()
    ) -> int:
        n, s = len(tokens), self.session
        held = shared_prefix(s.tokens, tokens) if self._trusted else 0
        if self._deferred:  # the last reply's state, not captured yet: superseded if this prompt goes on from it
            if held < self._deferred:
                self.queue_capture(prep, 0)
            self._deferred = 0
        self._continues = continues or held > self._prompt_n  # it holds the last prompt and some of its reply
        warm = min(held, n - 1)
        found, use, self._stored = self._from_library(tokens)
        remote = self.remote.lookup(self, tokens, boundaries, max(use, warm)) if self.remote else None
        if remote is not None:  # a state another instance computed (app/serve/shared_cache.py), now stored here
            found, prep.remote_fetch_ms = remote
            use, self._stored = self.usable(found, found.n_tokens, n), max(self._stored, found.n_tokens)
        if force:  # a pinned prefix not stored yet must be computed here: reuse no further than its end
            cap = min(force)
            warm = min(warm, cap)
            if found is not None and use > cap:
                use = cap if self.usable(found, cap, n) >= cap else 0
        if found is not None and use > warm:
            start = self.graft_entry(found, prep)
            if remote is not None:
                prep.source = f"remote:{self.remote.name}"
            if use < start:
                s.trim(use)
                start = use
        elif warm:
            s.trim(warm)
            start = warm
            self.count_warm(prep, warm)
        else:
            s.reset(clear_data=False)
            start = 0
            self.counters.misses += 1
        self._trusted = False  # until the prompt is in
        last_block = ((n - 1) // self.block) * self.block
        # where the request names no boundary, its last whole block is the prefix others may share; a turn
        # that goes on from the last reply captures nothing on the way (its own reply's state, after it, will)
        points = [*boundaries] if boundaries else [last_block, *([n] if n < self.block else [])]
        if held > self._prompt_n:
            points = []
        forced = {p for p in force if start <= p <= n}
        self._must_store |= {tuple(tokens[:p]) for p in forced}
        keep = sorted(self._new_points(points, start, n) | forced)
        if keep and keep[0] == start:  # the context holds it already: captured before going on
            self.queue_capture(prep, 0)
        at = start
        for point in [p for p in keep if p > start] + ([n] if not keep or keep[-1] != n else []):
            base = at

            def progress(done: int, _total: int, base=base) -> None:
                if on_progress is not None:
                    on_progress(base + done, n)

            s.prefill(tokens[at:point], on_progress=progress)
            at = point
            if point in keep:
                self.queue_capture(prep, 0)
        return start

    def _new_points(self, points, start: int, n: int) -> set[int]:
        """The points worth a stored state: past what was reused and what the library holds."""
        if self.budget_bytes <= 0:
            return set()
        return {p for p in points if max(start, self._stored + 1, 1) <= p <= n}

    def usable(self, entry: Entry, shared: int, n: int) -> int:
        """How many of a stored state's tokens a prompt of `n` tokens sharing `shared` of them can use
        exactly: the whole state, or it trimmed back, where the trim keeps the bits: at most one token
        (its canonical form zeroed the cells the window drops, which an earlier position still sees) or
        anywhere in a state no longer than the window. Never the prompt's last token (its logits)."""
        m, use = entry.n_tokens, min(shared, n - 1)
        if use >= m - 1 or dead_cells(m, self.engine.window.n_swa) == 0:
            return use
        return 0

    def _serves(self, longer: tuple[int, ...], shorter: tuple[int, ...]) -> bool:
        """Whether a state of `longer` tokens serves every prompt a state of `shorter` would, as exactly."""
        m, k = len(longer), len(shorter)
        return m >= k and longer[:k] == shorter and (m - k <= 1 or dead_cells(m, self.engine.window.n_swa) == 0)

    def _from_library(self, tokens: list[int]) -> tuple[Entry | None, int, int]:
        """(the stored state to graft, how many of its tokens to keep, the longest stored state that is a
        whole prefix of the prompt): one query over the prompt's prefix keys."""
        n, best, use, stored = len(tokens), None, 0, 0
        for entry, shared in self.library.cache.cache_candidates(tokens, self.engine.fingerprint):
            if shared == entry.n_tokens:
                stored = max(stored, shared)
            u = self.usable(entry, shared, n)
            if u > use:
                best, use = entry, u
        return best, use, stored

    def after_reply(self) -> None:
        """The reply is decoded: on an invariant engine, where the request continued a conversation, the
        state of the prompt and its reply is to be stored (the next turn extends it), unless a stored
        state holds it already. It is captured in idle time (`store_one`), or before the next request
        changes the context; a next turn that goes on from it supersedes it (its own reply's state will
        hold it)."""
        s = self._session
        if not self.invariant or s is None or s.closed or self.budget_bytes <= 0:
            return
        if self._continues and s.n_past > self._prompt_n and s.n_past > self._stored:
            self._deferred = s.n_past

    # -- shared by both paths -------------------------------------------------------------------
    def graft_entry(self, entry: Entry, prep: Prepared) -> int:
        """Graft a stored cache state into the emptied context; returns how many tokens it holds."""
        s = self.session
        s.reset(clear_data=False)
        g = self.service.graft(s, entry)
        self.library.cache.touch_cache_state(entry.id)
        prep.source, prep.entry_id, prep.proof = "library", entry.id, entry.proof
        prep.tokens_restored, prep.graft_ms = g.n_tokens, g.total_ms
        self.counters.hits_library += 1
        self.counters.tokens_restored += g.n_tokens
        self.counters.graft_s += g.total_ms / 1e3
        return entry.n_tokens

    def count_warm(self, prep: Prepared, warm: int) -> None:
        prep.source = "warm"
        self.counters.hits_warm += 1
        self.counters.tokens_warm += warm

    def warm_point(self, tokens: list[int], points: list[int]) -> int:
        """The aligned path's reuse: the longest of `points` the warm context holds for `tokens`."""
        if self._session is None or self._session.closed or not self.held_points:
            return 0
        common = shared_prefix(self._session.tokens, tokens)
        ours = set(self.held_points)
        return max((p for p in points if p in ours and p <= common), default=0)

    def queue_capture(self, prep: Prepared, block: int) -> None:
        """Capture the state the context holds now (one copy), to store in idle time."""
        n = self.session.n_past
        self._queue(n, *self.session.capture(), block)
        prep.stores_queued.append(n)

    def _queue(self, point: int, data: bytearray, tokens: tuple[int, ...], block: int) -> None:
        if not block:  # a waiting state the new one serves exactly is not stored twice (deduplicated by prefix)
            self._pending = deque(
                p for p in self._pending if p[3] or p[2] in self._must_store or not self._serves(tokens, p[2])
            )
        self._pending.append((point, data, tokens, block))
        while len(self._pending) > MAX_PENDING:
            self._must_store.discard(self._pending.popleft()[2])
            self.counters.dropped += 1

    def store_one(self) -> bool:
        """Store the oldest captured state (idle time), capturing the deferred one first; False when none
        is waiting."""
        s = self._session
        if self._deferred and s is not None and not s.closed and s.n_past == self._deferred:
            self._queue(self._deferred, *s.capture(), 0)
        self._deferred = 0
        if not self._pending:
            return False
        _, data, tokens, block = self._pending.popleft()
        self._must_store.discard(tokens)
        snap = snapshot_of(self.engine, data, tokens)
        schedule = schedule_of(self.engine)
        calls = aligned_calls(len(tokens), block) if block else []
        if len(calls) > 1:  # decoded in aligned blocks: the calls after the first are part of the bits
            schedule["then"] = calls[1:]
        entry, created = self.library.cache.add_cache_state(
            block,
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
        if created and self.remote is not None and self.invariant:
            self.remote.offer(self.library, entry)  # shared with the fleet (queued; never waited for)
        self.evict()
        return True

    def evict(self) -> int:
        """Remove least recently used cache states past the budget (after each store, and at start)."""
        removed, _ = self.library.cache.evict_cache(self.budget_bytes)
        self.counters.evicted += removed
        self.last_size = self.library.cache.cache_bytes()
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
        self._deferred = 0
        self._must_store = {t for t in self._must_store if any(p[2] == t for p in self._pending)}
        self._trusted = False
        self.held_points = []
