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


def test_collector_is_off_in_the_tests():
    assert not gc.isenabled(), "tests/conftest.py turns automatic collection off before any thread starts"


def test_the_collector_turns_automatic_collection_off(qapp):
    gc.collect()
    gc.enable()
    try:
        collector = GuiCollector(qapp).start()
        assert not gc.isenabled()
        collector.stop()
    finally:
        gc.disable()


def test_the_app_runs_with_automatic_collection_off_and_the_collector_on(qapp, monkeypatch):
    """`kvgraft app` (ui/main_window.run): collection is off before the window and its threads start, and a
    GuiCollector ticks on the GUI thread while the event loop runs."""
    from PySide6.QtWidgets import QWidget

    from kvgraft.ui import main_window

    class Window(QWidget):  # the window's part in run(); the real one loads the model on its thread
        _closed = False

        def __init__(self) -> None:
            super().__init__()
            self.gc_enabled_at_start = gc.isenabled()

    seen = {}

    def exec_(app):
        seen["gc_enabled"] = gc.isenabled()
        seen["collectors"] = [c for c in app.findChildren(GuiCollector) if c._timer.isActive()]
        return 0

    gc.collect()
    gc.enable()
    try:
        monkeypatch.setattr(main_window, "MainWindow", Window)
        monkeypatch.setattr(type(qapp), "exec", exec_)
        assert main_window.run(["kvgraft-app"]) == 0
    finally:
        gc.disable()
    assert seen["gc_enabled"] is False and len(seen["collectors"]) == 1
    assert not seen["collectors"][0]._timer.isActive()  # stopped once the loop ended


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
    gc.collect()  # older garbage (earlier tests' widgets among it) freed here first, on the main thread
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
    t0, t1, _ = gc.get_threshold()
    keep = []
    for young in range(t1 + 1):  # each young collection adds one to the middle generation's count
        keep += [Node() for _ in range(t0 + 10)]
        assert collector.collect_due() == 0, young
    keep += [Node() for _ in range(t0 + 10)]
    assert collector.collect_due() == 1 and collector.collections == [t1 + 1, 1, 0]
    # a full collection waits for full_every_s even when its count is past the threshold
    while gc.get_count()[2] <= gc.get_threshold()[2]:
        gc.collect(1)  # each middle collection adds one to the old generation's count
    keep += [Node() for _ in range(t0 + 10)]
    assert collector.due() in (0, 1)
    collector._last_full -= 3600
    assert collector.collect_due() == 2 and collector.collections[2] == 1
    old = gc.get_threshold()
    gc.set_threshold(0)
    try:
        keep += [Node() for _ in range(t0 + 10)]
        assert collector.due() is None  # threshold 0: the interpreter's "collection off"
    finally:
        gc.set_threshold(*old)
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
