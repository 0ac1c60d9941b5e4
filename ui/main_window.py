"""The kvgraft main window: conversations, ask, the library opened up, the local server, packs dropped on
it. Qt widgets only.

Every action goes to the engine worker thread (ui/worker.py) through queued signals; the GUI thread only
reads the library index (threads, table, detail, status bar) on its own connection (app/library_view.py).
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QLabel,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QTabWidget,
    QWidget,
)

import kvgraft
from kvgraft.app.core.runtime import Settings
from kvgraft.app.core.settings_store import save_settings
from kvgraft.app.core.words import counted
from kvgraft.app.library_view import LibraryView

from .answer_panel import AnswerPanel
from .background import Background
from .chat_panel import ChatPanel
from .collector import GuiCollector
from .first_start import FirstStartDialog
from .library_panel import LibraryPanel
from .remote_ops import RemoteOps
from .remote_panel import RemotePanel
from .server_panel import ServerPanel
from .settings_dialog import SettingsDialog, window_settings
from .window_files import WindowFiles
from .window_messages import WindowMessages
from .window_models import WindowModels
from .window_status import WindowStatus
from .worker import EngineWorker, WorkerClient
from .worker_ops import WorkerOps

ICON = Path(kvgraft.__file__).resolve().parent / "kvgraft.svg"  # package data of kvgraft (packaging/kvgraft)


# the mixins first: their events override Qt's
class MainWindow(WindowFiles, WindowMessages, WindowModels, WindowStatus, QMainWindow):
    def __init__(self, qsettings: QSettings | None = None, engine=None) -> None:
        super().__init__()
        self.qsettings = qsettings or QSettings("kvgraft", "kvgraft")  # per user: only what is moved out once
        self.view = LibraryView()
        self.settings: Settings = window_settings(self.view.library.root, self.qsettings)  # the data dir's
        self._last_good: Settings | None = None  # the settings before a change, until the new ones load
        self.engine_info: dict = {}
        self.messages: list[tuple[str, str]] = []  # (title, text) of every message shown, for tests and logs
        self._closed = False
        self._stuck_clients: list = []
        self.background = Background(self)  # the second queue: work that holds neither the engine nor the GUI
        self.setWindowTitle("kvgraft")
        if ICON.exists():
            self.setWindowIcon(QIcon(str(ICON)))
        self.setAcceptDrops(True)
        self.resize(1100, 700)
        self._build_ui()
        self.first_start = FirstStartDialog(self)
        self._start_worker(engine)
        self.refresh_library()

    # -- layout ---------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        tabs = QTabWidget()
        self.setCentralWidget(tabs)
        self.chat = ChatPanel(self.view.library)
        self.chat.requested.connect(lambda method, args: self.client.request_call.emit(method, args))
        self.chat.stop_requested.connect(lambda: self.worker.cancel())
        tabs.addTab(self.chat, "Chat")
        tabs.addTab(self._ask_tab(), "Ask")
        tabs.addTab(self._library_tab(), "Library")
        self.server = ServerPanel()
        self.server.start_requested.connect(lambda opts: self.client.call(WorkerOps.server_start, opts))
        self.server.stop_requested.connect(lambda: self.client.call(WorkerOps.server_stop))
        tabs.addTab(self.server, "Server")
        self.remote = RemotePanel()  # holds no reference to the window (no cycle for the GC to meet later)
        self.remote.requested.connect(lambda method, args: self.client.request_call.emit(method, args))
        self.remote.push_selected_requested.connect(self._push_selected_to_remote)
        tabs.addTab(self.remote, "Remote")
        self.tabs = tabs
        self._build_models()  # the picker, the downloads (ui/window_models.py)
        self.model_label = QLabel("model: loading...")
        self.library_label = QLabel("")  # what the library holds, atop the Library tab (it wraps there)
        self.library_label.setWordWrap(True)
        self.library_panel.layout().insertWidget(1, self.library_label)
        self.progress = QProgressBar()
        self.progress.setMinimumWidth(200)
        self.progress.hide()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.hide()
        self.cancel_button.clicked.connect(lambda: self.worker.cancel())
        sb = self.statusBar()  # the model and the engine's settings; a job's progress (tests/layout_check.py)
        sb.addWidget(self.model_picker)
        sb.addWidget(self.model_label, 1)
        sb.addPermanentWidget(self.progress)
        sb.addPermanentWidget(self.cancel_button)
        self.addToolBar(Qt.BottomToolBarArea, self.download_bar)  # its own row: a download runs beside a job
        menu = self.menuBar().addMenu("&File")
        for text, slot, keys in (
            ("Import...", self._choose_import, QKeySequence.Open),
            ("Settings...", self._open_settings, None),
            ("Check and repair library", self.repair_library, None),
            ("Give back disk (gc)", self.collect_garbage, None),
            ("Quit", self.close, QKeySequence.Quit),
        ):
            act = QAction(text, self)
            if keys is not None:
                act.setShortcut(keys)
            act.triggered.connect(slot)
            menu.addAction(act)
        help_menu = self.menuBar().addMenu("&Help")
        about = QAction("About kvgraft", self)
        about.triggered.connect(self.show_about)
        help_menu.addAction(about)

    def _ask_tab(self) -> QWidget:
        p = self.answer_panel = AnswerPanel()
        p.ask_requested.connect(self._request_ask)
        p.deposit_requested.connect(self._request_deposit_solution)
        p.rebuild_requested.connect(lambda ids: self.client.call(WorkerOps.rebuild, ids))
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
        p = self.library_panel = LibraryPanel(self.view)
        p.search_changed.connect(self.refresh_library)
        p.ask_requested.connect(self._ask_title)
        p.thread_requested.connect(self._thread_from_entry)
        p.verify_requested.connect(self.verify_selected)
        p.export_requested.connect(self._export_selected)
        p.delete_requested.connect(self._delete_selected)
        self.search, self.entries, self.proxy, self.table = p.search, p.entries, p.proxy, p.table
        return p

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
        self.first_start.follow(w)  # the first-start dialog (ui/first_start.py)
        w.chat_token.connect(self.chat.on_token)
        w.chat_done.connect(self.chat.on_done)
        w.chat_changed.connect(self._on_chat_changed)
        w.turn_checked.connect(self._on_turn_checked)
        w.removed.connect(self._on_removed)
        w.collected.connect(self._on_collected)
        w.server_state.connect(self.server.on_state)
        w.server_log.connect(self.server.on_request)
        w.remote_done.connect(self._on_remote_done)
        w.rebuilt.connect(self._on_rebuilt)
        self.client.request_start.emit()

    def stop_worker(self) -> bool:
        stopped = self.client.stop()
        if not stopped:
            self._stuck_clients.append(self.client)  # keep a running QThread referenced until it ends
        return stopped

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        self._closed = True  # signals still queued from the worker are ignored from here on
        self.library_panel.stop()
        self.background.stop()
        self.downloads.stop()  # a download stops at its next block; what came is kept for the next one
        self.stop_worker()  # the server started from the window stops with it (ui/worker_ops.py)
        self.view.close()
        super().closeEvent(event)

    # -- slots ----------------------------------------------------------------------------------
    def _on_ready(self, info: dict) -> None:
        if self._closed:
            return
        self.engine_info = info
        if self._last_good is not None:  # the new settings loaded: now they are kept
            save_settings(self.view.library.root, self.settings)
            if self._last_good.model != self.settings.model:
                self.notify("Model changed", self._model_changed_words(self._last_good, self.settings))
            self._last_good = None
        self.ask_button.setEnabled(True)
        self.model_label.setText(self._model_words())
        self.refresh_picker()
        self.library_panel.fingerprint = info["fingerprint"]
        self.chat.engine_ready(info["fingerprint"], info.get("fingerprint_info", {}))
        self.refresh_library()

    def _on_status(self, message: str) -> None:
        if not self.engine_info:
            self.model_label.setText(message)

    def _on_chat_changed(self, thread_id: int) -> None:
        if not self._closed:
            self.chat.on_changed(thread_id)

    def repair_library(self) -> None:
        """Check every blob and index row; compact old blobs, reclaim leftovers (kvgraft fsck --repair)."""
        self.client.request_repair.emit()

    def collect_garbage(self) -> None:
        """Remove thread states no thread needs and blobs nothing references (kvgraft gc)."""
        self.client.call(WorkerOps.gc)

    def _on_busy(self, busy: bool) -> None:
        self.progress.setVisible(busy)
        self.cancel_button.setVisible(busy)
        self.ask_button.setEnabled(not busy and bool(self.engine_info))
        self.chat.set_busy(busy)
        self.remote.set_busy(busy)
        if busy:
            self.progress.setRange(0, 0)
            self.progress.setFormat("")

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(done)
        self.progress.setFormat(f"{stage} {done}/{total}")
        self.progress.setToolTip(f"{stage} {done}/{total}")

    def _on_token(self, piece: str) -> None:
        self.answer_panel.show_token(piece)

    def _on_answered(self, r: dict) -> None:
        self.answer_panel.show_answer(r)

    def _on_failed(self, op: str, message: str) -> None:
        if op in ("chat", "regenerate"):
            self.chat.on_failed()
        if op == "server":
            self.server.on_failed(message)
        if op == "remote":
            self.remote.on_failed(message)
        if op == "rebuild":
            self.answer_panel.rebuild_done()
        if op == "start":
            self.model_label.setText("model: not loaded")
            if self._last_good is not None:  # a start never stays broken by a setting: back to what loaded
                bad, self.settings, self._last_good = self.settings, self._last_good, None
                self.notify(
                    "Model not loaded",
                    f"{message}\n\nThe settings before the change are back (model "
                    f"{bad.model or 'embedded'} was not kept). Settings... changes them.",
                    error=True,
                )
                self._restart_worker()
                return
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
        return self.library_panel.selected_ids()

    def _push_selected_to_remote(self, name: str) -> None:
        ids = self.selected_ids()
        if ids:
            self.client.call(RemoteOps.remote_push, name, ids)
        else:
            self.remote.nothing_selected()

    def _ask_title(self, title: str) -> None:
        self.question.setText(title)
        self.tabs.setCurrentWidget(self.answer_panel)
        self.ask()

    def _thread_from_entry(self, entry_id: int, title: str) -> None:
        self.tabs.setCurrentWidget(self.chat)
        self.chat.start_from_entry(entry_id, title)

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
        if ids and self.confirm("Delete", f"Delete {counted(len(ids), 'entry')}? Their disk is given back."):
            self.client.call(WorkerOps.remove, ids)

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
        """Use the new settings; they are saved once the engine loads with them, and a load that fails
        brings the previous ones back (a saved setting never leaves the window unable to start)."""
        if new == self.settings:
            return
        self._last_good = self._last_good or self.settings
        self.settings = new
        self._restart_worker()

    def _restart_worker(self) -> None:
        self.engine_info = {}
        self.ask_button.setEnabled(False)
        self.chat.fingerprint = None
        self.model_label.setText("model: loading...")
        self.server.on_state({"running": False})
        self.stop_worker()
        self._start_worker()


def run(argv: list[str] | None = None) -> int:
    """Open the window. Files named on the command line (a file manager's "Open with kvgraft",
    the desktop entry's %F) are opened as if dropped on it."""
    argv = list(sys.argv if argv is None else argv)
    app = QApplication.instance() or QApplication(argv[:1])
    app.setApplicationName("kvgraft")
    collector = GuiCollector(app).start()  # gc off before any thread starts: collections on this thread only
    win = MainWindow()
    win.show()
    files = [a for a in argv[1:] if not a.startswith("-")]
    if files:
        QTimer.singleShot(0, lambda: win.open_files(files))
    code = app.exec()
    close_window(win)
    collector.stop()
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
