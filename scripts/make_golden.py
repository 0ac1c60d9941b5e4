#!/usr/bin/env python3
"""Write this machine's golden file: tests/golden/engine_golden-<family>.json (probe hashes, and
snapshot and logits SHA-256 for fixed prompts).

A family is every machine with the same probe hashes (engine/probe.py). Where a committed family's
probe equals this machine's, that file is checked: cases already in it are kept as they are, with
the machine they were made on; a case whose recomputed hashes differ is refused unless --force (a
deliberate change that moves the bits: say why in the commit); new cases are computed here. Where
no family matches, a new file is written beside the others, named for this machine.
tests/test_golden.py compares every case of the family whose probe matches.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvgraft.app.core.model_store import embedded_model_path, model_sha256  # noqa: E402
from kvgraft.engine.config import EngineConfig  # noqa: E402
from kvgraft.engine.engine import Engine  # noqa: E402
from tests.golden_cases import (  # noqa: E402
    CASES,
    GOLDEN_DIR,
    HASH_KEYS,
    compute_case,
    family_files,
    family_name,
    matching_family,
)


def destination(engine: Engine, families: dict[Path, dict]) -> Path:
    """The matching family's file, else a new one named for this machine (numbered if the name is taken)."""
    found = matching_family(engine.probe, families)
    if found is not None:
        return found
    base = family_name(engine.environment)
    dest, n = GOLDEN_DIR / f"engine_golden-{base}.json", 2
    while dest.exists():
        dest, n = GOLDEN_DIR / f"engine_golden-{base}-{n}.json", n + 1
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="overwrite this family's cases whose hashes changed")
    args = ap.parse_args()
    path = embedded_model_path()
    engine = Engine.load(EngineConfig(model_path=path), model_sha256(path))
    families = family_files()
    dest = destination(engine, families)
    old = families.get(dest, {})
    committed = {c["name"]: c for c in old.get("cases", [])}
    cases = []
    for case in CASES:
        got = compute_case(engine, case)
        prev = committed.get(case["name"])
        if prev is not None:
            moved = [k for k in HASH_KEYS if prev.get(k) != got[k]]
            if moved and not args.force:
                print(
                    f"{dest.name}: case {case['name']}: {', '.join(moved)} changed; --force to overwrite",
                    file=sys.stderr,
                )
                return 1
            if not moved:
                cases.append(prev)  # kept with the machine it was made on
                continue
        cases.append({**got, "made_on": engine.environment})
    out = {
        **({"note": old["note"]} if old.get("note") and old.get("probe") == engine.probe else {}),
        "probe": engine.probe,
        "probe_made_on": old.get("probe_made_on", engine.environment),
        "config": {k: v for k, v in engine.fingerprint_info.items() if k != "probe"},
        "cases": cases,
    }
    dest.write_text(json.dumps(out, indent=2) + "\n")
    what = "checked" if old and cases == old.get("cases") else ("updated" if old else "added a new family:")
    probe = engine.probe["cases"][-1]["logits_sha256"][:16]
    print(f"{what} {dest.relative_to(REPO)} ({len(cases)} cases, probe {probe}...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
