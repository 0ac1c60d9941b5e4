#!/usr/bin/env python3
"""Large fuzz run over pack import and snapshot validation (CI runs a few hundred cases of each).

    .venv/bin/python scripts/fuzz.py [--packs 5000] [--snapshots 5000] [--seed 0]

Prints the figures the README reports: cases tried, crashes, partial imports, stray files,
untyped errors. Exit 1 if any of those is not zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packs", type=int, default=5000)
    ap.add_argument("--snapshots", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvgraft-fuzz-"))
    os.environ["KVGRAFT_HOME"] = str(work / "home")

    from kvgraft.app.core.model_store import embedded_model_path, model_sha256
    from kvgraft.app.packs.export import build_pack
    from kvgraft.app.proof.problems import Problem, write_jsonl
    from kvgraft.app.service import LibraryService
    from kvgraft.engine.config import EngineConfig
    from kvgraft.engine.engine import Engine
    from kvgraft.library.library import Library
    from tests.fuzz_harness import FuzzStats, fuzz_pack_import, fuzz_snapshots

    model = embedded_model_path()
    engine = Engine.load(EngineConfig(model_path=model), model_sha256(model))
    write_jsonl(
        [Problem("f1", "A hut holds 9 barrels and gets 3 more. How many barrels?", "9 + 3 = 12", "12")],
        work / "p.jsonl",
    )
    with Library(work / "src") as lib:
        build_pack(LibraryService(engine, lib), work / "p.jsonl", work / "tiny.kvpack")
    t0 = time.perf_counter()
    packs = FuzzStats()
    (work / "packs").mkdir()
    fuzz_pack_import(engine, work / "tiny.kvpack", work / "packs", args.packs, args.seed, packs)
    small = engine.with_config(engine.config.replace(n_ctx=256, n_batch=256, n_ubatch=256))
    with small.session() as s:
        s.prefill(small.model.tokenize("The river carries silver stones to the harbor every winter."))
        snap = s.snapshot()
    snaps = FuzzStats()
    (work / "snaps").mkdir()
    fuzz_snapshots(small, model, snap.data, snap.n_tokens, work / "snaps", args.snapshots, args.seed + 1, snaps)
    out = {
        "packs": packs.as_dict(),
        "snapshots": snaps.as_dict(),
        "cases": packs.cases + snaps.cases,
        "crashes": snaps.crashes,
        "partial_imports": packs.partial_imports,
        "stray_files": packs.stray_files,
        "untyped_errors": len(packs.other_errors) + len(snaps.other_errors),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out, indent=2))
    bad = out["crashes"] or out["partial_imports"] or out["stray_files"] or out["untyped_errors"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
