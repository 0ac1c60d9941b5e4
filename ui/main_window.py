"""The kvgraft main window: ask, browse the library, drop packs, verify. Qt widgets only.

Every action goes to the engine worker thread (ui/worker.py) through queued signals; the GUI
thread only reads the library index for the table and the status bar (app/library_view.py).
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QIcon
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

import kvgraft
from kvgraft.app.core.gguf_check import NotAModel, inspect_gguf
from kvgraft.app.core.runtime import Settings
from kvgraft.app.ingest.documents import DOCUMENT_SUFFIXES
from kvgraft.app.library_view import LibraryView

from .answer_panel import AnswerPanel
from .library_table import EntriesModel, sorted_view
from .settings_dialog import SettingsDialog, load_settings, save_settings
from .summaries import import_summary, verify_summary
from .worker import EngineWorker, WorkerClient

ICON = Path(kvgraft.__file__).resolve().parent / "kvgraft.svg"  # package data of kvgraft (packaging/kvgraft)
IMPORTABLE = (".kvpack", ".jsonl") + DOCUMENT_SUFFIXES  # packs, problem files, documents (app/ingest/import_files.py)
DROPPABLE = IMPORTABLE + (".gguf",)


class MainWindow(QMainWindow):
    def __init__(self, qsettings: QSettings | None = None, engine=None) -> None:
        super().__init__()
        self.qsettings = qsettings or QSettings("kvgraft", "kvgraft")
        self.settings: Settings = load_settings(self.qsettings)
        self.engine_info: dict = {}
        self.view = LibraryView()
        self.messages: list[tuple[str, str]] = []  # (title, text) of every message shown, for tests and logs
        self._closed = False
        self._stuck_clients: list = []
        self.setWindowTitle("kvgraft")
        if ICON.exists():
            self.setWindowIcon(QIcon(str(ICON)))
        self.setAcceptDrops(True)
        self.resize(1000, 680)
        self._build_ui()
        self._start_worker(engine)
        self.refresh_library()

    # -- layout ---------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        tabs = QTabWidget()
        self.setCentralWidget(tabs)
        tabs.addTab(self._ask_tab(), "Ask")
        tabs.addTab(self._library_tab(), "Library")
        self.tabs = tabs
        self.model_label = QLabel("model: loading...")
        self.library_label = QLabel("")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(220)
        self.progress.hide()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.hide()
        self.cancel_button.clicked.connect(lambda: self.worker.cancel())
        sb = self.statusBar()
        sb.addWidget(self.model_label)
        sb.addWidget(self.library_label, 1)
        sb.addPermanentWidget(self.progress)
        sb.addPermanentWidget(self.cancel_button)
        menu = self.menuBar().addMenu("&File")
        for text, slot in (
            ("Import packs...", self._choose_import),
            ("Settings...", self._open_settings),
            ("Check and repair library", self.repair_library),
            ("Quit", self.close),
        ):
            act = QAction(text, self)
            act.triggered.connect(slot)
            menu.addAction(act)

    def _ask_tab(self) -> QWidget:
        p = self.answer_panel = AnswerPanel()
        p.ask_requested.connect(self._request_ask)
        p.deposit_requested.connect(self._request_deposit_solution)
        # the panel's widgets, as tests and scripts drive the window
        self.question, self.ask_button, self.answer_view = p.question, p.ask_button, p.answer_view
        self.answer_state, self.provenance, self.deposit_button = p.answer_state, p.provenance, p.deposit_button
        return p

    @property
    def last_answer(self) -> dict | None:  # the last answer received: AskResult.as_dict() and its provenance
        return self.answer_panel.last_answer

    @last_answer.setter
    def last_answer(self, r: dict | None) -> None:
        self.answer_panel.last_answer = r

    def _library_tab(self) -> QWidget:
        w = QWidget()
        lay = QVBoxLayout(w)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search titles, questions and texts")
        self._search_timer = QTimer(self, singleShot=True, interval=250)
        self._search_timer.timeout.connect(self.refresh_library)
        self.search.textChanged.connect(lambda _t: self._search_timer.start())
        lay.addWidget(self.search)
        self.entries = EntriesModel()
        self.proxy = sorted_view(self.entries)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.setSelectionBehavior(QTableView.SelectRows)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        self.table.sortByColumn(0, Qt.AscendingOrder)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.Stretch)
        lay.addWidget(self.table, 1)
        row = QHBoxLayout()
        for text, slot in (
            ("Ask it", self._ask_selected),
            ("Verify selected", self.verify_selected),
            ("Export selected...", self._export_selected),
            ("Delete", self._delete_selected),
        ):
            b = QPushButton(text)
            b.clicked.connect(slot)
            row.addWidget(b)
        row.addStretch(1)
        lay.addLayout(row)
        return w

    # -- the worker ---------------------------------------------------------------------------
    def _start_worker(self, engine=None) -> None:
        self.worker = EngineWorker(self.settings, engine)
        self.client = WorkerClient(self.worker)
        w = self.worker
        w.ready.connect(self._on_ready)
        # bound methods only: a lambda connected to a worker signal would run in the worker thread
        w.status.connect(self._on_status)
        w.progress.connect(self._on_progress)
        w.token.connect(self._on_token)
        w.answered.connect(self._on_answered)
        w.deposited.connect(self._on_deposited)
        w.imported.connect(self._on_imported)
        w.verified.connect(self._on_verified)
        w.exported.connect(self._on_exported)
        w.repaired.connect(self._on_repaired)
        w.library_changed.connect(self.refresh_library)
        w.failed.connect(self._on_failed)
        w.busy.connect(self._on_busy)
        self.client.request_start.emit()

    def stop_worker(self) -> bool:
        stopped = self.client.stop()
        if not stopped:
            self._stuck_clients.append(self.client)  # keep a running QThread referenced until it ends
        return stopped

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        self._closed = True  # signals still queued from the worker are ignored from here on
        self._search_timer.stop()
        self.stop_worker()
        self.view.close()
        super().closeEvent(event)

    # -- messages -----------------------------------------------------------------------------
    def notify(self, title: str, text: str, error: bool = False) -> None:
        """Show a message (tests replace `show_message` to keep dialogs from blocking)."""
        self.messages.append((title, text))
        self.show_message(title, text, error)

    def show_message(self, title: str, text: str, error: bool) -> None:
        box = QMessageBox.warning if error else QMessageBox.information
        box(self, title, text)

    # -- slots ----------------------------------------------------------------------------------
    def _on_ready(self, info: dict) -> None:
        if self._closed:
            return
        self.engine_info = info
        self.ask_button.setEnabled(True)
        self.model_label.setText(f"model: {info['model']} - {info['backend']} - n_ctx {info['n_ctx']:,}")
        self.refresh_library()

    def _on_status(self, message: str) -> None:
        if not self.engine_info:
            self.model_label.setText(message)

    def _on_deposited(self, d: dict) -> None:
        self.notify("Deposited", f"Entry #{d['id']}: {d['tokens']:,} tokens, blob {d['blob_sha256'][:16]}...")

    def _on_exported(self, d: dict) -> None:
        self.notify("Exported", f"{d['file']}: {d['entries']} entries, {d['bytes'] / 1e6:.1f} MB")

    def _on_repaired(self, r: dict) -> None:
        self.notify("Check and repair", "\n".join(r["lines"]), error=not r["ok"])

    def repair_library(self) -> None:
        """Check every blob and index row; compact old blobs, reclaim leftovers (kvgraft fsck --repair)."""
        self.client.request_repair.emit()

    def _on_busy(self, busy: bool) -> None:
        self.progress.setVisible(busy)
        self.cancel_button.setVisible(busy)
        self.ask_button.setEnabled(not busy and bool(self.engine_info))
        if busy:
            self.progress.setRange(0, 0)

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(done)
        self.progress.setFormat(f"{stage} {done}/{total}")

    def _on_token(self, piece: str) -> None:
        self.answer_panel.show_token(piece)

    def _on_answered(self, r: dict) -> None:
        self.answer_panel.show_answer(r)

    def _on_imported(self, s: dict) -> None:
        self.notify("Import", import_summary(s), error=bool(s["refused"]))

    def _on_verified(self, out: dict) -> None:
        self.notify("Verify", verify_summary(out), error=not out["ok"])

    def _on_failed(self, op: str, message: str) -> None:
        if op == "start":
            self.model_label.setText("model: not loaded")
        self.notify(
            f"{op} failed" if message != "cancelled" else f"{op} cancelled", message, error=message != "cancelled"
        )

    # -- actions --------------------------------------------------------------------------------
    def ask(self) -> None:
        self.answer_panel.ask()

    def _request_ask(self, question: str) -> None:
        self.client.request_ask.emit(question)

    def _deposit_answer(self) -> None:
        """Deposit the last answer once the user confirmed it (ui/deposit_dialog.py); only a depositable one."""
        self.answer_panel.deposit_answer()

    def _request_deposit_solution(self, question: str, solution: str, answer: str) -> None:
        self.client.request_deposit_solution.emit(question, solution, answer)

    def selected_ids(self) -> list[int]:
        rows = {self.proxy.mapToSource(i).row() for i in self.table.selectionModel().selectedRows()}
        return [self.entries.row_at(r).id for r in sorted(rows)]

    def _ask_selected(self) -> None:
        ids = self.selected_ids()
        if ids:
            row = next(r for r in self.entries._rows if r.id == ids[0])
            self.question.setText(row.title)
            self.tabs.setCurrentIndex(0)
            self.ask()

    def verify_selected(self, replay: bool = False) -> None:
        self.client.request_verify.emit(self.selected_ids(), bool(replay))

    def _export_selected(self) -> None:
        ids = self.selected_ids()
        if not ids:
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export pack", "selection.kvpack", "kvgraft packs (*.kvpack)")
        if path:
            self.client.request_export.emit(ids, path)

    def _delete_selected(self) -> None:
        ids = self.selected_ids()
        if ids and QMessageBox.question(self, "Delete", f"Delete {len(ids)} entries?") == QMessageBox.Yes:
            self.client.request_remove.emit(ids)

    def _choose_import(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Import", "", "Packs, problem files and documents (*.kvpack *.jsonl *.txt *.md *.markdown *.pdf)"
        )
        if paths:
            self.open_files(paths)

    def _open_settings(self) -> None:
        dlg = SettingsDialog(self.settings, self)
        if dlg.exec():
            self.apply_settings(dlg.result_settings())

    def apply_settings(self, new: Settings) -> None:
        """Persist the settings and, when the engine depends on them, restart the worker."""
        save_settings(self.qsettings, new)
        if new != self.settings:
            self.settings = new
            self.engine_info = {}
            self.ask_button.setEnabled(False)
            self.model_label.setText("model: loading...")
            self.stop_worker()
            self._start_worker()

    # -- drag and drop ----------------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:  # noqa: N802
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if any(Path(u.toLocalFile()).suffix.lower() in DROPPABLE for u in urls):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        event.acceptProposedAction()
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

    def offer_model(self, path: str) -> None:
        try:
            info = inspect_gguf(Path(path))
        except NotAModel as exc:
            self.notify("Not a model", str(exc), error=True)
            return
        if self.confirm(
            "Switch model", f"Switch to {info['name']} ({info['architecture']}, {info['size_bytes'] / 1e6:,.0f} MB)?"
        ):
            s = self.settings
            self.apply_settings(dataclasses.replace(s, model=Path(info["path"])))

    def confirm(self, title: str, text: str) -> bool:
        return QMessageBox.question(self, title, text) == QMessageBox.Yes

    # -- library view -------------------------------------------------------------------------
    def refresh_library(self) -> None:
        if self._closed:
            return
        rows = self.view.rows(self.engine_info.get("fingerprint"), self.search.text())
        self.entries.set_rows(rows)
        stats = self.view.stats(self.settings.n_ctx)
        disk = f", {stats['bytes'] / 1e6:,.0f} MB on disk" if stats.get("bytes") else ""
        self.library_label.setText(
            f"library: {stats['entries']:,} entries, {stats['tokens']:,} tokens = {stats['context_multiple']:.1f}x the "
            f"{self.settings.n_ctx:,}-token context{disk}"
        )


def run(argv: list[str] | None = None) -> int:
    """Open the window. Files named on the command line (a file manager's "Open with kvgraft",
    the desktop entry's %F) are opened as if dropped on it."""
    argv = list(sys.argv if argv is None else argv)
    app = QApplication.instance() or QApplication(argv[:1])
    app.setApplicationName("kvgraft")
    win = MainWindow()
    win.show()
    files = [a for a in argv[1:] if not a.startswith("-")]
    if files:
        QTimer.singleShot(0, lambda: win.open_files(files))
    code = app.exec()
    close_window(win)
    return code


def close_window(win: MainWindow) -> None:
    """Tear the window down before the interpreter does: the worker thread stopped, its warm
    context, library and model freed in that order (closeEvent), then the widgets deleted and
    every Python wrapper collected while Qt and llama.cpp are still whole."""
    if not win._closed:
        win.close()
    win.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    gc.collect()
