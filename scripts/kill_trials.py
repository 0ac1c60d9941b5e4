#!/usr/bin/env python3
"""SIGKILL a library writer at N random points (default 100); fsck must stay clean, nothing lost.

.venv/bin/python scripts/kill_trials.py [--trials 100] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.kill_harness import import_kill_trials, kill_trials  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--imports", type=int, default=0, help="also kill this many importing workers")
    ap.add_argument("--dir", type=Path, default=None, help="library dir (default: a temp dir)")
    args = ap.parse_args()
    home = args.dir or Path(tempfile.mkdtemp(prefix="kvgraft-kill-")) / "lib"
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    result = {"deposit_rm_gc": kill_trials(home, args.trials, log=log)}
    if args.imports:
        result["import"] = import_kill_trials(home.parent / "import-lib", args.imports, log=log)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
