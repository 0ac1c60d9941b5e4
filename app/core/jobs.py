"""One job runner and one event shape, for the window, the embedded server and `kvgraft serve`.

As napari's `create_worker` has one: a job is a callable run on a worker thread, and what it does
reaches its owner as typed events, in this order:

    Started -> (Progress | Yielded)* -> one of Returned | Errored | Cancelled

`run_job` is the one place that turns a callable's outcome into those events: a `Cancelled` raised by
the callable (a cancel flag checked at a progress report or a token) ends it Cancelled; a known error
(EngineError, LibraryError, OSError: things a user can meet) ends it Errored with its message; any other
exception is logged with its traceback and ends it Errored with code "internal" (a server answers it
with its type only), never a crash of the thread that runs it.

`JobThread` is a plain thread over a bounded FIFO of jobs: the engine thread of `kvgraft serve`
(app/serve/worker.py), and a second queue for work that must not hold the engine (a download). The
window's engine thread is a QThread (ui/worker.py) that runs its jobs through the same `run_job`.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

from kvgraft.engine.errors import Cancelled as CancelledError
from kvgraft.engine.errors import EngineError
from kvgraft.library.errors import LibraryError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    job: str


@dataclass(frozen=True)
class Progress:
    job: str
    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class Yielded:
    job: str
    value: Any


@dataclass(frozen=True)
class Returned:
    job: str
    value: Any = None


@dataclass(frozen=True)
class Errored:
    job: str
    code: str  # what kind of failure: "engine_error", "context_length_exceeded", "internal", ...
    message: str  # the error's own words (an "internal" one's are for a log or a local window, not a client)
    kind: str = ""  # the exception's type name


@dataclass(frozen=True)
class Cancelled:
    job: str
    reason: str = "cancelled"


Event = Started | Progress | Yielded | Returned | Errored | Cancelled
KNOWN = (EngineError, LibraryError, OSError)  # a user can meet these: their message is the answer


def run_job(name: str, fn: Callable[[], Any], emit: Callable[[Event], None], known: tuple = KNOWN) -> Event:
    """Run `fn` here and report it: Started, then the one ending event (also returned). `known`: the
    exceptions a user can meet (their message is the answer, no traceback is logged)."""
    emit(Started(name))
    try:
        end: Event = Returned(name, fn())
    except CancelledError as exc:
        end = Cancelled(name, str(exc) or "cancelled")
    except known as exc:  # an error may name its kind (`code`), else it is the engine's or the library's
        kind = type(exc).__name__
        end = Errored(name, getattr(exc, "code", None) or "engine_error", str(exc) or kind, kind)
    except Exception as exc:  # noqa: BLE001 (one job's failure must not stop the thread that runs the jobs)
        log.exception("%s failed", name)
        end = Errored(name, "internal", str(exc) or type(exc).__name__, type(exc).__name__)
    emit(end)
    return end


class QueueFull(Exception):
    """The queue is full: try again later (the server answers 429 with Retry-After)."""


@dataclass
class Job:
    """A callable to run on a job queue's thread, and where its events go."""

    name: str
    fn: Callable[[], Any]
    emit: Callable[[Event], None] = lambda event: None
    known: tuple = KNOWN  # the exceptions a user can meet (run_job)


class JobQueue:
    """A bounded FIFO of jobs, run one at a time in order by whichever thread drains it: a `JobThread`
    of its own, or a thread that owns something else and is woken to `drain` (the window's engine
    thread runs the embedded server's requests that way, app/serve/embedded.py).

    Hooks for a subclass: `run` (one job: `run_job` by default), `after` (after each job),
    `has_idle_work` and `idle` (work done only while no job waits)."""

    def __init__(self, queue_size: int = 16) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=queue_size)
        self.busy = False

    @property
    def depth(self) -> int:
        return self._q.qsize() + int(self.busy)

    def submit(self, job) -> None:
        try:
            self._q.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"{self._q.maxsize} requests are waiting") from None

    def waiting(self) -> list:
        """Take every queued job out (not the one running), in order."""
        out = []
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                return out
            if job is not _STOP:
                out.append(job)

    def run(self, job) -> None:
        run_job(job.name, job.fn, job.emit, job.known)

    def after(self) -> None:
        """After each job."""

    def has_idle_work(self) -> bool:
        return False

    def idle(self) -> None:
        """One piece of the idle work."""

    def run_one(self, job) -> None:
        self.busy = True
        try:
            self.run(job)
        except Exception:  # noqa: BLE001 (a job's failure never ends the thread that runs the jobs)
            log.exception("a job failed")
        finally:
            self.busy = False
        self.after()

    def drain(self) -> int:
        """Run the queued jobs here, then the idle work while none waits. Returns the jobs run."""
        n = 0
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            if job is not _STOP:
                self.run_one(job)
                n += 1
        while self.has_idle_work() and self._q.empty():
            self.idle()
        return n


_STOP = object()


class JobThread(JobQueue):
    """A JobQueue with a thread of its own. `setup` runs first on it (a failure is kept in `load_error`
    and ends the thread), `teardown` last; `ready` is set once setup has run."""

    idle_s = 0.3  # no job for this long while idle work waits: do some of it

    def __init__(self, name: str, queue_size: int = 16) -> None:
        super().__init__(queue_size)
        self.name = name
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish the job in progress, then end the thread (what still waits is the caller's: `waiting`)."""
        self._q.put(_STOP)
        self._thread.join(timeout)

    def setup(self) -> None:
        """Run first on the thread."""

    def teardown(self) -> None:
        """Run last on the thread."""

    def _loop(self) -> None:
        try:
            self.setup()
        except BaseException as exc:  # noqa: BLE001 (reported by the owner, never swallowed)
            self.load_error = exc
            self.ready.set()
            return
        self.ready.set()
        while True:
            try:
                job = self._q.get(timeout=self.idle_s) if self.has_idle_work() else self._q.get()
            except queue.Empty:
                while self.has_idle_work() and self._q.empty():
                    self.idle()
                continue
            if job is _STOP:
                break
            self.run_one(job)
        self.teardown()
