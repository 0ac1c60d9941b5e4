"""The one job runner (app/core/jobs.py): its event shape, its queues and its threads, without the model."""

from __future__ import annotations

import threading

import pytest

from kvgraft.app.core.jobs import (
    Cancelled,
    Errored,
    Job,
    JobQueue,
    JobThread,
    Progress,
    QueueFull,
    Returned,
    Started,
    Yielded,
    run_job,
)
from kvgraft.engine.errors import Cancelled as CancelledError
from kvgraft.engine.errors import DecodeError
from kvgraft.library.errors import LibraryError


def _events(fn):
    out = []
    end = run_job("op", fn, out.append)
    assert out[-1] is end
    return out


def test_one_event_shape_for_every_ending(caplog):
    assert _events(lambda: 42) == [Started("op"), Returned("op", 42)]
    assert _events(lambda: (_ for _ in ()).throw(CancelledError("the client went away"))) == [
        Started("op"),
        Cancelled("op", "the client went away"),
    ]

    class TooLong(DecodeError):
        code = "context_length_exceeded"

    for exc, code in [
        (LibraryError("disk full"), "engine_error"),
        (TooLong("5000 tokens"), "context_length_exceeded"),
        (OSError(28, "No space left"), "engine_error"),
    ]:
        ev = _events(lambda exc=exc: (_ for _ in ()).throw(exc))
        assert ev[0] == Started("op") and isinstance(ev[1], Errored) and ev[1].code == code
        assert ev[1].message == str(exc) and ev[1].kind == type(exc).__name__
    ev = _events(lambda: {}["missing"])  # a bug: logged with its traceback, reported as "internal"
    assert ev[1].code == "internal" and ev[1].kind == "KeyError" and "Traceback" in caplog.text


def test_progress_and_yields_come_between_start_and_end():
    out = []

    def work():
        out.append(Progress("op", "blobs", 1, 2))
        out.append(Yielded("op", "a piece"))
        return "done"

    run_job("op", work, out.append)
    assert [type(e) for e in out] == [Started, Progress, Yielded, Returned]


def test_a_job_thread_runs_in_order_survives_a_failure_and_refuses_past_its_queue():
    ran, gate, running = [], threading.Event(), threading.Event()
    t = JobThread("kvgraft-test", queue_size=2)
    t.start()
    t.submit(Job("block", lambda: (running.set(), gate.wait())))
    assert running.wait(5)  # taken off the queue: two places are free
    t.submit(Job("boom", lambda: 1 / 0))
    t.submit(Job("after", lambda: ran.append("after")))
    with pytest.raises(QueueFull):
        t.submit(Job("one too many", lambda: None))
    gate.set()
    t.stop(timeout=5)
    assert ran == ["after"] and t.depth == 0


def test_a_second_queue_runs_while_the_engine_queue_is_held():
    """Work that must not hold the engine (a download) goes to a JobThread of its own."""
    engine, downloads = JobThread("kvgraft-engine-test"), JobThread("kvgraft-download-test")
    engine.start(), downloads.start()
    held, fetched = threading.Event(), threading.Event()
    engine.submit(Job("a long prefill", held.wait))
    events = []
    downloads.submit(Job("download", fetched.set, events.append))
    assert fetched.wait(5) and engine.busy  # done while the engine thread is still busy
    held.set()
    engine.stop(5), downloads.stop(5)
    assert [type(e) for e in events] == [Started, Returned]


def test_a_queue_drained_by_its_owner_runs_the_jobs_then_the_idle_work():
    class Owned(JobQueue):
        def __init__(self):
            super().__init__(4)
            self.pending, self.log = 2, []

        def has_idle_work(self):
            return self.pending > 0

        def idle(self):
            self.pending -= 1
            self.log.append("stored")

        def after(self):
            self.log.append("after")

    q = Owned()
    q.submit(Job("one", lambda: q.log.append("one")))
    q.submit(Job("two", lambda: q.log.append("two")))
    assert q.drain() == 2
    assert q.log == ["one", "after", "two", "after", "stored", "stored"]
