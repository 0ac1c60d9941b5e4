"""What the window takes from outside: files dropped on it or named on its command line (packs, problem
files, documents, models), and a model chosen in the picker. Mixed into ui/main_window.MainWindow."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from kvgraft.app.core.gguf_check import NotAModel, inspect_gguf
from kvgraft.app.core.jobs import Errored, Returned
from kvgraft.app.ingest.documents import DOCUMENT_SUFFIXES

IMPORTABLE = (".kvpack", ".jsonl") + DOCUMENT_SUFFIXES  # packs, problem files, documents (app/ingest/import_files.py)
DROPPABLE = IMPORTABLE + (".gguf",)


class WindowFiles:
    """Needs the window's `client`, `settings`, `notify`, `apply_settings`, `background` and `model_label`."""

    # -- drag and drop ----------------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:  # noqa: N802
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if any(Path(u.toLocalFile()).suffix.lower() in DROPPABLE for u in urls):
            event.setDropAction(Qt.CopyAction)
            event.accept()

    def dropEvent(self, event) -> None:  # noqa: N802
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        event.setDropAction(Qt.CopyAction)  # never a move: a file manager would delete the source
        event.accept()
        self.open_files(paths)

    def open_files(self, paths: list[str]) -> None:
        packs = [p for p in paths if Path(p).suffix.lower() in IMPORTABLE]
        models = [p for p in paths if Path(p).suffix.lower() == ".gguf"]
        others = [p for p in paths if p not in packs and p not in models]
        if others:
            self.notify(
                "Not imported",
                "kvgraft takes .kvpack packs, .jsonl problem files, .txt/.md/.pdf documents and .gguf models:\n"
                + "\n".join(Path(p).name for p in others),
                error=True,
            )
        if packs:
            self.client.request_import.emit(packs)
        for m in models[:1]:
            self.offer_model(m)

    def offer_model(self, path: str, ask: bool = True) -> None:
        """Switch to the model at `path` once its header checks out (a file that is not a usable GGUF is refused
        and nothing changes); `ask` confirms first (a dropped file), the model picker has chosen already. The
        header is read on the window's second queue (ui/background.py): the window stays responsive."""
        self.model_label.setText(f"checking {Path(path).name}...")

        def checked(event) -> None:
            if self._closed:
                return
            self.model_label.setText(self._model_words())
            if isinstance(event, Errored):
                self.notify("Not a model", event.message, error=True)
                return
            if not isinstance(event, Returned):
                return
            info = event.value
            if not ask or self.confirm(
                "Switch model",
                f"Switch to {info['name']} ({info['architecture']}, {info['size_bytes'] / 1e6:,.0f} MB)?",
            ):
                self.apply_settings(dataclasses.replace(self.settings, model=Path(info["path"])))

        self.background.run("check model", lambda: inspect_gguf(Path(path)), checked, known=(NotAModel, OSError))

    def confirm(self, title: str, text: str) -> bool:
        return QMessageBox.question(self, title, text) == QMessageBox.Yes
