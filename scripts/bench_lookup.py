#!/usr/bin/env python3
"""Lookup latency at 1K, 10K and 100K synthetic entries (a benchmark, not a test).

Fills one library in a temp dir in steps (entries share one small blob: lookups never read
blobs), and at each size times, median of many queries: exact question lookup, longest stored
prefix of a prompt (hits and misses), and full-text search. `kvgraft bench` runs the same code.

    .venv/bin/python scripts/bench_lookup.py [--sizes 1000,10000,100000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvgraft.app.lab.bench_scale import lookup_scale  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = lookup_scale([int(s) for s in args.sizes.split(",")], log=(lambda m: None) if args.json else print)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
