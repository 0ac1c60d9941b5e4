"""Problems and problem files (JSONL): one verified question, worked solution, answer and checker each.

The text formats a problem is stored and asked in are in app/proof/prompts.py. Answers are plain integers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvgraft.app.proof.checkers import DEFAULT_CHECKER, UnknownChecker, check_name


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    solution: str
    answer: str
    checker: str = DEFAULT_CHECKER

    def as_json(self) -> dict:
        return {
            "id": self.id,
            "question": self.question,
            "solution": self.solution,
            "answer": self.answer,
            "checker": self.checker,
        }


def read_jsonl(path: Path) -> list[Problem]:
    """Problems from a JSONL source pack: one {question, solution, answer[, id, checker]} per line.
    ValueError names the file and line of the first bad one (UnknownChecker for a checker not known here)."""
    out = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: expected an object")
        missing = [
            k
            for k in ("question", "solution", "answer")
            if not isinstance(obj.get(k), (str, int, float)) or str(obj.get(k)).strip() == ""
        ]
        if missing:
            raise ValueError(f"{path}:{lineno}: missing or empty {', '.join(missing)}")
        try:
            checker = check_name(obj.get("checker"))
        except UnknownChecker as exc:
            raise UnknownChecker(f"{path}:{lineno}: {exc}") from None
        out.append(
            Problem(
                id=str(obj.get("id", f"line-{lineno}")),
                question=str(obj["question"]),
                solution=str(obj["solution"]),
                answer=str(obj["answer"]).strip(),
                checker=checker,
            )
        )
    if not out:
        raise ValueError(f"{path}: no problems in the file")
    return out


def write_jsonl(problems: list[Problem], path: Path) -> None:
    Path(path).write_text("".join(json.dumps(p.as_json()) + "\n" for p in problems), encoding="utf-8")
