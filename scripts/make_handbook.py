#!/usr/bin/env python3
"""Write an invented handbook in markdown, longer than the default context, for the README's
walk-through of `kvgraft deposit FILE...`: twelve chapters of filler, one fact in chapter 7.

    .venv/bin/python scripts/make_handbook.py handbook.md [--words 700] [--fact "..."]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvgraft.app.core.textgen import synthetic_text  # noqa: E402

FACT = "The keeper of the Osrenmi lighthouse is Tessaly Vorquin."


def handbook(words: int = 700, fact: str = FACT) -> str:
    parts = ["# The Harbor Handbook of Paquka", ""]
    for c in range(1, 13):
        parts += [f"## Chapter {c}: {['Tides', 'Boats', 'Nets', 'Markets', 'Weather', 'Bridges'][c % 6]}", ""]
        for k in range(4):
            parts += [synthetic_text(words // 4, seed=c * 100 + k), ""]
            if c == 7 and k == 1:
                parts += [fact, ""]
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--words", type=int, default=700, help="filler words per chapter")
    ap.add_argument("--fact", default=FACT)
    args = ap.parse_args()
    args.out.write_text(handbook(args.words, args.fact), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
