"""Question normalization: the key for exact lookup."""

from __future__ import annotations

import re
import unicodedata

_SPACE = re.compile(r"\s+")


def question_key(question: str) -> str:
    """NFKC, case-folded, whitespace collapsed, trailing spaces and question marks dropped.

    "  What is 2+2 ? " and "what is 2+2?" give the same key; wording changes do not.
    """
    text = unicodedata.normalize("NFKC", question).casefold()
    text = _SPACE.sub(" ", text).strip()
    return text.rstrip(" ?").strip()
