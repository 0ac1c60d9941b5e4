"""The fixed prompts behind tests/golden/engine_golden.json (shared by the test and scripts/make_golden.py)."""

from __future__ import annotations

from app.textgen import prefix_tokens
from engine.compare import logits_sha256

CASES = [
    {"name": "short-16", "tokens": 16, "seed": 1001},
    {"name": "mid-300", "tokens": 300, "seed": 1002},
    {"name": "past-window-900", "tokens": 900, "seed": 1003},
]


def compute_case(engine, case: dict) -> dict:
    toks = prefix_tokens(engine.model, case["tokens"], seed=case["seed"])
    with engine.session() as s:
        s.prefill(toks)
        snap = s.snapshot()
        logits = s.logits()
    return {**case, "snapshot_sha256": snap.sha256, "snapshot_bytes": len(snap.data), "logits_sha256": logits_sha256(logits)}
