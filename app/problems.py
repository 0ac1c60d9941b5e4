"""Verified-by-construction problems (the starter set's generator) and problem files (JSONL).

The text formats a problem is stored and asked in are in app/prompts.py. Answers are plain integers.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    solution: str
    answer: str
    checker: str = "numeric"

    def as_json(self) -> dict:
        return {
            "id": self.id,
            "question": self.question,
            "solution": self.solution,
            "answer": self.answer,
            "checker": self.checker,
        }


# The starter problems' answers are computed by their generator (below), a program: it vouches for them.
GENERATOR = "generator:starter-problems"

# -- the generator ---------------------------------------------------------------------------

_PLACES = [
    "depot",
    "warehouse",
    "harbor store",
    "mountain hut",
    "village granary",
    "river mill",
    "market stall",
    "rail yard",
]
_ITEMS = [
    ("crates", "crate"),
    ("sacks of grain", "sack"),
    ("barrels", "barrel"),
    ("boxes of tea", "box"),
    ("bales of wool", "bale"),
]


def _problem(rng: random.Random, idx: int, days: int) -> Problem:
    place = rng.choice(_PLACES)
    items, _ = rng.choice(_ITEMS)
    start = rng.randint(700, 1500)  # the deepest possible dip is about 630: answers stay positive
    first_in = rng.randint(5, 30)
    growth = rng.randint(1, 6)
    out = rng.randint(10, 40)
    question = (
        f"A {place} starts with {start} {items}. On day 1 it receives {first_in} {items}, and each later day it "
        f"receives {growth} more than the day before. Every day it ships out {out} {items}. "
        f"How many {items} does it hold at the end of day {days}?"
    )
    lines = [f"We follow the stock day by day, starting from {start} {items}."]
    stock = start
    received = first_in
    for day in range(1, days + 1):
        if day > 1:
            received += growth
        new = stock + received - out
        lines.append(
            f"Day {day}: it receives {received} and ships {out}, so {stock} + {received} - {out} = {new} {items}."
        )
        stock = new
    lines.append(f"At the end of day {days} the {place} holds {stock} {items}.")
    return Problem(id=f"depot-{idx:03d}", question=question, solution="\n".join(lines), answer=str(stock))


def starter_problems(n: int = 24, seed: int = 2026) -> list[Problem]:
    """n problems whose worked solutions run from ~200 to ~2,500 tokens; answers computed, so verified.

    Day counts are spread so that at least a quarter of the stored solution texts are past the
    512-token sliding window (each day adds about 40 tokens).
    """
    rng = random.Random(seed)
    days = [3 + (55 * i) // max(1, n - 1) for i in range(n)]
    rng.shuffle(days)
    return [_problem(rng, i + 1, d) for i, d in enumerate(days)]


def read_jsonl(path: Path) -> list[Problem]:
    """Problems from a JSONL source pack: one {question, solution, answer[, id, checker]} per line."""
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
        out.append(
            Problem(
                id=str(obj.get("id", f"line-{lineno}")),
                question=str(obj["question"]),
                solution=str(obj["solution"]),
                answer=str(obj["answer"]).strip(),
                checker=str(obj.get("checker", "numeric")),
            )
        )
    if not out:
        raise ValueError(f"{path}: no problems in the file")
    return out


def write_jsonl(problems: list[Problem], path: Path) -> None:
    Path(path).write_text("".join(json.dumps(p.as_json()) + "\n" for p in problems), encoding="utf-8")
