"""The one progress-and-cancel shape of all long work in app/ (import, verify, repair, build).

A long operation takes `progress: Progress`, called as `progress(stage, done, total)` between
items or chunks. To stop it, the callback raises `Cancelled` (kvgraft.engine.errors): the
operation lets it through, and an operation that is all-or-nothing (an import) has then changed
nothing. The CLI passes a printer (app/cli/common.stage_progress), the desktop worker a
signal emitter that raises `Cancelled` once the user pressed Cancel.

It is the one cancel protocol of kvgraft: the engine's callbacks follow it too (a prefill's
`on_progress` raises `Cancelled` to stop it; a generation's `on_token`, and so `ask`'s and `say`'s
`on_text`, raise it to stop decoding, and the part decoded is returned with stop_reason "callback").
No callback signals a stop by what it returns.
"""

from __future__ import annotations

import threading
from typing import Callable

from kvgraft.engine.errors import Cancelled

Progress = Callable[[str, int, int], None]  # (stage, done, total)


def no_progress(stage: str, done: int, total: int) -> None:
    pass


class CancelFlag:
    """Set from any thread; `progress` callbacks made by `reporting` raise Cancelled once it is set."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled("cancelled")

    def reporting(self, report: Progress) -> Progress:
        """`report`, then raise Cancelled if the flag is set."""

        def progress(stage: str, done: int, total: int) -> None:
            report(stage, done, total)
            self.check()

        return progress
