"""Python's cyclic collector, run only on the GUI thread.

CPython runs a collection on whatever thread happens to allocate past the threshold. When that is the engine
worker, the HTTP thread or a thread pool and the garbage holds a Qt wrapper (a widget in a reference cycle),
the wrapper's C++ object is deleted off the GUI thread and Qt crashes (three crashes of this kind reached the
suite: issue 40). So the app turns automatic collection off before any thread starts and collects from a
timer on the GUI thread instead, by the interpreter's own count thresholds: the young generation when
`gc.get_count()[0]` passes its threshold, a middle one when enough young collections have run, and a full
collection no more often than every `full_every_s` seconds (a full pass over a large heap would pause the
window).

The other path, a Qt wrapper whose *last reference* is dropped on a worker thread, cannot happen with this
design: the worker threads receive only plain Python values (the request signals in ui/worker.py carry str,
list and bool), the worker emits only plain values back, and the worker object itself is released on the GUI
thread after its thread has finished (WorkerClient.stop). tests/test_collector.py records, with
`weakref.finalize`, the thread on which each of the window's wrappers is freed over a chat with stop and
regenerate, and finds the GUI thread only.

The tests do the same as the app (tests/conftest.py: `gc.disable()` at import, a collection on the main
thread after each test).
"""

from __future__ import annotations

import gc
import time

from PySide6.QtCore import QObject, QTimer


class GuiCollector(QObject):
    """Owns the collector for the life of the application: `GuiCollector(app).start()`."""

    def __init__(self, parent: QObject | None = None, interval_ms: int = 250, full_every_s: float = 60.0) -> None:
        super().__init__(parent)
        self.full_every_s = full_every_s
        self._last_full = time.monotonic()
        self.collections = [0, 0, 0]  # how many of each generation this collector ran
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.collect_due)

    def start(self) -> "GuiCollector":
        gc.disable()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.stop()

    def due(self) -> int | None:
        """The oldest generation whose count passed its threshold, as CPython 3.11-3.13 picks it (a full
        one at most every full_every_s); None when nothing is due or collection is set off (threshold 0)."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        if thresholds[0] == 0 or counts[0] <= thresholds[0]:
            return None
        full_due = time.monotonic() - self._last_full >= self.full_every_s
        if counts[2] > thresholds[2] and full_due:
            return 2
        return 1 if counts[1] > thresholds[1] else 0

    def collect_due(self) -> int | None:
        generation = self.due()
        if generation is not None:
            gc.collect(generation)
            self.collections[generation] += 1
            if generation == 2:
                self._last_full = time.monotonic()
        return generation
