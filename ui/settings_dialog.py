"""Settings (model file, GPU layers, batch sizes, threads, context size, flash attention, KV types), kept
whole in the data dir (app/core/settings_store.py), where the CLI and `kvgraft serve` read them too."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
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

from kvgraft.app.core.runtime import DEFAULT_LOOKUP, KV_TYPE_NAMES, Settings
from kvgraft.app.core.settings_store import save_settings, saved_settings

CONFIG_KEY = "config"  # the whole Settings as JSON (Settings.to_dict), as kvgraft kept it per user before
MIGRATED_KEY = "migrated_to"  # the data dir the per-user settings were moved into, once


def legacy_settings(qs: QSettings) -> Settings | None:
    """The per-user settings an older kvgraft kept in QSettings, or None where there are none."""
    raw = qs.value(CONFIG_KEY, "", type=str)
    if raw:
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if isinstance(data, dict):
            return Settings.from_dict(data)
    if not any(qs.contains(k) for k in ("model", "n_ctx", "threads", "gpu_layers")):
        return None
    # the oldest layout: four fields under their own keys
    old = {"model": qs.value("model", "", type=str)}
    for key, name in (("n_ctx", "n_ctx"), ("threads", "n_threads"), ("gpu_layers", "n_gpu_layers")):
        if qs.contains(key):
            old[name] = qs.value(key, type=int)
    return Settings.from_dict(old)


def window_settings(home: Path, qs: QSettings) -> Settings:
    """The data dir's settings (app/core/settings_store.py). A data dir without any takes the per-user ones
    an older kvgraft kept, once: they are written into it, and the per-user store says where they went, so
    the next new data dir starts from the defaults instead of another copy."""
    saved = saved_settings(home)
    if saved is not None:
        return saved
    old = legacy_settings(qs)
    if old is None or qs.value(MIGRATED_KEY, "", type=str):
        return Settings()
    save_settings(home, old)
    qs.setValue(MIGRATED_KEY, str(home))
    qs.sync()
    return old


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
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
        self.n_batch = QSpinBox(minimum=1, maximum=131072, value=settings.n_batch)
        self.n_batch.setToolTip("Tokens per decode call. On a GPU the batch shape decides the bits; not on the CPU.")
        form.addRow("Batch size (tokens)", self.n_batch)
        self.n_ubatch = QSpinBox(minimum=1, maximum=131072, value=settings.n_ubatch)
        self.n_ubatch.setToolTip("Tokens per compute step, at most the batch size.")
        form.addRow("Micro-batch size (tokens)", self.n_ubatch)
        self.threads = QSpinBox(minimum=1, maximum=256, value=settings.n_threads)
        form.addRow("Threads", self.threads)
        self.n_ctx = QSpinBox(minimum=512, maximum=131072, singleStep=1024, value=settings.n_ctx)
        form.addRow("Context size (tokens)", self.n_ctx)
        self.flash_attn = QCheckBox("on (changes the bits: entries made with it off are not grafted)")
        self.flash_attn.setChecked(settings.flash_attn)
        form.addRow("Flash attention", self.flash_attn)
        self.lookup = QCheckBox("on (greedy answers check tokens guessed from the context, several per call)")
        self.lookup.setChecked(settings.lookup > 0)
        self.lookup.setToolTip("Prompt-lookup decoding: each call is recorded, so Check this turn replays it exactly.")
        form.addRow("Prompt-lookup decoding", self.lookup)
        self.type_k, self.type_v = QComboBox(), QComboBox()
        for box, value in ((self.type_k, settings.type_k), (self.type_v, settings.type_v)):
            box.addItems(KV_TYPE_NAMES)
            box.setCurrentText(value)
        form.addRow("KV cache type (K)", self.type_k)
        form.addRow("KV cache type (V)", self.type_v)
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
        return dataclasses.replace(
            self.settings,
            model=Path(text) if text else None,
            n_ctx=self.n_ctx.value(),
            n_threads=self.threads.value(),
            n_gpu_layers=self.gpu_layers.value(),
            n_batch=self.n_batch.value(),
            n_ubatch=min(self.n_ubatch.value(), self.n_batch.value()),
            flash_attn=self.flash_attn.isChecked(),
            type_k=self.type_k.currentText(),
            type_v=self.type_v.currentText(),
            lookup=(self.settings.lookup or DEFAULT_LOOKUP) if self.lookup.isChecked() else 0,
        )
