"""Python's cyclic collector runs on the GUI thread only (ui/collector.py, issue 40).

Three crashes reached the suite because a collection triggered by an engine or pool thread's allocations
freed Qt wrappers on that thread. These tests record the thread of every collection (`gc.callbacks`) and
of every freed window wrapper (`weakref.finalize`), and show with automatic collection on that the same
allocations do trigger a collection on the worker thread (what the cure prevents).
"""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import shiboken6
from PySide6.QtCore import QObject, QSettings

from kvgraft.ui.collector import GuiCollector
from kvgraft.ui.main_window import MainWindow, close_window


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def allocate_cycles(n: int, done: list) -> None:
    for _ in range(n):
        Node()
    done.append(threading.get_ident())


@pytest.fixture
def collection_threads():
    """The thread ident of every collection that starts while the test runs."""
    seen: list[int] = []

    def record(phase, info):
        if phase == "start":
            seen.append(threading.get_ident())

    gc.callbacks.append(record)
    yield seen
    gc.callbacks.remove(record)


def test_collector_is_off_in_tests_and_in_the_app():
    assert not gc.isenabled(), "tests/conftest.py turns automatic collection off before any thread starts"


def test_with_the_collector_a_worker_allocating_never_collects(qtbot, collection_threads):
    main = threading.get_ident()
    collector = GuiCollector(interval_ms=20).start()
    try:
        done: list = []
        worker = threading.Thread(target=allocate_cycles, args=(300_000, done), name="kvgraft-test-alloc")
        worker.start()
        qtbot.waitUntil(lambda: bool(done), timeout=60_000)
        worker.join()
        qtbot.waitUntil(lambda: collector.collections[0] > 0, timeout=10_000)
    finally:
        collector.stop()
    assert not gc.isenabled()
    assert collection_threads, "the GUI thread's timer collected nothing"
    assert set(collection_threads) == {main}, "a collection ran off the GUI thread"


def test_without_the_cure_the_worker_thread_collects(collection_threads):
    """The control: automatic collection on, the same allocations trigger collections on the worker."""
    done: list = []
    gc.enable()
    try:
        worker = threading.Thread(target=allocate_cycles, args=(300_000, done), name="kvgraft-test-alloc")
        worker.start()
        worker.join()
    finally:
        gc.disable()
    assert done[0] in set(collection_threads), "the worker's allocations triggered no collection on it"


def test_due_follows_the_interpreter_thresholds():
    collector = GuiCollector(full_every_s=3600)
    gc.collect()
    assert collector.due() is None  # nothing allocated since
    t0 = gc.get_threshold()[0]
    keep = [Node() for _ in range(t0 + 10)]
    assert collector.collect_due() == 0 and collector.collections == [1, 0, 0]
    del keep
    gc.collect()


def chat_once_and_close(qtbot, engine, settings_path, freed: list) -> list:
    """Open a window, chat once, close it; weak references to every wrapper it made (each reports the
    thread it is freed on into `freed`)."""
    w = MainWindow(QSettings(str(settings_path), QSettings.IniFormat), engine=engine)
    w.show_message = lambda title, text, error: None
    w.worker.max_reply_tokens = 8
    qtbot.waitUntil(lambda: bool(w.engine_info) and not w.chat.busy, timeout=60_000)
    wrappers = [w, w.worker, w.client, *w.findChildren(QObject)]
    for obj in wrappers:
        weakref.finalize(obj, lambda: freed.append(threading.get_ident()))
    done: list = []
    w.worker.chat_done.connect(done.append)
    w.chat.input.setPlainText("Say one word.")
    w.chat.send()
    qtbot.waitUntil(lambda: bool(done) and not w.chat.busy, timeout=120_000)
    close_window(w)
    return [weakref.ref(obj) for obj in wrappers]


def test_the_window_wrappers_are_freed_on_the_gui_thread(qtbot, engine, tmp_path):
    """A window that loads, chats through its engine thread (whose pool threads allocate) and closes: its
    Qt wrappers are freed, and on the GUI thread."""
    main = threading.get_ident()
    freed: list[int] = []
    refs = chat_once_and_close(qtbot, engine, tmp_path / "s.ini", freed)
    gc.collect()
    n = len(refs)
    assert set(freed) == {main}, "a Qt wrapper was freed off the GUI thread"
    # a wrapper still referenced (PySide keeps one of the FirstStartDialog helper) must be empty: its Qt object
    # is gone, so freeing it later, on any thread, touches no Qt object
    left = [r() for r in refs if r() is not None]
    assert len(left) + len(freed) == n and len(freed) >= n - 1, [type(o).__name__ for o in left]
    assert not any(shiboken6.isValid(o) for o in left), "a live Qt object outlived its closed window"
