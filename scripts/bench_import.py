#!/usr/bin/env python3
"""Pack import, this tree against another revision, side by side in one run.

Deposits N starter solutions in a temporary library (one prefill each, once), exports them as a pack
signed by a key the importing libraries trust (so no entry is replayed: what is timed is reading,
checking and committing the blobs), then imports that pack into fresh libraries, alternating the
baseline revision's code and this tree's, ROUNDS times each. Each import runs in its own process with
the model already loaded; the time is `import_pack` alone. Prints the median seconds, the ratio and
each process's peak memory.

    .venv/bin/python scripts/bench_import.py [--entries 50] [--rounds 3] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"app": "app", "engine": "engine", "library": "library", "ui": "ui"}


def child(pack: Path, home: Path, public_key: str) -> None:
    """One import in this process, with whichever kvgraft is first on sys.path."""
    import resource

    from kvgraft.app.core.runtime import Settings, open_engine
    from kvgraft.app.packs.imports import import_pack
    from kvgraft.app.packs.trust import trust_store
    from kvgraft.app.service import LibraryService
    from kvgraft.library.library import Library

    engine = open_engine(Settings())
    trust_store(home).trust(public_key, "bench")
    with Library(home) as lib:
        t = time.perf_counter()
        res = import_pack(LibraryService(engine, lib), pack)
        seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "imported": res.imported, "proof": res.proof, "peak_bytes": peak}))


def tree_at(rev: str, where: Path) -> Path:
    """A package root for `rev`'s code: `kvgraft` with app/, engine/, library/, ui/ of that revision."""
    src = where / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    root = where / "path"
    shutil.copytree(src / "packaging" / "kvgraft", root / "kvgraft")
    for name, folder in PACKAGES.items():
        (root / "kvgraft" / name).symlink_to(src / folder)
    return root


def run_import(pack: Path, home: Path, public_key: str, path: Path | None) -> dict:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = str(path)
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(pack), str(home), public_key],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"an import failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default="HEAD", help="the revision to compare with (default: HEAD)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.child[2])
        return 0
    sys.path.insert(0, str(REPO))
    from kvgraft.app.core.runtime import Settings, open_engine
    from kvgraft.app.lab.starter_problems import starter_problems
    from kvgraft.app.packs.export import export_pack
    from kvgraft.app.service import LibraryService
    from kvgraft.library.library import Library
    from kvgraft.library.signing import generate_key

    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.baseline], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="kvgraft-bench-import-") as tmp:
        tmp = Path(tmp)
        signer = generate_key(tmp / "bench.key")
        engine = open_engine(Settings())
        t = time.perf_counter()
        with Library(tmp / "source") as lib:
            svc = LibraryService(engine, lib)
            entries = [
                svc.deposit_solution(p.question, p.solution, p.answer, checker=p.checker).entry
                for p in starter_problems(args.entries)
            ]
            made = export_pack(lib, entries, tmp / "bench.kvpack", sign_key=tmp / "bench.key")
            svc.close()
        engine.close()
        size = (tmp / "bench.kvpack").stat().st_size
        print(
            f"{made.entries} entries deposited and exported in {time.perf_counter() - t:.0f} s: "
            f"a {size / 1e6:.1f} MB signed pack",
            file=sys.stderr,
        )
        (tmp / "base").mkdir()
        base_path = tree_at(rev, tmp / "base")
        runs = {"base": [], "this": []}
        for k in range(args.rounds):
            for side, path in (("base", base_path), ("this", None)):
                r = run_import(tmp / "bench.kvpack", tmp / f"{side}-{k}", signer.public_key_b64, path)
                assert r["imported"] == made.entries, r
                runs[side].append(r)
                print(f"round {k + 1} {side}: {r['seconds']:.3f} s", file=sys.stderr)
    base = statistics.median(r["seconds"] for r in runs["base"])
    this = statistics.median(r["seconds"] for r in runs["this"])
    print(f"import of a signed {made.entries}-entry pack ({size / 1e6:.1f} MB), median of {args.rounds}, one run:")
    print("| code | import (s) | peak memory (MB) |\n|---|---|---|")
    for side, label, secs in (("base", f"baseline {rev}", base), ("this", "this tree", this)):
        peak = max(r["peak_bytes"] for r in runs[side]) / 1e6
        print(f"| {label} | {secs:.3f} | {peak:,.0f} |")
    print(f"this tree / baseline: {this / base:.2f}x the time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
