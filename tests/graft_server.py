"""Long-lived graft worker for the fuzz suite: reads {"file", "n_tokens"} lines, grafts, answers a line each.

    python tests/graft_server.py MODEL_PATH N_CTX
Prints "ready" once the model is loaded. A crash in C ends the process; the caller sees EOF.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from kvgraft.app.core.model_store import model_sha256
    from kvgraft.engine.config import EngineConfig
    from kvgraft.engine.engine import Engine
    from kvgraft.engine.errors import EngineError

    model_path, n_ctx = Path(sys.argv[1]), int(sys.argv[2])
    from kvgraft.app.core.runtime import probe_cache

    engine = Engine.load(
        EngineConfig(model_path=model_path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx),
        model_sha256(model_path),
        probe_cache(),
    )
    _ = engine.layout  # probe once before taking cases
    print("ready", flush=True)
    with engine.session() as s:
        for line in sys.stdin:
            case = json.loads(line)
            data = Path(case["file"]).read_bytes()
            s.reset()
            try:
                s.graft_bytes(data, [engine.model.bos] * case["n_tokens"])
                s.prefill([engine.model.bos])  # and decode after it: the restored cells are used
                out = {"ok": True}
            except EngineError as exc:
                out = {"ok": False, "error_type": type(exc).__name__, "message": str(exc)}
            print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
