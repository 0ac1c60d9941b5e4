#!/usr/bin/env python3
"""Held-out transfer: fresh, the family's solution grafted, the same solution prefilled (app/lab/transfer.py).

    .venv/bin/kvgraft models fetch qwen2.5-coder-1.5b        (once: `make models`)
    .venv/bin/python scripts/transfer.py [--seed 1] [--held-out 5] [--budget 320] [--json PATH]
    .venv/bin/python scripts/transfer.py --report docs/bench/transfer-seed1.json   (a saved run's table again)

The known instruct model (default) or --model PATH, the default engine settings, a library in a
temporary directory. Prints the side-by-side Markdown table (the README quotes it) and the facts the
issue's targets are read from; --json writes every attempt. Seed 1 is the reported one; prompts and
families were written on seed 100 (--seed 100 --held-out 1) and not changed after seed 1 ran.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvgraft.app.core.runtime import Settings, open_engine  # noqa: E402
from kvgraft.app.lab.transfer import markdown, run_transfer  # noqa: E402
from kvgraft.app.service import LibraryService, open_library  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a known model's name or a GGUF path")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--held-out", type=int, default=5, help="held-out problems per family")
    ap.add_argument("--budget", type=int, default=320, help="decode tokens per answer at most")
    ap.add_argument("--families", default=None, help="comma-separated subset of the families")
    ap.add_argument("--json", type=Path, default=None, help="write the whole report here")
    ap.add_argument("--report", type=Path, default=None, help="print the table of a saved --json run (no model)")
    args = ap.parse_args()
    if args.report is not None:
        show(json.loads(args.report.read_text()))
        return
    engine = open_engine(Settings(model=Path(args.model)), on_progress=lambda m: print(m, file=sys.stderr))
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="kvgraft-transfer-") as tmp:
        lib = open_library(Path(tmp))
        with LibraryService(engine, lib) as service:
            report = run_transfer(
                service,
                seed=args.seed,
                held_out=args.held_out,
                budget=args.budget,
                families=args.families.split(",") if args.families else None,
                progress=say,
            )
        lib.close()
    d = report.as_dict()
    if args.json:
        args.json.write_text(json.dumps(d, indent=1))
    show(d)


def show(d: dict) -> None:
    cfg = d.get("settings") or {}
    where = ", ".join(f"{k} {v}" for k, v in cfg.items())
    print(
        f"model {d['model']}, seed {d['seed']}, {d['held_out_per_family']} held out per family, budget {d['budget']} "
        f"tokens{', ' + where if where else ''}; whole run {d['wall_s'] / 60:.1f} min"
    )
    print(markdown(d))


if __name__ == "__main__":
    main()
