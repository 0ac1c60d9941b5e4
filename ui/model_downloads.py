"""Known models downloaded from the window (app/core/model_download.py), on a queue of their own: the
engine thread keeps answering and chatting, the GUI thread only shows the bytes.

A row at the window's bottom holds a bar ("Qwen2.5-Coder ...: 412 / 1,071 MB") and a "Cancel download"
button while a download runs. A cancel, a crash or a lost network keep what came: the next Download resumes there.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QProgressBar, QPushButton, QToolBar, QWidget

from kvgraft.app.core.model_download import download, downloaded_bytes, total_bytes
from kvgraft.app.core.model_registry import KnownModel, known_models
from kvgraft.app.core.model_store import ModelStoreError

from .background import Background


def state_words(m: KnownModel, active: dict[str, tuple[int, int]]) -> str | None:
    """How the picker names a known model's download: running, partly here, or None (not started)."""
    if m.name in active:
        done, total = active[m.name]
        return f"fetching {100 * done // max(1, total)}%"
    kept = downloaded_bytes(m)
    if kept:
        return f"{100 * kept // max(1, total_bytes(m))}% fetched: Download resumes"
    return None


class DownloadBar(QToolBar):
    """A row of its own at the window's bottom while a download runs: its bytes and a Cancel button."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Download", parent)
        self.setMovable(False)
        self.setFloatable(False)
        self.bar = QProgressBar()
        self.bar.setMinimumWidth(420)
        self.cancel = QPushButton("Cancel download")
        self.addWidget(self.bar)
        self.addWidget(self.cancel)
        self.hide()

    def show_bytes(self, title: str, done: int, total: int) -> None:
        self.bar.setRange(0, max(1, total >> 20))
        self.bar.setValue(done >> 20)
        self.bar.setFormat(f"{title}: {done >> 20:,} / {total >> 20:,} MB")
        self.bar.setToolTip(self.bar.format())
        self.show()


class ModelDownloads(QObject):
    changed = Signal()  # a download started, moved a percent or ended: the picker's words change
    _bytes = Signal(str, int, int)  # (name, done, total) from the download thread, queued to the GUI thread

    def __init__(self, bar: DownloadBar, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bar = bar
        self.queue = Background(self, name="kvgraft-download")
        self.active: dict[str, tuple[int, int]] = {}
        self._stop: dict[str, threading.Event] = {}
        self._bytes.connect(self._on_bytes)
        bar.cancel.clicked.connect(self.cancel)

    def states(self) -> dict[str, str]:
        return {m.name: w for m in known_models() if (w := state_words(m, self.active)) is not None}

    def start(self, model: KnownModel, on_done: Callable[[object], None]) -> None:
        """Download `model` (resuming what is here); `on_done(event)` on the GUI thread with Returned(path),
        Errored or Cancelled."""
        if model.name in self.active:
            return
        stop = self._stop[model.name] = threading.Event()
        self.active[model.name] = (downloaded_bytes(model), total_bytes(model))
        self.bar.show_bytes(model.title, *self.active[model.name])
        self.changed.emit()

        def run() -> Path:
            return download(model, on_bytes=lambda d, t: self._bytes.emit(model.name, d, t), cancelled=stop.is_set)

        def done(event) -> None:
            self.active.pop(model.name, None)
            self._stop.pop(model.name, None)
            if not self.active:
                self.bar.hide()
            self.changed.emit()
            on_done(event)

        self.queue.run(f"download {model.name}", run, done, known=(ModelStoreError, OSError))

    def cancel(self) -> None:
        for stop in self._stop.values():
            stop.set()

    @Slot(str, int, int)
    def _on_bytes(self, name: str, done: int, total: int) -> None:
        if name not in self.active:
            return
        before = self.active[name]
        self.active[name] = (done, total)
        title = next((m.title for m in known_models() if m.name == name), name)
        self.bar.show_bytes(title, done, total)
        if 100 * done // max(1, total) != 100 * before[0] // max(1, before[1]):
            self.changed.emit()

    def stop(self) -> None:
        """The window closes: a running download stops at its next block (what came is kept)."""
        self.cancel()
        self.queue.stop()
