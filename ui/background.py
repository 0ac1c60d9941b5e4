"""The window's second queue: work that must not hold the engine thread nor the GUI thread (a model
file's header checked, later a download), on a `JobThread` of its own (app/core/jobs.py), its events
brought back to the GUI thread.

`Background.run(name, fn, on_done)` queues `fn`; `on_done(event)` runs on the GUI thread with its one
ending event (`Returned`, `Errored` or `Cancelled`). The thread starts on first use and stops with the
window. The window has two: one for header checks, one for model downloads (ui/model_downloads.py), so a
check never waits behind a download.
"""

from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QObject, Signal, Slot

from kvgraft.app.core.jobs import KNOWN, Job, JobThread, Started


class Background(QObject):
    _deliver = Signal(object, object)  # (callback, event): queued to the GUI thread

    def __init__(self, parent: QObject | None = None, name: str = "kvgraft-background") -> None:
        super().__init__(parent)
        self.name = name
        self._thread: JobThread | None = None
        self._deliver.connect(self._on_deliver)

    def run(self, name: str, fn: Callable[[], Any], on_done: Callable[[Any], None], known: tuple = KNOWN) -> None:
        if self._thread is None:
            self._thread = JobThread(self.name)
            self._thread.start()

        def emit(event) -> None:
            if not isinstance(event, Started):
                self._deliver.emit(on_done, event)

        self._thread.submit(Job(name, fn, emit, known))

    @Slot(object, object)
    def _on_deliver(self, on_done, event) -> None:
        on_done(event)

    def stop(self) -> None:
        """Let the job in progress finish, drop what waits, end the thread."""
        if self._thread is not None:
            self._thread.waiting()
            self._thread.stop(timeout=30)
            self._thread = None
