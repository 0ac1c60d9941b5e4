"""The deliberate confirmation before a fresh answer is deposited as a solution the user vouches for.

The whole answer is shown (it is what gets stored as the solution), the short answer a checker will
compare later answers with can be corrected, and nothing is deposited until the user ticks "I checked
this answer is right". Cancel is the default button: Enter alone never deposits.
"""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)


class DepositAnswerDialog(QDialog):
    def __init__(self, question: str, answer: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Confirm and deposit")
        self.resize(640, 480)
        lay = QVBoxLayout(self)
        self.intro = intro = QLabel(
            "Nothing is stored yet. Deposit stores this answer as a solution verified by you: asked again, "
            "the question is answered from it. Read the whole answer first."
        )
        intro.setWordWrap(True)
        lay.addWidget(intro)
        self.question = QLabel(f"Question: {question}")
        self.question.setWordWrap(True)
        lay.addWidget(self.question)
        self.answer_text = QPlainTextEdit(answer)  # the whole answer: it is stored as the solution
        self.answer_text.setReadOnly(True)
        lay.addWidget(self.answer_text, 1)
        lay.addWidget(QLabel("The right answer (a checker compares later answers with it; confirm or correct it):"))
        lines = answer.strip().splitlines()
        self.final_answer = QLineEdit(lines[0].strip() if lines else "")
        lay.addWidget(self.final_answer)
        self.checked = QCheckBox("I checked this answer is right")
        lay.addWidget(self.checked)
        buttons = QDialogButtonBox()
        self.cancel_button = buttons.addButton(QDialogButtonBox.Cancel)
        self.deposit_button = buttons.addButton("Deposit", QDialogButtonBox.AcceptRole)
        self.deposit_button.setAutoDefault(False)
        self.cancel_button.setDefault(True)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.checked.toggled.connect(self._update)
        self.final_answer.textChanged.connect(self._update)
        self._update()

    def confirmed(self) -> bool:
        """The box is ticked and the right answer is not empty."""
        return self.checked.isChecked() and bool(self.final_answer.text().strip())

    def vouched_answer(self) -> str:
        return self.final_answer.text().strip()

    def _update(self) -> None:
        self.deposit_button.setEnabled(self.confirmed())

    def accept(self) -> None:
        if not self.confirmed():  # however it was reached (a shortcut, a script): no deposit unconfirmed
            return
        super().accept()
