#!/usr/bin/env python3
"""What proof of origin costs at import, beside the prefill it saves later.

Builds a pack of N starter problems (worked solutions of about 300-2,300 tokens) in one temporary
library, imports it into an empty one through `kvgraft import` (every unsigned entry is replayed:
one prefill each), then for each entry times a graft from the library against a fresh prefill of
its text, side by side in this run. Prints the import's replay time and the per-answer figures.

    .venv/bin/python scripts/import_replay.py [--problems 12]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=12)
    args = ap.parse_args()
    from kvgraft.app.core.runtime import Settings, open_engine
    from kvgraft.app.lab.starter_problems import starter_problems
    from kvgraft.app.packs.export import build_pack
    from kvgraft.app.proof.problems import write_jsonl
    from kvgraft.app.service import LibraryService
    from kvgraft.library.library import Library

    engine = open_engine(Settings())
    with tempfile.TemporaryDirectory(prefix="kvgraft-replay-") as tmp:
        tmp = Path(tmp)
        problems = starter_problems(24)[:: max(1, 24 // args.problems)][: args.problems]
        write_jsonl(problems, tmp / "p.jsonl")
        with Library(tmp / "src") as lib:
            built = build_pack(LibraryService(engine, lib), tmp / "p.jsonl", tmp / "pack.kvpack")
        env = {**os.environ, "KVGRAFT_HOME": str(tmp / "dst")}
        t0 = time.perf_counter()
        out = subprocess.run(
            [str(REPO / ".venv" / "bin" / "kvgraft"), "import", str(tmp / "pack.kvpack"), "--json"],
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            print(out.stdout, out.stderr, file=sys.stderr)
            return 1
        res = json.loads(out.stdout)
        rows = []
        with Library(tmp / "dst") as lib:
            service = LibraryService(engine, lib)
            for e in lib.entries():
                with engine.session() as s:
                    t = time.perf_counter()
                    s.prefill(e.tokens)
                    prefill = time.perf_counter() - t
                with engine.session() as s:
                    t = time.perf_counter()
                    service.graft(s, e)
                    graft = time.perf_counter() - t
                rows.append((e.n_tokens, e.proof, prefill, graft))
    tokens = sum(r[0] for r in rows)
    print(
        f"pack: {built.entries} solutions of {min(r[0] for r in rows):,}-{max(r[0] for r in rows):,} tokens "
        f"({tokens:,} in all), {built.bytes / 1e6:.1f} MB"
    )
    print(
        f"kvgraft import: {res['imported']} entries, {res['replayed']} replayed in {res['replay_s']:.1f} s "
        f"(the whole command {wall:.1f} s, model load included)"
    )
    print(f"proofs: {sorted({r[1] for r in rows})}")
    print("")
    print(f"{'tokens':>7} | {'prefill':>9} | {'graft':>8} | ratio")
    for n, _p, prefill, graft in sorted(rows):
        print(f"{n:>7,} | {prefill:>7.2f} s | {graft * 1e3:>5.1f} ms | {prefill / graft:>4.0f}x")
    pre, gr = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"{'all':>7} | {pre:>7.2f} s | {gr * 1e3:>5.1f} ms | {pre / gr:>4.0f}x")
    print(
        f"\nthe replay costs about one prefill of each entry once ({res['replay_s']:.1f} s); every later answer "
        f"from these entries grafts instead (all {len(rows)}: {gr * 1e3:.0f} ms vs {pre:.1f} s of prefill)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
