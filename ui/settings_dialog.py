"""Settings (model file, GPU layers, threads, context size), persisted with QSettings."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from kvgraft.app.runtime import Settings, physical_cores


def load_settings(qs: QSettings) -> Settings:
    model = qs.value("model", "", type=str)
    return Settings(
        model=Path(model) if model else None,
        n_ctx=qs.value("n_ctx", 8192, type=int),
        n_threads=qs.value("threads", physical_cores(), type=int),
        n_gpu_layers=qs.value("gpu_layers", 0, type=int),
    )


def save_settings(qs: QSettings, s: Settings) -> None:
    qs.setValue("model", str(s.model) if s.model else "")
    qs.setValue("n_ctx", s.n_ctx)
    qs.setValue("threads", s.n_threads)
    qs.setValue("gpu_layers", s.n_gpu_layers)
    qs.sync()


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("kvgraft settings")
        form = QFormLayout(self)
        self.model = QLineEdit(str(settings.model) if settings.model else "")
        self.model.setPlaceholderText("embedded Gemma 3 270M")
        browse = QPushButton("Browse...")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.model)
        row.addWidget(browse)
        form.addRow("Model file (GGUF)", row)
        self.gpu_layers = QSpinBox(maximum=1000, value=settings.n_gpu_layers)
        form.addRow("GPU layers (CUDA builds)", self.gpu_layers)
        self.threads = QSpinBox(minimum=1, maximum=256, value=settings.n_threads)
        form.addRow("Threads", self.threads)
        self.n_ctx = QSpinBox(minimum=512, maximum=131072, singleStep=1024, value=settings.n_ctx)
        form.addRow("Context size (tokens)", self.n_ctx)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", "", "GGUF models (*.gguf)")
        if path:
            self.model.setText(path)

    def result_settings(self) -> Settings:
        text = self.model.text().strip()
        return Settings(
            model=Path(text) if text else None,
            n_ctx=self.n_ctx.value(),
            n_threads=self.threads.value(),
            n_gpu_layers=self.gpu_layers.value(),
        )
