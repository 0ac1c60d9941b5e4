#!/usr/bin/env python3
"""Write tests/golden/engine_golden.json: the probe hashes, and snapshot and logits SHA-256 for fixed prompts.

tests/test_golden.py recomputes the probe (engine/probe.py); wherever it equals the committed one,
every case must reproduce too. Cases already in the file are kept as they are, with the machine
they were made on; a case whose recomputed hashes differ is refused unless --force (a deliberate
change that moves the bits: say why in the commit). New cases are computed here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvgraft.app.model_store import embedded_model_path, model_sha256  # noqa: E402
from kvgraft.engine.config import EngineConfig  # noqa: E402
from kvgraft.engine.engine import Engine  # noqa: E402
from tests.golden_cases import CASES, HASH_KEYS, compute_case  # noqa: E402

DEST = REPO / "tests" / "golden" / "engine_golden.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--force", action="store_true", help="overwrite committed cases whose hashes changed")
    args = ap.parse_args()
    path = embedded_model_path()
    engine = Engine.load(EngineConfig(model_path=path), model_sha256(path))
    old = json.loads(DEST.read_text()) if DEST.exists() else {}
    committed = {c["name"]: c for c in old.get("cases", [])}
    if old.get("probe") not in (None, engine.probe) and not args.force:
        print(
            "the probe differs from the committed one: this machine makes other bits; --force to replace",
            file=sys.stderr,
        )
        return 1
    cases = []
    for case in CASES:
        got = compute_case(engine, case)
        prev = committed.get(case["name"])
        if prev is not None:
            moved = [k for k in HASH_KEYS if prev.get(k) != got[k]]
            if moved and not args.force:
                print(f"case {case['name']}: {', '.join(moved)} changed; --force to overwrite", file=sys.stderr)
                return 1
            if not moved:
                cases.append(prev)  # kept with the machine it was made on
                continue
        cases.append({**got, "made_on": engine.environment})
    out = {
        "probe": engine.probe,
        "probe_made_on": old.get("probe_made_on") if old.get("probe") == engine.probe else engine.environment,
        "config": {k: v for k, v in engine.fingerprint_info.items() if k != "probe"},
        "cases": cases,
    }
    DEST.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {DEST} ({len(cases)} cases, probe {engine.probe['cases'][-1]['logits_sha256'][:16]}...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
