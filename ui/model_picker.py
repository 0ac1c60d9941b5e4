"""The model picker: the embedded model, the known models fetched into the model cache (`kvgraft models
fetch`), the GGUF files in the data dir's models folder, "Add model...".

Choosing one only says which; the window checks the file's header first (app/core/gguf_check.py: a file
that is not a usable GGUF is refused and nothing changes) and the engine thread loads it, with progress.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QWidget

from kvgraft.app.core.model_registry import fetched_known_models

EMBEDDED = "Gemma 3 270M (embedded)"
ADD = "Add model..."


def models_dir(data_root: Path) -> Path:
    return data_root / "models"


class ModelPicker(QComboBox):
    chosen = Signal(str)  # a .gguf path, or "" for the embedded model

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumContentsLength(28)
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.activated.connect(self._on_activated)
        self._current: str = ""

    def populate(self, current: Path | None, folder: Path) -> None:
        self.blockSignals(True)
        self.clear()
        self.addItem(EMBEDDED, "")
        known = fetched_known_models()  # `kvgraft models fetch NAME`: in the model cache, by title
        for title, path in known:
            self.addItem(title, str(path))
        paths = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
        listed = {p for _, p in known}
        if current is not None and Path(current) not in paths and Path(current) not in listed:
            paths.append(Path(current))
        for p in paths:
            if p not in listed:
                self.addItem(p.name, str(p))
        self.addItem(ADD, None)
        self._current = str(current) if current else ""
        self.setCurrentIndex(max(0, self.findData(self._current)))
        self.setToolTip(f"GGUF models in {folder} are listed here")
        self.blockSignals(False)

    def _on_activated(self, index: int) -> None:
        data = self.itemData(index)
        self.setCurrentIndex(max(0, self.findData(self._current)))  # the load decides; until then, the current one
        if data is None:
            path, _ = QFileDialog.getOpenFileName(self, "Add a model", "", "GGUF models (*.gguf)")
            if path:
                self.chosen.emit(path)
        elif data != self._current:
            self.chosen.emit(data)
