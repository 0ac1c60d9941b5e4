"""The one engine thread of `kvgraft serve`: it owns llama.cpp and the library connection; requests wait in
a bounded FIFO (app/core/jobs.py `JobThread`, the one job runner).

The HTTP side (app/serve/http.py) turns each request into a `ServeJob` and `submit`s it; a full queue is
refused at once (`QueueFull`: a 429). The thread prepares the prompt through the prompt cache, decodes
through the one decode loop, and reports through `job.emit` in the one event shape (app/core/jobs.py):
`Started`, then `Yielded(Prepared)` once the prompt is ready, `Yielded(Text)` per piece of the reply,
and one of `Returned(done dict)`, `Errored(code, message)`, `Cancelled` (called on this thread; the HTTP
side makes it thread-safe). A job whose client went away (`job.cancel`) stops at the next call or token
and frees the engine. The thread stores the states the cache captured while idle (no request for
IDLE_S), one per request while half of MAX_PENDING wait, and after a long prefill one per LONG_PREFILL
tokens it prefilled (a small share of the request's time), so a client that sends its next request at
once does not wait for a store and a steady stream of requests does not starve them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kvgraft.app.answer.stream import TextStream
from kvgraft.app.core.jobs import Cancelled as JobCancelled
from kvgraft.app.core.jobs import Errored, Event, JobThread, Returned, Yielded, run_job
from kvgraft.app.serve import tools
from kvgraft.app.serve.prompt_cache import MAX_PENDING, PromptCache
from kvgraft.app.service import LibraryService
from kvgraft.engine.constraint import Grammar
from kvgraft.engine.errors import Cancelled, EngineError
from kvgraft.engine.sampling import Sampler, SamplingParams, TokenLogprob, token_logprob
from kvgraft.library.errors import LibraryError

log = logging.getLogger(__name__)

IDLE_S = 0.3  # no request for this long: the engine thread stores a captured state
LONG_PREFILL = 256  # a store (~0.1 s) per this many tokens a request prefilled is a small share of it: at once


@dataclass(frozen=True)
class Text:
    """A piece of the reply as it is decoded, with the logprobs of the tokens it holds (when asked)."""

    piece: str
    logprobs: list[TokenLogprob]


@dataclass
class ServeJob:
    """One request for the engine thread."""

    tokens: list[int]
    max_tokens: int | None  # None: up to the context's end
    emit: Callable[[Event], None]
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
    name: str = "request"
    path: str = ""  # the endpoint that asked (for the request's log line)
    tools: object = None  # app.serve.tools.ToolSpec: how the answer is parsed into calls
    # `tools.call_key`s of the calls the conversation holds with their results (tool_choice auto): an answer
    # that only repeats them is decoded again as text (docs/agents.md, "What ends a loop")
    answered: frozenset = frozenset()


def refuse(jobs: list) -> None:
    """Answer jobs that will not run "shutting down"."""
    for job in jobs:
        job.emit(Errored(job.name, "shutting_down", "the server is shutting down"))


class EngineWorker(JobThread):
    idle_s = IDLE_S

    def __init__(
        self,
        open_service: Callable[[], LibraryService],
        budget_bytes: int,
        block: int,
        queue_size: int = 16,
        shared: Callable[[LibraryService], object] | None = None,
        on_request: Callable[[dict], None] | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        super().__init__("kvgraft-engine", queue_size)
        self._open_service = open_service
        self._shared = shared  # makes the fleet's shared cache (app/serve/shared_cache.py), `serve --remote`
        self._budget, self._block = budget_bytes, block
        self._on_request, self._on_ready = on_request, on_ready  # told on this thread: keep them quick
        self.service: LibraryService | None = None
        self.cache: PromptCache | None = None
        self.stopped_with: dict = {}
        self._store_on_stop = True

    def stop(self, store_pending: bool = True, timeout: float | None = None) -> dict:
        """Finish the job in progress, refuse the queued ones, store (or drop) the captured states."""
        self._store_on_stop = store_pending
        refuse(self.waiting())
        super().stop(timeout)
        return self.stopped_with

    # -- the engine thread (app/core/jobs.py JobThread's hooks) ------------------------------------
    def setup(self) -> None:
        self.service = self._open_service()
        self.cache = PromptCache(self.service, self._budget, self._block)
        if self._shared is not None:
            self.cache.remote = self._shared(self.service)
        self.cache.warm_up()  # the context is made now, not in the first request's time to first token
        if self._on_ready is not None:
            self._on_ready()

    def run(self, job: ServeJob) -> None:
        record = serve_recorded(self.cache, job)
        if self._on_request is not None:
            self._on_request(record)

    def has_idle_work(self) -> bool:
        return bool(self.cache.pending)

    def idle(self) -> None:
        store_one(self.cache)

    def after(self) -> None:
        # the response is out: a client that sends its next request at once must not wait for a store, so
        # the captured states are stored once no request came for IDLE_S (idle), or one per request while
        # half the queue of captures waits (a steady stream of requests must not starve them), and after a
        # long prefill one per LONG_PREFILL tokens it took
        cache = self.cache
        for _ in range(max(int(cache.pending >= MAX_PENDING // 2), cache.last_prefilled // LONG_PREFILL)):
            if not store_one(cache):
                break

    def teardown(self) -> None:
        cache = self.cache
        stored = cache.flush() if self._store_on_stop else 0
        self.stopped_with = {"stored": stored, "dropped": cache.pending}
        if cache.remote is not None:
            cache.remote.close()  # the uploads queued finish first (bounded)
        cache.close_session()
        self.service.close()
        self.service.engine.close()
        self.service.library.close()


def store_one(cache: PromptCache) -> bool:
    """Store one captured state; False when none is pending."""
    try:
        return cache.store_one()
    except (EngineError, LibraryError, OSError) as exc:  # a cache store is an optimisation: log, go on
        log.warning("an automatic state was not stored: %s", exc)
        return True


def serve_recorded(cache: PromptCache, job: ServeJob) -> dict:
    """`serve_job`, and what it did as one record: {path, status ("ok", an error's code, "cancelled"),
    prompt_tokens, cached_tokens, source, entry_id, completion_tokens, ms}."""
    seen: dict = {"status": "cancelled"}
    emit = job.emit

    def recorded(event: Event) -> None:
        if isinstance(event, Yielded) and not isinstance(event.value, Text):
            seen["prepared"] = event.value
        elif isinstance(event, Returned):
            seen.update(status="ok", completion_tokens=event.value["completion_tokens"])
            seen["guarded"] = bool(event.value.get("guarded"))
        elif isinstance(event, Errored):
            seen["status"] = event.code
        elif isinstance(event, JobCancelled):
            seen["status"] = "cancelled"
        emit(event)

    job.emit = recorded
    t0 = time.perf_counter()
    try:
        serve_job(cache, job)
    finally:
        job.emit = emit
    prep = seen.get("prepared")
    return {
        "path": job.path,
        "status": seen["status"],
        "prompt_tokens": prep.prompt_tokens if prep else len(job.tokens),
        "cached_tokens": prep.cached_tokens if prep else 0,
        "source": prep.source if prep else None,
        "entry_id": prep.entry_id if prep else None,
        "completion_tokens": seen.get("completion_tokens", 0),
        "ms": round((time.perf_counter() - t0) * 1e3, 1),
        "guarded": seen.get("guarded", False),  # a repeated call was answered as text instead
    }


def request_line(r: dict) -> str:
    """A request's log line: `POST /v1/chat/completions ok: prompt 812 tokens (790 cached), reply 24, 1234 ms`."""
    return (
        f"POST {r['path'] or '(request)'} {r['status']}: prompt {r['prompt_tokens']} tokens "
        f"({r['cached_tokens']} cached), reply {r['completion_tokens']}, {r['ms']:.0f} ms"
        + ("; a call already answered was asked again: answered as text" if r.get("guarded") else "")
    )


def serve_job(cache: PromptCache, job: ServeJob) -> None:
    """Prepare the job's prompt through the cache, decode through the one decode loop, and report it in the
    one event shape (app/core/jobs.py `run_job`), on the calling thread: the one engine thread."""
    if job.cancel.is_set():
        return

    def run() -> dict:
        try:
            return _decode(cache, job)
        except Cancelled:
            raise
        except Exception:
            cache.close_session()  # whatever failed, the next request starts from a clean session
            raise

    if isinstance(run_job(job.name, run, job.emit), Returned):
        try:  # the response is out: the prompt and its reply, for the conversation's next turn
            cache.after_reply()
        except EngineError as exc:  # a cache store is an optimisation: log, go on
            log.warning("the state after a reply was not captured: %s", exc)


def _decode(cache: PromptCache, job: ServeJob) -> dict:
    def check(*_args) -> None:
        if job.cancel.is_set():
            raise Cancelled("the client went away")
        if time.monotonic() > job.deadline:
            raise Cancelled("the request's time limit")

    prep = cache.prepare(
        job.tokens, on_progress=check, boundaries=job.boundaries, continues=job.continues, pins=job.pins
    )
    job.emit(Yielded(job.name, prep))
    session = cache.session
    prompt_n = session.n_past
    room = session.n_ctx - prompt_n
    max_tokens = room if job.max_tokens is None else min(job.max_tokens, room)
    # the guard decodes the prompt's last token again, which moves no bits only on a batch-invariant engine
    guard = bool(job.answered) and session.engine.batch_invariant and prompt_n > 1
    done, repeat = _answer(session, job, max_tokens, job.grammar, check, guarded=guard)
    if repeat:  # the answer only repeats calls whose results the conversation holds: answered from them instead
        log.info("a call already answered was asked again: the reply is decoded as text")
        last = session.tokens[prompt_n - 1]
        session.trim(prompt_n - 1)
        session.decode_one(last)  # the prompt's last logits again, for the second answer
        grammar = Grammar.lark(session.engine.model, tools.NO_CALL)
        done, _ = _answer(session, job, max_tokens, grammar, check, guarded=False)
        done["guarded"] = True
    return done


def _answer(session, job: ServeJob, max_tokens: int, grammar, check, guarded: bool) -> tuple[dict, bool]:
    """Decode one answer, its pieces streamed, and whether it only repeats answered calls (`guarded`
    only). While `guarded` and the answer may still be a call, its pieces wait: a repeat's are dropped
    (the caller decodes it again), any other answer's go out."""
    lps: list[TokenLogprob] = []
    sent = [0]
    held: list | None = [] if guarded else None

    def on_text(piece: str) -> None:
        nonlocal held
        event = Yielded(job.name, Text(piece, lps[sent[0] :]))
        sent[0] = len(lps)
        if held is not None:
            held.append(event)
            if tools.held_back(stream.shown) > 0:  # text before any call: not a repeat, shown from here
                for e in held:
                    job.emit(e)
                held = None
        else:
            job.emit(event)
        check()

    stream = TextStream(session.engine.model, on_text, job.stops, strip=job.strip)

    def on_token(tok: int, piece: str) -> None:
        if job.top_logprobs is not None:
            lps.append(token_logprob(session.logits(), tok, job.top_logprobs))
        stream.on_token(tok, piece)
        check()

    # drafts come from the request's own tokens (the session holds its prompt), so a request decodes in the
    # same calls cold, warm or grafted; with logprobs asked for, one token per call (on_token reads the logits)
    gen = session.generate(
        max_tokens,
        stop=job.stops,
        on_token=on_token,
        sampler=Sampler(job.sampling),
        lookup=0 if job.top_logprobs is not None else None,
        constraint=grammar.matcher() if grammar is not None else None,
    )
    text = gen.text.strip() if job.strip else gen.text
    if job.cancel.is_set():
        raise Cancelled("the client went away")
    stream.finish(text)
    timed_out = gen.stop_reason == "callback"
    done = {
        "text": text,
        "completion_tokens": len(gen.tokens),
        "stop_reason": "max_tokens" if timed_out else gen.stop_reason,
        "decode_ms": gen.seconds * 1e3,
        "logprobs": lps[: len(gen.tokens)],
        "tail_logprobs": lps[sent[0] :],
        "constraint": gen.constraint,
    }
    repeat = guarded and tools.repeats_answered(text, job.tools, job.answered)
    if held is not None and not repeat:
        for e in held:  # not a repeat after all: what waited goes out
            job.emit(e)
    return done, repeat
