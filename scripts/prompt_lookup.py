#!/usr/bin/env python3
"""Prompt-lookup decoding vs plain greedy, side by side in one run (app/lab/bench_prompt_lookup.py).

    .venv/bin/python scripts/prompt_lookup.py [--k 8] [--docs 12] [--seed 1] [--json]
    .venv/bin/python scripts/prompt_lookup.py --costs     (what a call of n tokens costs: the why)

The embedded model, a library in a temporary directory, the default engine settings but `lookup`.
Prints a Markdown table (the README quotes it) and the answers that differ from plain greedy's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvgraft.app.core.runtime import Settings, open_engine  # noqa: E402
from kvgraft.app.lab.bench_prompt_lookup import SETS as SETS_RUN
from kvgraft.app.lab.bench_prompt_lookup import call_costs, compare, table  # noqa: E402
from scripts.qa_sets import SETS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8, help="tokens drafted per verify call")
    ap.add_argument("--docs", type=int, default=12, help="documents (retrieved and chat sets; fresh questions)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sets", default=",".join(SETS_RUN), help="which of the four sets to run")
    ap.add_argument("--costs", action="store_true", help="only time one decode call of 1 to 9 tokens")
    args = ap.parse_args()
    engine = open_engine(Settings())
    if args.costs:
        rows = call_costs(engine)
        one = rows[0]["last_ms"]
        print("tokens in the call | logits at the last (ms) | logits at every position (ms) | x one token")
        for r in rows:
            print(f"{r['tokens']:>18} | {r['last_ms']:>23.1f} | {r['every_ms']:>30.1f} | {r['every_ms'] / one:.2f}")
        return
    docs, _ = SETS["easy"](args.seed, args.docs)
    with tempfile.TemporaryDirectory(prefix="kvgraft-lookup-") as tmp:
        say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        result = compare(engine, Path(tmp), docs, say, k=args.k, only=tuple(args.sets.split(",")))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"k = {result['k']} drafted tokens per call, n_ctx {result['n_ctx']}, {result['threads']} threads")
    print(table(result))
    for s in result["sets"]:
        for d in s["differing"]:
            print(f"{s['set']} #{d['item']}: plain {d['plain']!r} / lookup {d['lookup']!r}")


if __name__ == "__main__":
    main()
