"""The Remote tab: the team library on S3 storage (docs/remote-format.md), from the window.

Add a remote (its bucket is checked with the credentials boto3 finds: environment, profile,
~/.aws), push the entries selected in the Library tab or all of them, pull with progress and Cancel
(the status bar's), optionally only what a key you trust signed. What each run did is logged below,
refusals with their reasons.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from kvgraft.app.core.words import counted

from .remote_ops import RemoteOps


def done_lines(r: dict) -> list[str]:
    """What a push or pull did, in words (the log's lines)."""
    if r["op"] == "push":
        sent = f"{r['bytes'] / 1e6:.1f} MB sent"
        lines = [f"pushed {counted(r['pushed'], 'entry')} to {r['name']} ({sent}), {r['skipped']} already there"]
        lines += [f"  left out entry {n['entry']}: {n['reason']}" for n in r["not_pushable"]]
        return lines
    if r["op"] == "pull":
        how = ", ".join(f"{n} {p}" for p, n in sorted(r["proof"].items()))
        lines = [
            f"pulled {counted(r['imported'], 'entry')} from {r['name']} ({r['bytes'] / 1e6:.1f} MB)"
            + (f" [{how}]" if how else "")
            + f", {r['skipped']} already here, {len(r['refused'])} refused"
        ]
        return lines + [f"  refused {x['entry']}: {x['reason']}" for x in r["refused"]]
    if r["op"] == "add":
        return [f"added {r['name']}: {r['url']} (bucket reachable)"]
    return [f"forgot {r['name']} (the bucket was not touched)"]


class RemotePanel(QWidget):
    requested = Signal(object, list)  # a ui/remote_ops.py RemoteOps method and its arguments
    push_selected_requested = Signal(str)  # the remote's name; the window adds the Library tab's selection

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Remote", "Bucket and prefix", "Endpoint"])
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)  # no header or cell cut (tests/layout_check.py)
        header.setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        lay.addWidget(self.table, 1)
        form = QFormLayout()
        self.name = QLineEdit()
        self.name.setPlaceholderText("team")
        self.url = QLineEdit()
        self.url.setPlaceholderText("s3://bucket/prefix")
        self.endpoint = QLineEdit()
        self.endpoint.setPlaceholderText("empty for AWS; http://host:port for MinIO, Ceph, R2, SeaweedFS")
        form.addRow("Name", self.name)
        form.addRow("URL", self.url)
        form.addRow("Endpoint", self.endpoint)
        lay.addLayout(form)
        row = QHBoxLayout()
        self.add_button = QPushButton("Add remote")
        self.add_button.clicked.connect(self._add)
        self.remove_button = QPushButton("Forget remote")
        self.remove_button.clicked.connect(lambda: self._op(RemoteOps.remote_rm, []))
        self.push_selected = QPushButton("Push selected entries")
        self.push_selected.setToolTip("The entries selected in the Library tab")
        self.push_selected.clicked.connect(self._push_selected)
        self.push_all = QPushButton("Push all")
        self.push_all.clicked.connect(lambda: self._op(RemoteOps.remote_push, [[]]))
        self.pull_button = QPushButton("Pull")
        self.pull_button.clicked.connect(lambda: self._op(RemoteOps.remote_pull, [self.require_signed.isChecked()]))
        self.require_signed = QCheckBox("only what a key I trust signed")
        for w in (self.add_button, self.remove_button, self.push_selected, self.push_all, self.pull_button):
            row.addWidget(w)
        row.addWidget(self.require_signed)
        row.addStretch(1)
        lay.addLayout(row)
        self.state = QLabel("Credentials come from boto3's usual places: AWS_ACCESS_KEY_ID, AWS_PROFILE, ~/.aws.")
        self.state.setWordWrap(True)
        lay.addWidget(self.state)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(5000)
        lay.addWidget(self.log, 1)
        self.busy = False
        self._update_buttons()

    # -- state -----------------------------------------------------------------------------------
    def on_remotes(self, rows: list[dict]) -> None:
        keep = self.current_name()
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            for j, text in enumerate((r["name"], r["url"], r["endpoint_url"] or "AWS")):
                self.table.setItem(i, j, QTableWidgetItem(text))
            if r["name"] == keep or (keep is None and i == 0):
                self.table.selectRow(i)
        self._update_buttons()

    def current_name(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        return self.table.item(rows[0].row(), 0).text() if rows else None

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._update_buttons()

    def _update_buttons(self) -> None:
        chosen = self.current_name() is not None and not self.busy
        for w in (self.remove_button, self.push_selected, self.push_all, self.pull_button):
            w.setEnabled(chosen)
        self.add_button.setEnabled(not self.busy)

    def on_done(self, r: dict) -> None:
        for line in done_lines(r):
            self.log.appendPlainText(f"{time.strftime('%H:%M:%S')}  {line}")
        self.state.setText(done_lines(r)[0])
        if r["op"] == "add":
            self.name.clear()
            self.url.clear()
            self.endpoint.clear()

    def on_failed(self, message: str) -> None:
        self.log.appendPlainText(f"{time.strftime('%H:%M:%S')}  {message}")
        self.state.setText(message)

    # -- requests --------------------------------------------------------------------------------
    def _op(self, op, args: list) -> None:
        name = self.current_name()
        if name is not None:
            self.requested.emit(op, [name, *args])

    def _add(self) -> None:
        name, url = self.name.text().strip(), self.url.text().strip()
        if not name or not url:
            self.state.setText("A remote needs a name and an s3://bucket[/prefix] URL.")
            return
        self.requested.emit(RemoteOps.remote_add, [name, url, self.endpoint.text().strip()])

    def _push_selected(self) -> None:
        name = self.current_name()
        if name is not None:
            self.push_selected_requested.emit(name)

    def nothing_selected(self) -> None:
        self.state.setText("Select entries in the Library tab first (or Push all).")
