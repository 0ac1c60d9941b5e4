"""Counts in words, as the window and the CLI show them: "1 entry", "9 entries", "1 thread"."""

from __future__ import annotations


def plural(noun: str) -> str:
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
        return noun[:-1] + "ies"
    return noun + ("es" if noun.endswith(("s", "sh", "ch", "x")) else "s")


def counted(n: int, noun: str) -> str:
    """`n` and the noun, singular for exactly one ("1 entry", "0 entries", "1,234 turns")."""
    return f"{n:,} {noun if n == 1 else plural(noun)}"
