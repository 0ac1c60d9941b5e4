"""The one engine thread: it owns llama.cpp and the library connection; requests wait in a bounded FIFO.

The HTTP side (app/serve/http.py) turns each request into a `Job` and `submit`s it; a full queue is
refused at once (`QueueFull`: a 429). The thread prepares the prompt through the prompt cache, decodes
through the one decode loop, and sends what happens back through `job.emit` (called on this thread;
the HTTP side makes it thread-safe). A job whose client went away (`job.cancel`) stops at the next
call or token and frees the engine. The thread stores the states the cache captured while idle (no
request for IDLE_S), one per request while half of MAX_PENDING wait, and after a long prefill one per
LONG_PREFILL tokens it prefilled (a small share of the request's time), so a client that sends its next
request at once does not wait for a store and a steady stream of requests does not starve them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kvgraft.app.answer.stream import TextStream
from kvgraft.app.serve.prompt_cache import MAX_PENDING, ContextLengthExceeded, PromptCache
from kvgraft.app.service import LibraryService
from kvgraft.engine.errors import Cancelled, EngineError
from kvgraft.engine.sampling import Sampler, SamplingParams, TokenLogprob, token_logprob
from kvgraft.library.errors import LibraryError

log = logging.getLogger(__name__)

_STOP = object()
IDLE_S = 0.3  # no request for this long: the engine thread stores a captured state
LONG_PREFILL = 256  # a store (~0.1 s) per this many tokens a request prefilled is a small share of it: at once


class QueueFull(Exception):
    """The request queue is full: try again later (a 429 with Retry-After)."""


@dataclass
class Job:
    tokens: list[int]
    max_tokens: int | None  # None: up to the context's end
    emit: Callable[
        [tuple], None
    ]  # ("prepared", Prepared) ("text", piece, [TokenLogprob]) ("done", dict) ("error", ...)
    stops: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    top_logprobs: int | None = None
    strip: bool = False  # a chat reply is shown stripped; a completion is the raw continuation
    deadline: float = float("inf")  # time.monotonic() past which decoding ends (finish_reason "length")
    cancel: threading.Event = field(default_factory=threading.Event)
    boundaries: tuple[int, ...] = ()  # where the prompt's messages end (token counts): states worth storing
    continues: bool = False  # the prompt holds an earlier reply (a chat's assistant message)
    grammar: object = None  # engine.constraint.Grammar the answer is held to (tools, response_format)
    pins: tuple = ()  # (name, length, ttl_s): prefixes a client asked to keep (library/cache_pins.py)


class JobQueue:
    """The bounded FIFO between the HTTP side and whichever thread runs the jobs (this module's
    EngineWorker, or the window's engine thread through app/serve/embedded.py)."""

    def __init__(self, queue_size: int) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=queue_size)
        self.busy = False

    @property
    def depth(self) -> int:
        return self._q.qsize() + int(self.busy)

    def submit(self, job: Job) -> None:
        try:
            self._q.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"{self._q.maxsize} requests are waiting") from None

    def refuse_waiting(self) -> None:
        """Answer every queued job "shutting down"."""
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            if job is not _STOP:
                job.emit(("error", "shutting_down", "the server is shutting down"))


class EngineWorker(JobQueue):
    def __init__(
        self,
        open_service: Callable[[], LibraryService],
        budget_bytes: int,
        block: int,
        queue_size: int = 16,
    ) -> None:
        super().__init__(queue_size)
        self._open_service = open_service
        self._budget, self._block = budget_bytes, block
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.service: LibraryService | None = None
        self.cache: PromptCache | None = None
        self.stopped_with: dict = {}
        self._thread = threading.Thread(target=self._run, name="kvgraft-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, store_pending: bool = True, timeout: float | None = None) -> dict:
        """Finish the job in progress, refuse the queued ones, store (or drop) the captured states."""
        self._store_on_stop = store_pending
        self.refuse_waiting()
        self._q.put(_STOP)
        self._thread.join(timeout)
        return self.stopped_with

    # -- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.service = self._open_service()
            self.cache = PromptCache(self.service, self._budget, self._block)
            self.cache.warm_up()  # the context is made now, not in the first request's time to first token
        except BaseException as exc:  # noqa: BLE001 (reported by /health and at start, never swallowed)
            self.load_error = exc
            self.ready.set()
            return
        self.ready.set()
        cache = self.cache
        while True:
            try:
                job = self._q.get(timeout=IDLE_S) if cache.pending else self._q.get()
            except queue.Empty:  # idle: store what waits while no request comes
                while cache.pending and self._q.empty():
                    self._store_one()
                continue
            if job is _STOP:
                break
            self.busy = True
            try:
                self._serve(job)
            except Exception as exc:  # noqa: BLE001 (one request's failure must not stop the engine thread)
                log.exception("a request failed")
                cache.close_session()
                job.emit(("error", "engine_error", f"internal error ({type(exc).__name__})"))
            finally:
                self.busy = False
            # the response is out: a client that sends its next request at once must not wait for a store,
            # so the captured states are stored once no request came for IDLE_S (above), or one per request
            # while half the queue of captures waits (a steady stream of requests must not starve them), and
            # after a long prefill one per LONG_PREFILL tokens it took
            for _ in range(max(int(cache.pending >= MAX_PENDING // 2), cache.last_prefilled // LONG_PREFILL)):
                if not self._store_one():
                    break
        stored = cache.flush() if getattr(self, "_store_on_stop", True) else 0
        dropped = cache.pending
        self.stopped_with = {"stored": stored, "dropped": dropped}
        cache.close_session()
        self.service.close()
        self.service.engine.close()
        self.service.library.close()

    def _store_one(self) -> bool:
        return store_one(self.cache)

    def _serve(self, job: Job) -> None:
        serve_job(self.cache, job)


def store_one(cache: PromptCache) -> bool:
    """Store one captured state; False when none is pending."""
    try:
        return cache.store_one()
    except (EngineError, LibraryError, OSError) as exc:  # a cache store is an optimisation: log, go on
        log.warning("an automatic state was not stored: %s", exc)
        return True


def serve_job(cache: PromptCache, job: Job) -> None:
    """Prepare the job's prompt through the cache, decode through the one decode loop, emit what happens
    (on the calling thread: the one engine thread)."""
    if job.cancel.is_set():
        return

    def check(*_args) -> None:
        if job.cancel.is_set():
            raise Cancelled("the client went away")
        if time.monotonic() > job.deadline:
            raise Cancelled("the request's time limit")

    try:
        prep = cache.prepare(
            job.tokens, on_progress=check, boundaries=job.boundaries, continues=job.continues, pins=job.pins
        )
    except ContextLengthExceeded as exc:
        job.emit(("error", "context_length_exceeded", str(exc)))
        return
    except Cancelled:
        job.emit(("error", "cancelled", "cancelled"))
        return
    except (EngineError, LibraryError, OSError) as exc:
        log.warning("a request failed while its prompt was prepared: %s", exc)
        job.emit(("error", "engine_error", str(exc)))
        return
    job.emit(("prepared", prep))
    session = cache.session
    room = session.n_ctx - session.n_past
    max_tokens = room if job.max_tokens is None else min(job.max_tokens, room)
    lps: list[TokenLogprob] = []
    sent = [0]

    def on_text(piece: str) -> None:
        job.emit(("text", piece, lps[sent[0] :]))
        sent[0] = len(lps)
        check()

    stream = TextStream(session.engine.model, on_text, job.stops, strip=job.strip)

    def on_token(tok: int, piece: str) -> None:
        if job.top_logprobs is not None:
            lps.append(token_logprob(session.logits(), tok, job.top_logprobs))
        stream.on_token(tok, piece)
        check()

    try:
        # drafts come from the request's own tokens (the session holds its prompt), so a request decodes in the
        # same calls cold, warm or grafted; with logprobs asked for, one token per call (on_token reads the logits)
        lookup = 0 if job.top_logprobs is not None else None
        constraint = job.grammar.matcher() if job.grammar is not None else None
        gen = session.generate(
            max_tokens,
            stop=job.stops,
            on_token=on_token,
            sampler=Sampler(job.sampling),
            lookup=lookup,
            constraint=constraint,
        )
    except (EngineError, LibraryError) as exc:
        cache.close_session()
        log.warning("a request failed while decoding: %s", exc)
        job.emit(("error", "engine_error", str(exc)))
        return
    text = gen.text.strip() if job.strip else gen.text
    if job.cancel.is_set():
        return
    stream.finish(text)
    timed_out = gen.stop_reason == "callback"
    job.emit(
        (
            "done",
            {
                "text": text,
                "completion_tokens": len(gen.tokens),
                "stop_reason": "max_tokens" if timed_out else gen.stop_reason,
                "decode_ms": gen.seconds * 1e3,
                "logprobs": lps[: len(gen.tokens)],
                "tail_logprobs": lps[sent[0] :],
                "constraint": gen.constraint,
            },
        )
    )
    try:  # the response is out: the prompt and its reply, for the conversation's next turn
        cache.after_reply()
    except EngineError as exc:  # a cache store is an optimisation: log, go on
        log.warning("the state after a reply was not captured: %s", exc)
