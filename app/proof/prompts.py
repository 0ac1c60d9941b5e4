"""The prompt formats that define receipts: what is prefilled for a solution, a question and a document.

Changing any of these changes the tokens an entry's receipt and schedule describe, so it changes
what "the same question" and "a replay" mean for every stored entry: treat them as a contract.

The stored text of a solution puts a short "Q: ... / A: <answer>" pair before and after the worked
solution, and the question asked after a graft repeats that pattern ("Q: <question> / A:"), so the
model continues with the verified answer and a newline (FINDINGS.md: 12 of 12 on held-out problems
with Gemma 3 270M, about 6 decode tokens each).
"""

from __future__ import annotations

QA_FORMAT = "qa-v1"  # the name of these formats, as `ask --json` reports it (prompt_format)


def solution_text(question: str, solution: str, answer: str) -> str:
    """The text deposited (prefilled) for a verified solution."""
    return (
        f"Q: {question.strip()}\nA: {answer.strip()}\n\nWorked solution:\n{solution.strip()}\n\nQ: "
        f"{question.strip()}\nA: {answer.strip()}\n"
    )


def ask_suffix(question: str) -> str:
    """Prefilled after grafting a solution: the model's next tokens are the answer, then a newline."""
    return f"\nQ: {question.strip()}\nA:"


def fresh_prompt(question: str) -> str:
    """The prompt when nothing is in the library: the model has to work it out itself."""
    return f"Q: {question.strip()}\nA: Let's work it out step by step.\n"


# A model with a chat template (an instruct model) is asked a fresh question through its template
# instead (app/answer/ask.py, app/proof/chat_format.py); grafts keep these formats: they define the receipts.
DOCUMENT_PROBE = "\n\nQ: What is the text above about?\nA:"
