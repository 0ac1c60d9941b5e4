"""First start: the embedded model is assembled into the model cache with a progress dialog.

On a machine that never ran kvgraft, the worker thread writes the model's chunks (about 250 MB for the
embedded Gemma) into the user cache and checks its SHA-256 before loading it (app/core/model_store.py).
The worker reports the bytes as the `progress` stage MODEL_STAGE, in MiB (the status bar shows them too);
this dialog follows the worker's signals, shows them while the window stays responsive, and closes when
the start ends (the model loaded or the load failed).
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtWidgets import QProgressDialog, QWidget

MODEL_STAGE = "model"  # the worker's progress stage while the model is put in place (MiB done, MiB total)


class FirstStartDialog(QObject):
    """Owns the dialog: created on the first MODEL_STAGE report, closed by `finish`. A Qt child of the
    window that holds no Python reference to it (a window <-> helper cycle would leave a closed window
    for a later garbage collection, which may run on the worker thread and tear Qt objects down there)."""

    def __init__(self, window: QWidget) -> None:
        super().__init__(window)
        self.dialog: QProgressDialog | None = None

    def follow(self, worker) -> None:
        """Listen to a (new) engine worker: its progress and the end of its start."""
        worker.progress.connect(self._on_progress)
        worker.busy.connect(self._on_busy)

    @Slot(str, int, int)
    def _on_progress(self, stage: str, done: int, total: int) -> None:
        if stage == MODEL_STAGE:
            self.update(done, total)

    @Slot(bool)
    def _on_busy(self, busy: bool) -> None:
        if not busy:
            self.finish()

    def update(self, done_mib: int, total_mib: int) -> None:
        if self.dialog is None:
            d = QProgressDialog(self.parent())
            d.setWindowTitle("Setting up kvgraft")
            d.setCancelButton(None)  # the model is needed; the window stays usable while it is written
            d.setWindowModality(Qt.WindowModality.NonModal)
            d.setMinimumDuration(0)
            d.setAutoClose(False)
            d.setAutoReset(False)
            self.dialog = d
        d = self.dialog
        d.setMaximum(max(1, total_mib))
        d.setValue(min(done_mib, total_mib))
        mb = (1 << 20) / 1e6
        if done_mib >= total_mib:  # written: the hash is compared, then the load (and the probe) follow
            d.setLabelText(
                f"The embedded model is written ({total_mib * mb:,.0f} MB).\nChecking its SHA-256 and loading it..."
            )
        else:
            d.setLabelText(
                "First start: putting the embedded model in place and checking its SHA-256\n"
                f"{done_mib * mb:,.0f} of {total_mib * mb:,.0f} MB"
            )
        d.show()

    def finish(self) -> None:
        if self.dialog is not None:
            self.dialog.close()
            self.dialog.deleteLater()
            self.dialog = None
