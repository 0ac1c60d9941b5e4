"""Answer checkers: is a decoded answer the verified one? One registry, by name (a JSONL's or a pack's
`checker` field, a deposit's --checker).

Every entry point validates a name through `check_name` before anything is stored (deposit, pack
import, problem files, build); an entry stored with a name this version does not know (a pack from a
newer kvgraft) is not an error when it is read: `checker_for` raises `UnknownChecker`, which ask
reports as "not checked" and verify as that entry's failure, never the batch's.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation
from typing import Callable

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _norm(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold().strip()
    return re.sub(r"\s+", " ", text).rstrip(" .")


def first_number(text: str) -> Decimal | None:
    m = _NUMBER.search(text)
    if not m:
        return None
    try:
        return Decimal(m.group(0).replace(",", ""))
    except InvalidOperation:
        return None


def check_exact(answer: str, reference: str) -> bool:
    """Normalized string equality (NFKC, case, whitespace, a trailing period)."""
    return _norm(answer) == _norm(reference)


def check_numeric(answer: str, reference: str) -> bool:
    """The first number in the answer equals the reference number; else normalized equality."""
    ref = first_number(reference)
    got = first_number(answer)
    if ref is not None and got is not None:
        return got == ref
    return check_exact(answer, reference)


def check_final_number(answer: str, reference: str) -> bool:
    """For worked-out text: the last number in it equals the reference (fresh chains of thought)."""
    nums = _NUMBER.findall(answer)
    ref = first_number(reference)
    if not nums or ref is None:
        return False
    try:
        return Decimal(nums[-1].replace(",", "")) == ref
    except InvalidOperation:
        return False


CheckerFn = Callable[[str, str], bool]  # (decoded answer, reference answer) -> equal?

CHECKERS: dict[str, CheckerFn] = {
    "numeric": check_numeric,
    "exact": check_exact,
    "final_number": check_final_number,
}
DEFAULT_CHECKER = "numeric"


class UnknownChecker(ValueError):
    """A checker name this version of kvgraft does not know."""


def check_name(name: str | None) -> str:
    """The checker name to store: `name` if known, the default for None; UnknownChecker otherwise."""
    if name is None:
        return DEFAULT_CHECKER
    if not isinstance(name, str) or name not in CHECKERS:
        raise UnknownChecker(f"unknown checker {str(name)[:40]!r}; known: {', '.join(sorted(CHECKERS))}")
    return name


def checker_for(name: str | None) -> CheckerFn:
    """The checker a stored entry names (the default for none); UnknownChecker for a name not known here."""
    return CHECKERS[check_name(name)]


def get_checker(name: str) -> CheckerFn:
    """The checker called `name` (no default); UnknownChecker for a name not known here."""
    return checker_for(name) if name is not None else checker_for("")
