"""The fixed prompts behind tests/golden/engine_golden.json (shared by the test and scripts/make_golden.py)."""

from __future__ import annotations

from kvgraft.app.textgen import prefix_tokens
from kvgraft.engine.compare import logits_sha256

CASES = [
    {"name": "short-16", "tokens": 16, "seed": 1001},
    {"name": "mid-300", "tokens": 300, "seed": 1002},
    {"name": "past-window-900", "tokens": 900, "seed": 1003},
    {"name": "past-window-1300", "tokens": 1300, "seed": 1004},
    {"name": "fa-mid-300", "tokens": 300, "seed": 1002, "flash_attn": True},
    {"name": "fa-past-window-900", "tokens": 900, "seed": 1003, "flash_attn": True},
]


def case_engine(engine, case: dict):
    """The engine a case runs on: the default config, or the same model with flash attention on."""
    fa = bool(case.get("flash_attn", False))
    return engine if engine.config.flash_attn == fa else engine.with_config(engine.config.replace(flash_attn=fa))


def compute_case(engine, case: dict) -> dict:
    engine = case_engine(engine, case)
    toks = prefix_tokens(engine.model, case["tokens"], seed=case["seed"])
    with engine.session() as s:
        s.prefill(toks)
        raw = s.snapshot(canonical=False)
        snap = s.snapshot()
        logits = s.logits()
    # snapshot_sha256 is the content address (canonical: dead window cells zeroed); raw_snapshot_sha256
    # is llama.cpp's bytes as written, the address blobs had before compaction
    return {
        **case,
        "snapshot_sha256": snap.sha256,
        "raw_snapshot_sha256": raw.sha256,
        "snapshot_bytes": len(snap.data),
        "elided_bytes": int(snap.elided[:, 1].sum()) if len(snap.elided) else 0,
        "logits_sha256": logits_sha256(logits),
    }


HASH_KEYS = ("snapshot_sha256", "raw_snapshot_sha256", "snapshot_bytes", "elided_bytes", "logits_sha256")
