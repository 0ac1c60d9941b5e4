#!/usr/bin/env python3
"""Write tests/golden/engine_golden.json: snapshot and logits SHA-256 for fixed prompts.

The hashes are committed with the environment fingerprint they were made under;
tests/test_golden.py recomputes them and requires equality wherever the fingerprint matches.
Run it (make golden) only when a deliberate change moves the bits, and say why in the commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.model_store import embedded_model_path, model_sha256  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.engine import Engine  # noqa: E402
from tests.golden_cases import CASES, compute_case  # noqa: E402


def main() -> None:
    path = embedded_model_path()
    engine = Engine.load(EngineConfig(model_path=path), model_sha256(path))
    out = {
        "fingerprint": engine.fingerprint,
        "fingerprint_info": engine.fingerprint_info,
        "cases": [compute_case(engine, c) for c in CASES],
    }
    dest = REPO / "tests" / "golden" / "engine_golden.json"
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {dest} ({len(out['cases'])} cases, fingerprint {engine.fingerprint[:16]}...)")


if __name__ == "__main__":
    main()
