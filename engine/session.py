"""A Session owns one llama.cpp context: prefill, logits, decoding (engine/decoding.py), trim, snapshot and graft.

Threading rule: the thread that creates a Session owns it. Every public method checks this and
raises ThreadOwnershipError from any other thread; llama.cpp contexts are not thread-safe, and
kvgraft never shares one. (The app runs all llama.cpp work on one worker thread.)

Prefill chunk schedule: tokens are decoded in consecutive chunks of n_batch tokens (the last
chunk may be shorter); llama.cpp splits each chunk into n_ubatch micro-batches. Logits are
requested for the last token of the last chunk only.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from . import decoding, scoring
from .bindings import llama
from .compaction import canonicalize
from .decoding import Generation, TokenFn
from .errors import (
    DecodeError,
    EngineError,
    FingerprintMismatch,
    SnapshotError,
    ThreadOwnershipError,
)
from .sampling import Sampler
from .state import parse_state, seq_payload, write_seq_header

log = logging.getLogger(__name__)

# The one cancel protocol of kvgraft (errors.Cancelled): a callback stops the work by raising Cancelled.
# on_progress(done_tokens, total_tokens), after each chunk: a Cancelled it raises ends the prefill
ProgressFn = Callable[[int, int], None]


def tokens_sha256(tokens: Sequence[int]) -> str:
    """SHA-256 of the token ids as little-endian int32 (the contract for `tokens_sha256` fields)."""
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    """Whole-state bytes of a context holding `tokens` at positions 0..n-1, plus what made it.

    A snapshot made by `Session.snapshot` is canonical (engine/compaction.py): the K and V of
    dead sliding-window cells are zero, and `elided` lists those zero byte ranges for the blob
    container. `sha256` is the content address of `data`, taken when the snapshot was made (or
    read from the library's index); a graft checks the bytes against it unless the caller did.
    """

    data: bytes | bytearray
    tokens: tuple[int, ...]
    fingerprint: str
    sha256: str
    elided: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.uint64), compare=False)

    @classmethod
    def of(cls, data, tokens, fingerprint: str, elided=None) -> "Snapshot":
        snap = cls(data, tuple(int(t) for t in tokens), fingerprint, hashlib.sha256(data).hexdigest())
        if elided is not None:
            object.__setattr__(snap, "elided", elided)
        return snap

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class GraftResult:
    n_tokens: int
    validate_ms: float
    restore_ms: float

    @property
    def total_ms(self) -> float:
        return self.validate_ms + self.restore_ms


class Session:
    def __init__(self, engine, eval_callback=None) -> None:
        """`eval_callback`: llama.cpp's per-op callback (a ggml_backend_sched_eval_callback), for
        engine/op_trace.py; the caller keeps it alive while the session is open."""
        self._owner = threading.get_ident()
        self._owner_thread = threading.current_thread()
        self.engine = engine
        cfg = engine.config
        model = engine.model
        params = llama.llama_context_default_params()
        params.n_ctx = cfg.n_ctx
        params.n_batch = cfg.n_batch
        params.n_ubatch = cfg.n_ubatch
        params.n_seq_max = 1
        params.n_threads = cfg.n_threads
        params.n_threads_batch = cfg.n_threads
        params.flash_attn_type = 1 if cfg.flash_attn else 0
        params.type_k = engine.kv_type_ids[0]
        params.type_v = engine.kv_type_ids[1]
        params.swa_full = cfg.swa_full
        params.no_perf = True
        if eval_callback is not None:
            params.cb_eval = eval_callback
        ctx = llama.llama_init_from_model(model.ptr, params)
        if not ctx:
            raise EngineError(f"llama.cpp could not create a context (n_ctx={cfg.n_ctx})")
        self._ctx = ctx
        model._session_opened()
        self._mem = llama.llama_get_memory(ctx)
        self._batch = llama.llama_batch_init(cfg.n_batch, 0, 1)
        n = cfg.n_batch
        self._b_tokens = np.ctypeslib.as_array(self._batch.token, shape=(n,))
        self._b_pos = np.ctypeslib.as_array(self._batch.pos, shape=(n,))
        self._b_nseq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n,))
        self._b_logits = np.ctypeslib.as_array(self._batch.logits, shape=(n,))
        self._b_nseq[:] = 1
        for i in range(n):
            self._batch.seq_id[i][0] = 0
        self.tokens: list[int] = []
        self._has_logits = False

    # -- plumbing ------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._ctx is None:
            raise EngineError("session is closed")
        if threading.get_ident() != self._owner:
            raise ThreadOwnershipError("a Session may only be used by the thread that created it")

    @property
    def closed(self) -> bool:
        return self._ctx is None

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    @property
    def n_ctx(self) -> int:
        return self.engine.config.n_ctx

    def close(self) -> None:
        if self._ctx is None:
            return
        if threading.get_ident() != self._owner and self._owner_thread.is_alive():
            raise ThreadOwnershipError("a Session may only be closed by the thread that created it (or after it ended)")
        llama.llama_batch_free(self._batch)
        llama.llama_free(self._ctx)
        self._ctx = None
        self.engine.model._session_closed()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset(self, clear_data: bool = True) -> None:
        """Empty the KV cache; the context can then take a new prefill or a graft.

        `clear_data=False` forgets the cells without zeroing their bytes (a memset of the whole
        cache, ~14 ms at n_ctx 8192): the old bytes are never read unmasked, since every cell a
        later decode uses is written first and empty cells are masked (tests/test_warm_context.py
        checks that the bits are the same as a new context's)."""
        self._check()
        llama.llama_memory_clear(self._mem, clear_data)
        self.tokens = []
        self._has_logits = False

    # -- prefill and logits --------------------------------------------------------------------
    def prefill(self, tokens: Sequence[int], on_progress: ProgressFn | None = None) -> None:
        """Decode `tokens` after what the context holds, in chunks of n_batch (see module doc).

        `on_progress(done, total)` hears of each chunk once it is decoded; a `Cancelled` it raises
        propagates at once. The context then holds what it held before plus the chunks decoded so far
        (`tokens` says which), consistent and usable: `reset()` it to reuse it, or close it
        (LibraryService.session closes its warm context on any exception)."""
        self._check()
        tokens = self._fitting(tokens)
        if not tokens:
            return
        n_batch = self.engine.config.n_batch
        total = len(tokens)
        for start in range(0, total, n_batch):
            chunk = tokens[start : start + n_batch]
            last = start + len(chunk) == total
            self._decode(chunk, want_last_logits=last)
            if on_progress is not None:
                on_progress(start + len(chunk), total)  # may raise Cancelled: it goes to the caller

    def prefill_scored(self, tokens: Sequence[int], first: int = 1, end: int | None = None) -> np.ndarray:
        """`prefill` that also returns the log-probability of tokens[first:end], each given all before
        it (engine/scoring.py)."""
        self._check()
        return scoring.prefill_scored(self, tokens, first, end)

    def _fitting(self, tokens: Sequence[int]) -> list[int]:
        """`tokens` as ints, checked against the vocabulary and the room left in the context."""
        tokens = [int(t) for t in tokens]
        n_vocab = self.engine.model.info.n_vocab
        for t in tokens:
            if not 0 <= t < n_vocab:
                raise EngineError(f"token id {t} is outside the vocabulary (0..{n_vocab - 1})")
        if self.n_past + len(tokens) > self.n_ctx:
            raise DecodeError(f"context full: {self.n_past} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
        return tokens

    def _decode(self, chunk: list[int], want_last_logits: bool, logit_rows: slice = slice(0, 0)) -> None:
        n = len(chunk)
        p0 = self.n_past
        self._b_tokens[:n] = chunk
        self._b_pos[:n] = np.arange(p0, p0 + n, dtype=np.int32)
        self._b_logits[:n] = 0
        self._b_logits[logit_rows] = 1  # rows whose logits the caller reads (llama_get_logits_ith)
        if want_last_logits:
            self._b_logits[n - 1] = 1
        self._batch.n_tokens = n
        rc = llama.llama_decode(self._ctx, self._batch)
        if rc != 0:
            # a failed decode may leave partial cells behind: drop everything past n_past
            llama.llama_memory_seq_rm(self._mem, 0, p0, -1)
            raise DecodeError(f"llama_decode failed with code {rc} at position {p0} ({n} tokens)")
        self.tokens.extend(chunk)
        self._has_logits = want_last_logits

    def logits(self) -> np.ndarray:
        """float32 logits after the last decoded token (a copy)."""
        self._check()
        if not self._has_logits:
            raise EngineError("no logits: decode at least one token after a graft or reset")
        return scoring.logits_row(self, -1).copy()

    # -- generation ----------------------------------------------------------------------------
    def generate(
        self,
        max_tokens: int,
        stop: Sequence[str] = (),
        on_token: TokenFn | None = None,
        stop_at_eog: bool = True,
        sampler: Sampler | None = None,
        top_logprobs: int | None = None,
        lookup: int | None = None,
        constraint=None,
    ) -> Generation:
        """Decode from the current logits through the one decode loop (engine/decoding.py): greedy
        (argmax, lowest id on ties) unless a `sampler` says otherwise. Stops at `max_tokens`, an
        end-of-generation token (unless `stop_at_eog` is False), the first occurrence of any string in
        `stop` (the text returned is cut before it), `on_token` raising `Cancelled` (stop_reason
        "callback"), or a full context. `lookup`: tokens drafted per verify call in greedy decoding
        (engine/lookup_decode.py), the engine's setting when None, 0 for one token per call. `constraint`:
        a grammar's walk (engine/constraint.py) that masks every choice."""
        self._check()
        k = self.engine.config.lookup if lookup is None else lookup
        return decoding.generate(self, max_tokens, stop, on_token, stop_at_eog, sampler, top_logprobs, k, constraint)

    def decode_one(self, token: int) -> None:
        """Decode one chosen token after what the context holds (the decode loop's step)."""
        self._check()
        self._decode([int(token)], want_last_logits=True)

    def trim(self, n: int) -> None:
        """Keep the first `n` tokens' cells and forget the rest, as if only those had been decoded.

        Only the cells are kept; the logits are gone (decode at least one token next). Whether the
        cells are the bits a fresh run of those `n` tokens makes depends on the schedule they were
        decoded in: a caller trims back only to a point its schedule shares with the next request
        (app/serve/schedule.py; tests/test_prompt_cache.py checks trim-then-continue against cold)."""
        self._check()
        if not 0 <= n <= self.n_past:
            raise EngineError(f"cannot trim to {n} tokens: the context holds {self.n_past}")
        if n == self.n_past:
            self._has_logits = self._has_logits and n > 0
            return
        if not llama.llama_memory_seq_rm(self._mem, 0, n, -1):
            raise EngineError(f"llama.cpp could not remove the cells past position {n}")
        del self.tokens[n:]
        self._has_logits = False

    # -- snapshot and graft --------------------------------------------------------------------
    def state_bytes(self) -> bytes:
        """The whole-state bytes (`llama_state_get_data`) of what this context holds, unchecked and
        as llama.cpp wrote them (not canonical: see `snapshot`)."""
        return bytes(self._state_buffer())

    def _state_buffer(self) -> bytearray:
        self._check()
        if not self.tokens:
            raise EngineError("nothing to snapshot: the context is empty")
        size = llama.llama_state_get_size(self._ctx)
        buf = bytearray(size)
        written = llama.llama_state_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(buf), size)
        if written != size:
            raise EngineError(f"llama_state_get_data wrote {written} bytes, expected {size}")
        return buf

    def snapshot(self, canonical: bool = True) -> Snapshot:
        """A checked Snapshot of what this context holds (whole-state bytes + tokens + fingerprint).

        Canonical by default: dead sliding-window cells zeroed (engine/compaction.py), which a
        graft reproduces bit for bit. `canonical=False` keeps llama.cpp's bytes as written (the
        content address blobs had before compaction)."""
        data, elided = self.canonical_state(canonical)
        return Snapshot.of(data, self.tokens, self.engine.fingerprint, elided)

    def canonical_state(self, canonical: bool = True):
        """(whole-state bytes, elided zero ranges) of what this context holds, checked against its
        layout; canonical unless `canonical=False` (then the ranges are None)."""
        return _checked_state(self.engine, self._state_buffer(), len(self.tokens), canonical)

    def capture(self) -> tuple[bytearray, tuple[int, ...]]:
        """The whole-state bytes as llama.cpp wrote them and the tokens they hold: one copy now, the
        checks, canonical form and hash later (`snapshot_of`, e.g. in the server's idle time)."""
        return self._state_buffer(), tuple(self.tokens)

    def graft(self, snapshot: Snapshot, bytes_verified: bool = False) -> GraftResult:
        """Restore `snapshot` into this (empty) context at its own positions, byte-exactly.

        The bytes are checked against `snapshot.sha256` first, unless the caller passes
        `bytes_verified=True` because it has just checked them itself (the library's read path).

        The whole-state payload goes through the per-sequence restore path, which places the
        cells with the normal slot search and leaves the cache head after them, exactly as a
        fresh prefill does. The plain whole-state restore resets the head to 0 and is not exact
        past the sliding window (docs/exact-graft.md, tests/test_exactness.py).
        """
        self._check()
        if snapshot.fingerprint != self.engine.fingerprint:
            raise FingerprintMismatch(
                f"snapshot was made under engine fingerprint {snapshot.fingerprint[:16]}..., this engine is "
                f"{self.engine.fingerprint[:16]}...; rebuild it from its text on this engine"
            )
        if not bytes_verified and hashlib.sha256(snapshot.data).hexdigest() != snapshot.sha256:
            raise SnapshotError(
                f"snapshot bytes do not match their SHA-256 {snapshot.sha256[:16]}...: damaged or tampered"
            )
        return self.graft_bytes(snapshot.data, snapshot.tokens)

    def graft_bytes(self, data, tokens: Sequence[int]) -> GraftResult:
        """Graft raw whole-state bytes whose fingerprint the caller has already checked (one copy)."""
        t0 = time.perf_counter()
        parsed = self._validate_graft(data, tokens)
        payload = seq_payload(data, parsed)
        return self._restore(payload, 0, parsed, tokens, t0)

    def graft_buffer(self, buf, tokens: Sequence[int]) -> GraftResult:
        """Graft whole-state bytes the caller owns and has integrity-checked, without copying them.

        The buffer is consumed: once its layout is validated, the 8-byte per-sequence header is
        written over the end of the whole-state header in place, and llama.cpp reads the payload
        straight from the buffer (engine/state.py). Falls back to one copy when the architecture
        name is shorter than 4 bytes (no room for the header).
        """
        if memoryview(buf).readonly:
            raise TypeError("graft_buffer needs a writable buffer (bytearray or memoryview of one) it may overwrite")
        t0 = time.perf_counter()
        parsed = self._validate_graft(buf, tokens)
        if parsed.header_size < 8:
            return self._restore(seq_payload(buf, parsed), 0, parsed, tokens, t0)
        return self._restore(buf, write_seq_header(buf, parsed), parsed, tokens, t0)

    def _validate_graft(self, data, tokens: Sequence[int]):
        self._check()
        if self.tokens:
            raise EngineError("graft needs an empty context: call reset() first")
        parsed = parse_state(data, self.engine.layout, max_cells=self.n_ctx)
        if parsed.n_tokens != len(tokens):
            raise SnapshotError(f"snapshot holds {parsed.n_tokens} cells but {len(tokens)} token ids were given")
        n_vocab = self.engine.model.info.n_vocab
        if any(not 0 <= int(t) < n_vocab for t in tokens):
            raise SnapshotError("snapshot token ids fall outside the model's vocabulary")
        return parsed

    def _restore(self, buf, start: int, parsed, tokens: Sequence[int], t0: float) -> GraftResult:
        """Hand buf[start:] (per-sequence header + payload) to llama_state_seq_set_data."""
        n = len(buf) - start
        t1 = time.perf_counter()
        read = llama.llama_state_seq_set_data(self._ctx, (ctypes.c_uint8 * n).from_buffer(buf, start), n, 0)
        t2 = time.perf_counter()
        if read != n:
            llama.llama_memory_clear(self._mem, True)
            raise SnapshotError(f"llama.cpp refused the snapshot (read {read} of {n} bytes)")
        self.tokens = [int(t) for t in tokens]
        self._has_logits = False
        return GraftResult(parsed.n_tokens, (t1 - t0) * 1e3, (t2 - t1) * 1e3)


def snapshot_of(engine, data: bytearray, tokens: Sequence[int]) -> Snapshot:
    """A canonical, checked Snapshot of bytes `Session.capture` took on `engine` (consumes `data`)."""
    data, elided = _checked_state(engine, data, len(tokens), True)
    return Snapshot.of(data, tokens, engine.fingerprint, elided)


def _checked_state(engine, data: bytearray, n_tokens: int, canonical: bool):
    parsed = parse_state(data, engine.layout, max_cells=engine.config.n_ctx)
    if parsed.n_tokens != n_tokens:
        raise EngineError(f"snapshot holds {parsed.n_tokens} cells for {n_tokens} tokens")
    return data, (canonicalize(data, parsed, engine.window) if canonical else None)
