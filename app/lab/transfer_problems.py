"""Word-problem families whose answers a program computes, for the held-out transfer experiment.

Each family makes problems from a seed: the words stay, the numbers and names change. For every family
the experiment stores one problem with its worked solution (written by the same program, its answer
computed, so the checker vouches for it) and asks others of the family held out: new numbers, new names.
The worked solution shows the steps a reader needs for any problem of the family.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

NAMES = (
    "Ana", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Luca", "Maya",
    "Nils", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wes", "Yara", "Zoe",
)  # fmt: skip
GOODS = ("sacks of rice", "crates of apples", "boxes of nails", "bags of cement", "rolls of cloth", "barrels of oil")
PLACES = ("warehouse", "depot", "storeroom", "granary", "shop", "yard")
ITEMS = ("jacket", "lamp", "bicycle", "kettle", "backpack", "chair", "camera", "tent")
JOBS = ("paint a fence", "fill a tank", "sort the mail", "mow a field", "tile a floor", "pack an order")


@dataclass(frozen=True)
class FamilyProblem:
    family: str
    question: str
    solution: str  # worked steps, ending with the answer line
    answer: str


def _stock(r: random.Random) -> FamilyProblem:
    place, goods = r.choice(PLACES), r.choice(GOODS)
    start, inn, out, days = r.randrange(600, 2400, 10), r.randrange(15, 60), r.randrange(20, 80), r.randrange(5, 20)
    while out == inn:
        out = r.randrange(20, 80)
    change = inn - out
    end = start + days * change
    q = (
        f"A {place} holds {start} {goods}. Every day it receives {inn} {goods} and ships out {out}. "
        f"How many {goods} does it hold at the end of day {days}?"
    )
    s = (
        f"Each day the stock changes by {inn} - {out} = {change}.\n"
        f"After {days} days it changes by {days} × {change} = {days * change}.\n"
        f"At the end of day {days}: {start} + ({days * change}) = {end}."
    )
    return FamilyProblem("stock", q, s + f"\nAnswer: {end}", str(end))


def _ages(r: random.Random) -> FamilyProblem:
    a, b = r.sample(NAMES, 2)
    young, k, years = r.randrange(4, 16), r.randrange(2, 5), r.randrange(2, 12)
    old = k * young
    total = old + young
    q = f"{a} is {k} times as old as {b}. Together they are {total} years old. How old will {a} be in {years} years?"
    s = (
        f"Let {b}'s age be x; then {a}'s age is {k}x.\n"
        f"x + {k}x = {k + 1}x = {total}, so x = {total} / {k + 1} = {young}.\n"
        f"{a} is {k} × {young} = {old} now, so in {years} years {a} will be {old} + {years} = {old + years}."
    )
    return FamilyProblem("ages", q, s + f"\nAnswer: {old + years}", str(old + years))


def _work(r: random.Random) -> FamilyProblem:
    a, b = r.sample(NAMES, 2)
    job = r.choice(JOBS)
    pairs = [(x, y) for x in range(2, 13) for y in range(x + 1, 16) if (60 * x * y) % (x + y) == 0]
    ta, tb = r.choice(pairs)
    minutes = 60 * ta * tb // (ta + tb)
    q = (
        f"{a} can {job} alone in {ta} hours, and {b} can do it alone in {tb} hours. "
        f"Working together, how many minutes do they take?"
    )
    s = (
        f"{a} does 1/{ta} of the job per hour and {b} does 1/{tb}.\n"
        f"Together: 1/{ta} + 1/{tb} = {ta + tb}/{ta * tb} of the job per hour.\n"
        f"Time = {ta * tb}/{ta + tb} hours = 60 × {ta * tb} / {ta + tb} minutes = {minutes} minutes."
    )
    return FamilyProblem("work together", q, s + f"\nAnswer: {minutes}", str(minutes))


def _discount(r: random.Random) -> FamilyProblem:
    item = r.choice(ITEMS)
    price = 100 * r.randrange(1, 10)
    d, e = 10 * r.randrange(1, 5), 10 * r.randrange(1, 4)
    first = price * (100 - d) // 100
    final = first * (100 - e) // 100
    q = (
        f"A {item} costs ${price}. The shop takes {d}% off, then a further {e}% off the reduced price. "
        f"What is the final price in dollars?"
    )
    s = (
        f"After {d}% off: {price} × {100 - d}/100 = {first}.\n"
        f"After a further {e}% off: {first} × {100 - e}/100 = {final}."
    )
    return FamilyProblem("discounts", q, s + f"\nAnswer: {final}", str(final))


def _distance(r: random.Random) -> FamilyProblem:
    name = r.choice(NAMES)
    v1, t1, v2, t2 = r.randrange(40, 110, 5), r.randrange(2, 6), r.randrange(30, 90, 5), r.randrange(1, 5)
    total = v1 * t1 + v2 * t2
    q = (
        f"{name} drives at {v1} km/h for {t1} hours, then at {v2} km/h for {t2} hours. "
        f"How many kilometers does {name} drive in total?"
    )
    s = (
        f"First part: {v1} × {t1} = {v1 * t1} km.\n"
        f"Second part: {v2} × {t2} = {v2 * t2} km.\n"
        f"Total: {v1 * t1} + {v2 * t2} = {total} km."
    )
    return FamilyProblem("distances", q, s + f"\nAnswer: {total}", str(total))


def _mixture(r: random.Random) -> FamilyProblem:
    while True:
        vol, c1, c2 = r.randrange(10, 80, 5), r.randrange(10, 40, 2), r.randrange(4, 20, 2)
        if c2 < c1 and (vol * c1) % c2 == 0:
            break
    salt = vol * c1 / 100
    final = vol * c1 // c2
    q = (
        f"A tank holds {vol} liters of brine that is {c1}% salt. How many liters of pure water must be added "
        f"to make it {c2}% salt?"
    )
    s = (
        f"The salt stays the same: {vol} × {c1}/100 = {salt:g} liters of salt.\n"
        f"At {c2}% the total must be {salt:g} / ({c2}/100) = {final} liters.\n"
        f"Water to add: {final} - {vol} = {final - vol} liters."
    )
    return FamilyProblem("mixtures", q, s + f"\nAnswer: {final - vol}", str(final - vol))


def _units(r: random.Random) -> FamilyProblem:
    while True:
        ml, hours = r.randrange(5, 60), r.randrange(2, 48)
        if (ml * 60 * hours) % 1000 == 0:
            break
    liters = ml * 60 * hours // 1000
    q = f"A leaking tap drips {ml} milliliters every minute. How many liters does it drip in {hours} hours?"
    s = (
        f"{hours} hours = {hours} × 60 = {hours * 60} minutes.\n"
        f"{ml} × {hours * 60} = {ml * hours * 60} milliliters.\n"
        f"{ml * hours * 60} / 1000 = {liters} liters."
    )
    return FamilyProblem("unit conversions", q, s + f"\nAnswer: {liters}", str(liters))


FAMILIES: dict[str, Callable[[random.Random], FamilyProblem]] = {
    "stock": _stock,
    "ages": _ages,
    "work together": _work,
    "discounts": _discount,
    "distances": _distance,
    "mixtures": _mixture,
    "unit conversions": _units,
}


def family_sets(seed: int, held_out: int) -> tuple[list[FamilyProblem], list[FamilyProblem]]:
    """(one stored problem per family, `held_out` others per family), all distinct, from `seed`."""
    r = random.Random(seed)
    stored, held = [], []
    for make in FAMILIES.values():
        seen: set[str] = set()
        made = []
        while len(made) < held_out + 1:
            p = make(r)
            if p.question not in seen and p.answer not in {m.answer for m in made[:1]}:
                seen.add(p.question)
                made.append(p)
        stored.append(made[0])
        held.extend(made[1:])
    return stored, held
