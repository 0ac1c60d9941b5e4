"""Answer checkers: is a decoded answer the verified one? Pluggable by name (a JSONL `checker` field)."""

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


CHECKERS: dict[str, Callable[[str, str], bool]] = {
    "numeric": check_numeric,
    "exact": check_exact,
    "final_number": check_final_number,
}


def get_checker(name: str) -> Callable[[str, str], bool]:
    try:
        return CHECKERS[name]
    except KeyError:
        raise ValueError(f"unknown checker {name!r}; known: {', '.join(sorted(CHECKERS))}") from None
