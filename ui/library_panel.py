"""The Library tab: search as you type, the entries table, an entry opened up, and what can be done to a
selection (ask it, start a thread from it, verify, export, delete). Reads on the GUI thread's connection
(app/library_view.py); actions go out as signals the window sends to the engine thread."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from .entry_detail import EntryDetail
from .library_table import EntriesModel, sorted_view


class LibraryPanel(QWidget):
    ask_requested = Signal(str)  # the selected entry's title
    thread_requested = Signal(int, str)  # entry id, title
    verify_requested = Signal()
    export_requested = Signal()
    delete_requested = Signal()
    search_changed = Signal()

    def __init__(self, view, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view = view  # app/library_view.LibraryView: reads only
        self.fingerprint: str | None = None
        lay = QVBoxLayout(self)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search titles, questions and texts")
        self._search_timer = QTimer(self, singleShot=True, interval=250)
        self._search_timer.timeout.connect(self.search_changed.emit)
        self.search.textChanged.connect(lambda _t: self._search_timer.start())
        lay.addWidget(self.search)
        split = QSplitter()
        self.entries = EntriesModel()
        self.proxy = sorted_view(self.entries)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.setSelectionBehavior(QTableView.SelectRows)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.setWordWrap(True)  # a long title wraps in its stretched column: nothing elided
        self.table.sortByColumn(0, Qt.AscendingOrder)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.Stretch)
        self.table.setTextElideMode(Qt.ElideNone)
        self.table.selectionModel().selectionChanged.connect(lambda *_: self.show_detail())
        split.addWidget(self.table)
        self.detail = EntryDetail()
        self.detail.start_thread.connect(self.thread_requested.emit)
        split.addWidget(self.detail)
        split.setSizes([620, 380])
        lay.addWidget(split, 1)
        row = QHBoxLayout()
        for text, slot in (
            ("Ask it", self._ask_selected),
            ("Verify selected", self.verify_requested.emit),
            ("Export selected...", self.export_requested.emit),
            ("Delete", self.delete_requested.emit),
        ):
            b = QPushButton(text)
            b.clicked.connect(slot)
            row.addWidget(b)
        row.addStretch(1)
        lay.addLayout(row)
        self.show_detail()

    def stop(self) -> None:
        self._search_timer.stop()

    def selected_ids(self) -> list[int]:
        rows = {self.proxy.mapToSource(i).row() for i in self.table.selectionModel().selectedRows()}
        return [self.entries.row_at(r).id for r in sorted(rows)]

    def set_rows(self, rows: list) -> None:
        keep = self.selected_ids()
        self.entries.set_rows(rows)
        if keep and not any(r.id == keep[0] for r in rows):
            keep = []
        self.show_detail(keep[0] if keep else None)

    def show_detail(self, entry_id: int | None = None) -> None:
        ids = self.selected_ids()
        entry_id = ids[0] if ids else entry_id
        row = next((r for r in self.entries._rows if r.id == entry_id), None)
        self.detail.show_entry(
            self.view.library, entry_id if row else None, self.fingerprint, bool(row and row.graftable)
        )

    def _ask_selected(self) -> None:
        ids = self.selected_ids()
        if ids:
            row = next(r for r in self.entries._rows if r.id == ids[0])
            self.ask_requested.emit(row.title)
