"""Subprocess worker for the refusal tests: grafts each case and reports the outcome as JSON.

Run as: python tests/graft_worker.py MODEL_PATH CASES.json
A crash inside C would kill this process (non-zero exit / signal), which fails the calling test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    model_path, cases_file = sys.argv[1], Path(sys.argv[2])
    from kvgraft.app.core.model_store import model_sha256
    from kvgraft.app.core.runtime import probe_cache
    from kvgraft.engine.config import EngineConfig
    from kvgraft.engine.engine import Engine
    from kvgraft.engine.errors import EngineError
    from kvgraft.engine.session import Snapshot

    engine = Engine.load(EngineConfig(model_path=Path(model_path)), model_sha256(Path(model_path)), probe_cache())
    results = []
    for case in json.loads(cases_file.read_text()):
        data = Path(case["file"]).read_bytes()
        with engine.session() as s:
            try:
                if case["mode"] == "hashed":
                    s.graft(Snapshot(data, tuple(case["tokens"]), engine.fingerprint, case["sha256"]))
                else:
                    s.graft_bytes(data, case["tokens"])
                results.append({"name": case["name"], "ok": True})
            except EngineError as exc:
                results.append(
                    {"name": case["name"], "ok": False, "error_type": type(exc).__name__, "message": str(exc)}
                )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
