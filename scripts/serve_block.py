"""Choose the server's block size B (app/serve/schedule.py): prefill time per call size, side by side.

    python scripts/serve_block.py [--tokens 2048] [--runs 3]

A prompt is decoded in calls of B tokens, so its cold prefill gets slower as B shrinks (more,
smaller calls); a request that extends a stored state re-decodes the part of its prompt past the
last multiple of B, on average B/2 tokens more than it would with B = 1, so its time to first token
grows with B. Prints, per B: the cold prefill of --tokens tokens in B-token calls, the time of one
call of B/2 tokens (the expected extra re-prefill after a graft), and both relative to B = 512.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvgraft.app.core.runtime import Settings, open_engine  # noqa: E402
from kvgraft.app.core.textgen import prefix_tokens  # noqa: E402


def timed(engine, tokens, call: int, runs: int) -> float:
    out = []
    for _ in range(runs):
        with engine.session() as s:
            t0 = time.perf_counter()
            for i in range(0, len(tokens), call):
                s.prefill(tokens[i : i + call])
            s.logits()
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    engine = open_engine(Settings())
    tokens = prefix_tokens(engine.model, args.tokens, seed=3)
    rows = []
    for b in (16, 32, 64, 128, 256, 512):
        cold = timed(engine, tokens, b, args.runs)
        half = timed(engine, tokens[: max(1, b // 2)], b, args.runs * 3)
        rows.append((b, cold, half))
    base = rows[-1][1]
    print(f"| B | cold prefill of {args.tokens} tokens | vs B=512 | one call of B/2 tokens (extra after a graft) |")
    print("| --- | --- | --- | --- |")
    for b, cold, half in rows:
        print(f"| {b} | {cold:.2f} s | {cold / base:.2f}x | {half * 1e3:.0f} ms |")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
