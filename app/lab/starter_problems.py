"""The demo's and the benchmarks' starter problems: generated, so their answers are computed (verified by
construction)."""

from __future__ import annotations

import random

from kvgraft.app.proof.problems import Problem

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
