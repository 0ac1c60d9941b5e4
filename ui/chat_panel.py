"""The Chat tab: threads in a sidebar, the conversation with its replies streaming, Stop and Regenerate.

Threads are `ChatService`'s (app/answer/chat.py): a reply grafts the thread's last stored state and
prefills only the new message, so a thread resumes after a restart where it stopped. Under each reply is
what it took ("resumed 5,210 tokens in 31 ms - 18 prefilled - 24 decoded"); "exact" is written only for a
turn whose check ran ("Check this turn" replays it in a new context and compares the bits).

The panel reads threads and turns on the GUI thread's own connection (`reader`: a Library); every change
goes out as a request to the engine thread (`requested`: a WorkerOps method and its arguments) and comes
back as a worker signal.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from kvgraft.app.answer.chat import thread_listing
from kvgraft.app.answer.elsewhere import differences
from kvgraft.app.core.errors import EntryNotFound
from kvgraft.app.core.words import counted

from .worker_ops import WorkerOps

STOPPED = {"callback": "stopped", "max_tokens": "cut at the token budget", "context_full": "cut: the context is full"}
HINT = (
    "Start a thread: type a message below and press Enter (Shift+Enter for a new line, Esc stops a reply).\n"
    "Its state is stored after each reply, so it resumes where it stopped, after a restart too.\n"
    "To fill the library: drop a .kvpack pack or a document on this window, or File > Import..."
)


class MessageBox(QPlainTextEdit):
    """Enter sends, Shift+Enter is a new line."""

    send = Signal()

    def keyPressEvent(self, event) -> None:  # noqa: N802 (Qt API)
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and not event.modifiers() & Qt.ShiftModifier:
            self.send.emit()
            return
        super().keyPressEvent(event)


def turn_line(t) -> str:
    """A turn's provenance in words, from what it recorded (library/threads.py Turn)."""
    if t.decoded is None:
        return f"{t.n_tokens:,} tokens"
    parts = [
        f"resumed {t.restored:,} tokens in {t.resume_ms:,.0f} ms" if t.restored else "computed from the start",
        f"{t.prefilled:,} tokens prefilled",
        f"{t.decoded} decoded in {t.decode_ms:,.0f} ms",
    ]
    if t.checked == 1:
        parts.append("exact: a replay in a new context gave the same logits and state")
    elif t.checked == 0:
        parts.append("NOT exact: a replay in a new context differs")
    return " - ".join(parts)


class ChatPanel(QWidget):
    requested = Signal(object, list)  # a ui/worker_ops.py WorkerOps method and its arguments
    stop_requested = Signal()

    def __init__(self, reader, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.reader = reader  # a Library on the GUI thread's connection: reads only
        self.fingerprint: str | None = None  # the loaded engine's; None until it is ready
        self.engine_bits: dict = {}
        self.thread_id: int | None = None
        self.pending: dict | None = None  # the reply in progress: {"thread", "user", "text", "regenerate"}
        self.results: dict[tuple[int, int], dict] = {}  # (thread, turn) -> this session's SayResult, for wall time
        self.busy = False
        # what the index held at the last refresh: repaints while a reply streams read no SQL
        self._threads: dict = {}  # id -> Thread
        self._listing: dict[int, dict] = {}  # id -> thread_listing row
        self._turns: list = []  # the shown thread's turns
        self._render_timer = QTimer(self, singleShot=True, interval=40)  # tokens are shown at most 25 times a second
        self._render_timer.timeout.connect(self.render)
        self._build()

    # -- layout ---------------------------------------------------------------------------------------
    def _build(self) -> None:
        split = QSplitter()
        lay = QHBoxLayout(self)
        lay.addWidget(split)
        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        self.thread_list = QListWidget()
        self.thread_list.currentItemChanged.connect(self._on_pick)
        sl.addWidget(self.thread_list, 1)
        row = QHBoxLayout()
        self.new_button = QPushButton("New")
        self.new_button.setToolTip("A new thread with the system prompt below")
        self.new_button.clicked.connect(self.new_thread)
        self.rename_button = QPushButton("Rename")
        self.rename_button.clicked.connect(self._rename)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self._delete)
        for b in (self.new_button, self.rename_button, self.delete_button):
            row.addWidget(b)
        sl.addLayout(row)
        self.storage = QLabel("")
        self.storage.setWordWrap(True)
        sl.addWidget(self.storage)
        split.addWidget(side)

        main = QWidget()
        ml = QVBoxLayout(main)
        ml.setContentsMargins(0, 0, 0, 0)
        self.header = QLabel("")
        self.header.setWordWrap(True)
        ml.addWidget(self.header)
        self.system = QPlainTextEdit()
        self.system.setPlaceholderText("System prompt of a new thread (optional)")
        self.system.setMaximumHeight(54)
        ml.addWidget(self.system)
        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.anchorClicked.connect(self._on_link)
        ml.addWidget(self.view, 1)
        self.input = MessageBox()
        self.input.setPlaceholderText("Message (Enter sends, Shift+Enter a new line, Esc stops)")
        self.input.setMaximumHeight(80)
        self.input.send.connect(self.send)
        ml.addWidget(self.input)
        buttons = QHBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Take back the last reply and answer its message again (sampled)")
        self.regenerate_button.clicked.connect(self.regenerate)
        for b in (self.send_button, self.stop_button, self.regenerate_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        ml.addLayout(buttons)
        split.addWidget(main)
        split.setStretchFactor(1, 1)
        split.setSizes([240, 700])
        # Esc stops a reply from anywhere in the window (a click on Send or Regenerate moves the focus out of
        # the message box, and the disabled button gives it away), and only while a reply streams
        self.esc = QShortcut(QKeySequence(Qt.Key_Escape), self, activated=self.stop, context=Qt.WindowShortcut)
        self._update_buttons()

    # -- what the engine thread says ------------------------------------------------------------------
    def engine_ready(self, fingerprint: str, bits: dict | None = None) -> None:
        self.fingerprint = fingerprint
        self.engine_bits = bits or {}  # the engine's fingerprint info: what a thread's differs in, in words
        self.refresh()

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._update_buttons()

    def on_token(self, thread_id: int, piece: str) -> None:
        if self.pending is not None:
            self.pending["text"] += piece
            if not self._render_timer.isActive():
                self._render_timer.start()

    def on_done(self, r: dict) -> None:
        self.results[(r["thread"], r["turn"])] = r
        self.pending = None
        self.thread_id = r["thread"]
        self.refresh()

    def on_changed(self, thread_id: int) -> None:
        if thread_id >= 0:
            self.thread_id = thread_id
            if self.pending is not None and self.pending["thread"] < 0:
                self.pending["thread"] = thread_id
        self.refresh()

    def on_failed(self) -> None:
        """The reply did not happen (or was refused): what the index holds is shown again."""
        self.pending = None
        self.refresh()

    # -- actions --------------------------------------------------------------------------------------
    def new_thread(self) -> None:
        self.thread_id = None
        self.pending = None
        self._turns = []  # nothing to regenerate, rename or delete in a thread not yet made
        self.thread_list.setCurrentRow(-1)
        self.render()
        self._update_buttons()
        self.input.setFocus()

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.busy or not self.fingerprint or not self._usable(self.thread_id):
            return
        self.input.clear()
        tid = -1 if self.thread_id is None else self.thread_id
        self.pending = {"thread": tid, "user": text, "text": "", "regenerate": False}
        self.requested.emit(WorkerOps.chat_say, [tid, text, self.system.toPlainText().strip()])
        self.render()

    def stop(self) -> None:
        if self.busy:
            self.stop_requested.emit()

    def regenerate(self) -> None:
        turns = self._turns
        if self.thread_id is None or not turns or self.busy or not self._usable(self.thread_id):
            return
        self.pending = {"thread": self.thread_id, "user": turns[-1].user, "text": "", "regenerate": True}
        self.requested.emit(WorkerOps.chat_regenerate, [self.thread_id])
        self.render()

    def fork(self, turn: int) -> None:
        if self.thread_id is not None:
            self.requested.emit(WorkerOps.chat_fork, [self.thread_id, turn])

    def check(self, turn: int) -> None:
        if self.thread_id is not None:
            self.requested.emit(WorkerOps.chat_check, [self.thread_id, turn])

    def start_from_entry(self, entry_id: int, title: str) -> None:
        self.requested.emit(WorkerOps.chat_new, [self.system.toPlainText().strip(), entry_id, title])

    def _rename(self) -> None:
        if self.thread_id is None:
            return
        old = self._threads[self.thread_id].title or ""
        title, ok = QInputDialog.getText(self, "Rename thread", "Title:", text=old)
        if ok:
            self.requested.emit(WorkerOps.chat_rename, [self.thread_id, title])

    def _delete(self) -> None:
        if self.thread_id is None or self.busy:
            return
        if QMessageBox.question(self, "Delete thread", f"Delete thread #{self.thread_id}?") == QMessageBox.Yes:
            self.requested.emit(WorkerOps.chat_delete, [self.thread_id])

    def _on_link(self, url: QUrl) -> None:
        action, _, n = url.toString().partition(":")
        if action == "fork":
            self.fork(int(n))
        elif action == "check":
            self.check(int(n))

    def _on_pick(self, item: QListWidgetItem | None, _prev=None) -> None:
        if item is None:
            return
        tid = item.data(Qt.UserRole)
        if tid != self.thread_id:
            self.thread_id = tid
            self._turns = self.reader.threads.turns(tid)
            self.render()
            self._update_buttons()

    # -- reading the index ------------------------------------------------------------------------------
    def _exists(self, thread_id: int) -> bool:
        return thread_id in self._threads

    def _usable(self, thread_id: int | None) -> bool:
        """A new thread, or one made under the loaded engine (another's state is never grafted)."""
        return thread_id is None or self._threads[thread_id].fingerprint == self.fingerprint

    def refresh(self) -> None:
        """The thread list, then the conversation, from the index."""
        rows = self._listing = {r["thread"]: r for r in thread_listing(self.reader)}
        threads = self._threads = {t.id: t for t in self.reader.threads.list()}
        if self.thread_id is not None and self.thread_id not in threads:  # deleted
            self.thread_id = None
        self._turns = self.reader.threads.turns(self.thread_id) if self.thread_id is not None else []
        self.thread_list.blockSignals(True)
        self.thread_list.clear()
        for tid in sorted(rows, reverse=True):
            r, th = rows[tid], threads[tid]
            other = "  [another model]" if self.fingerprint and th.fingerprint != self.fingerprint else ""
            item = QListWidgetItem(
                f"#{tid} {r['title'] or '(untitled)'}{other}\n"
                f"{counted(r['turns'], 'turn')}, {counted(r['tokens'], 'token')}"
            )
            item.setData(Qt.UserRole, tid)
            self.thread_list.addItem(item)
            if tid == self.thread_id:
                self.thread_list.setCurrentItem(item)
        self.thread_list.blockSignals(False)
        total = sum(r["session_bytes"] for r in rows.values())
        self.storage.setText(f"{counted(len(rows), 'thread')}; their states take {total / 1e6:,.1f} MB" if rows else "")
        self.render()
        self._update_buttons()

    def render(self) -> None:
        tid = self.thread_id
        out: list[str] = []
        turns = []
        if tid is not None and self._exists(tid):
            th = self._threads[tid]
            turns = self._turns
            size = self._listing.get(tid, {}).get("session_bytes", 0)
            head = f"Thread #{tid}: {th.title or '(untitled)'} - {counted(len(turns), 'turn')}"
            head += f", states {size / 1e6:,.1f} MB"
            if th.forked_from:
                head += f" - forked from #{th.forked_from} at turn {th.fork_turn}"
            if th.from_entry_id:
                head += f" - started from entry #{th.from_entry_id}"
            if self.fingerprint and th.fingerprint != self.fingerprint:
                why = differences(self.reader.engines().get(th.fingerprint), self.engine_bits)
                head += (
                    f"\n{why[0].upper()}{why[1:]}: its states are not grafted under these settings. "
                    "Open it with the settings it was made with (File > Settings...)."
                )
            self.header.setText(head)
            self.system.setPlainText(th.system or "")
            self.system.setReadOnly(True)
            self.system.setPlaceholderText("(this thread has no system prompt)")
        else:
            self.header.setText("New thread" if self.fingerprint else "model: loading...")
            if self.system.isReadOnly():
                self.system.clear()
            self.system.setReadOnly(False)
            self.system.setPlaceholderText("System prompt of a new thread (optional)")
            if not self.pending:
                out.append(f"<p style='color:#666'>{html.escape(HINT).replace(chr(10), '<br>')}</p>")
        p = self.pending
        if tid is not None and self._exists(tid) and self._threads[tid].from_entry_id and not turns and not p:
            out.append(self._from_entry_html(self._threads[tid].from_entry_id))
        if p and p["regenerate"] and turns:
            turns = turns[:-1]
        for t in turns:
            out.append(self._turn_html(tid, t))
        if p and (p["thread"] == tid or (p["thread"] < 0 and tid is None)):
            out.append(f"<p><b>You:</b> {_text(p['user'])}</p><p><b>Model:</b> {_text(p['text'])}&#9608;</p>")
        self.view.setHtml("".join(out))
        self.view.verticalScrollBar().setValue(self.view.verticalScrollBar().maximum())

    def _from_entry_html(self, entry_id: int) -> str:
        """A thread started from an entry, before its first message: what the model has read."""
        try:
            e = self.reader.get(entry_id)
            what = f"entry #{entry_id}, {html.escape(e.title or e.kind)} ({counted(e.n_tokens, 'token')})"
        except EntryNotFound:
            what = f"entry #{entry_id} (deleted since)"
        return (
            f"<p style='color:#666'>This thread starts from {what}: the model has read it, and its state is "
            "grafted when you send the first message (nothing of it is computed again). Ask about it below.</p>"
        )

    def _turn_html(self, tid: int, t) -> str:
        r = self.results.get((tid, t.n))
        line = turn_line(t)
        if r is not None:
            line += f" - {r['wall_ms'] / 1e3:,.2f} s in all"
        ended = r["stop_reason"] if r is not None else t.stop_reason  # recorded with the turn: after a restart too
        if ended in STOPPED:
            line += f" - {STOPPED[ended]}"
        if t.regenerated:
            line += " - regenerated"
        links = f"<a href='fork:{t.n}'>Fork from here</a>"
        if t.decoded is not None:
            links += f" &middot; <a href='check:{t.n}'>Check this turn</a>"
        return (
            f"<p><b>You:</b> {_text(t.user)}</p><p><b>Model:</b> {_text(t.reply.strip())}</p>"
            f"<p style='color:#666; font-size:small'>turn {t.n}: {html.escape(line)}<br>{links}</p>"
        )

    def _update_buttons(self) -> None:
        ready = bool(self.fingerprint) and not self.busy
        usable = self.thread_id is None or (self._exists(self.thread_id) and self._usable(self.thread_id))
        has_turns = usable and self.thread_id is not None and bool(self._turns)
        self.send_button.setEnabled(ready and usable)
        self.stop_button.setEnabled(self.busy and self.pending is not None)
        self.esc.setEnabled(self.busy and self.pending is not None)
        self.regenerate_button.setEnabled(ready and has_turns)
        self.rename_button.setEnabled(self.thread_id is not None and not self.busy)
        self.delete_button.setEnabled(self.thread_id is not None and not self.busy)


def _text(s: str) -> str:
    return html.escape(s).replace("\n", "<br>")
