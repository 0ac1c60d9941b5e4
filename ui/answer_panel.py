"""The Ask tab: a question, the answer as it streams, where it came from, and its deposit as a solution.

It receives `AskResult.as_dict()` (app/answer/result.py) plus its provenance line. Only an answer the
result calls `depositable` (a fresh or prefix answer that ended by itself, not cancelled, not cut at the
token budget) may be deposited, and only after the deliberate confirmation of ui/deposit_dialog.py.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from kvgraft.app.core.words import counted

from .deposit_dialog import DepositAnswerDialog

# why an answer that did not end by itself is shown marked (and cannot be deposited)
ENDED_EARLY = {
    "callback": "(stopped: the answer is what was decoded until you pressed Cancel)",
    "max_tokens": "(cut at the token budget: unfinished, or looping)",
    "context_full": "(cut: the context is full)",
}


class AnswerPanel(QWidget):
    ask_requested = Signal(str)  # the question
    deposit_requested = Signal(str, str, str)  # question, solution (the whole answer), the answer vouched for
    rebuild_requested = Signal(list)  # entry ids made under other settings that hold the last question

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.last_answer: dict | None = None
        self._elsewhere: list[int] = []
        lay = QVBoxLayout(self)
        row = QHBoxLayout()
        self.question = QLineEdit()
        self.question.setPlaceholderText(
            "Ask a question (answered by graft when the library holds a proven entry for it)"
        )
        self.question.returnPressed.connect(self.ask)
        self.ask_button = QPushButton("Ask")
        self.ask_button.clicked.connect(self.ask)
        self.ask_button.setEnabled(False)
        row.addWidget(self.question, 1)
        row.addWidget(self.ask_button)
        lay.addLayout(row)
        self.answer_view = QPlainTextEdit()
        self.answer_view.setReadOnly(True)
        lay.addWidget(self.answer_view, 1)
        self.answer_state = QLabel("")  # "(stopped...)", "(cut at the token budget...)" or nothing
        self.answer_state.hide()
        lay.addWidget(self.answer_state)
        self.provenance = QLabel("")
        self.provenance.setWordWrap(True)
        self.provenance.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.provenance)
        self.elsewhere = QLabel("")  # entries made under other settings that hold the question, named
        self.elsewhere.setWordWrap(True)
        self.elsewhere.hide()
        lay.addWidget(self.elsewhere)
        self.rebuild_button = QPushButton("")
        self.rebuild_button.hide()
        self.rebuild_button.clicked.connect(self._rebuild)
        lay.addWidget(self.rebuild_button, 0, Qt.AlignLeft)
        self.deposit_button = QPushButton("Confirm and deposit this answer...")
        self.deposit_button.setEnabled(False)
        self.deposit_button.clicked.connect(self.deposit_answer)
        lay.addWidget(self.deposit_button, 0, Qt.AlignLeft)

    def ask(self) -> None:
        q = self.question.text().strip()
        if not q:
            return
        self.answer_view.clear()
        self.provenance.setText("")
        self.show_elsewhere([])
        self._set_state("")
        self.deposit_button.setEnabled(False)
        self.ask_requested.emit(q)

    def show_token(self, piece: str) -> None:
        self.answer_view.moveCursor(self.answer_view.textCursor().MoveOperation.End)
        self.answer_view.insertPlainText(piece)

    def show_answer(self, r: dict) -> None:
        self.last_answer = r
        self.answer_view.setPlainText(r["answer"])
        text = r["provenance"]
        if r.get("wall_ms") is not None:
            text += f" - {r['wall_ms'] / 1e3:,.2f} s in all"
        if r["verified_answer"] is not None:
            text += (
                f"\nverified answer ({r['verified_by']}): {r['verified_answer']} "
                f"({'matches' if r['answer_checked'] else 'does NOT match'})"
            )
        elif r.get("stored_answer") is not None and r.get("matched_question") is None:  # else in the provenance
            text += f"\nstored answer (stated, not verified): {r['stored_answer']}"
        self.provenance.setText(text)
        self.show_elsewhere(r.get("made_elsewhere") or [])
        self._set_state(ENDED_EARLY.get(r["stop_reason"], ""))
        self.deposit_button.setEnabled(bool(r.get("depositable")))

    def show_elsewhere(self, made: list[dict]) -> None:
        """Name the entries made under other settings that hold the question, and offer their rebuild."""
        self._elsewhere = [m["entry_id"] for m in made]
        self.elsewhere.setText(
            "\n".join(f"{m['kind'].capitalize()} #{m['entry_id']} holds this but was {m['why']}." for m in made)
        )
        self.elsewhere.setVisible(bool(made))
        self.rebuild_button.setText(f"Rebuild {counted(len(made), 'entry')} for these settings")
        self.rebuild_button.setToolTip("Computed here from their texts (proof local), then asked again")
        self.rebuild_button.setVisible(bool(made))

    def _rebuild(self) -> None:
        if self._elsewhere:
            self.rebuild_button.setEnabled(False)
            self.rebuild_requested.emit(list(self._elsewhere))

    def rebuild_done(self) -> None:
        self.rebuild_button.setEnabled(True)

    def _set_state(self, text: str) -> None:
        self.answer_state.setText(text)
        self.answer_state.setVisible(bool(text))

    def deposit_answer(self) -> None:
        """Deposit the last answer as a solution the user vouches for, once they confirmed it deliberately."""
        r = self.last_answer
        if not r or not r.get("depositable"):
            return
        dlg = DepositAnswerDialog(r["question"], r["answer"], self)
        try:
            if dlg.exec() == QDialog.Accepted and dlg.confirmed():
                self.deposit_requested.emit(r["question"], r["answer"], dlg.vouched_answer())
        finally:
            dlg.deleteLater()
