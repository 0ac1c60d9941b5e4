"""The fixed prompts behind tests/golden/engine_golden-<family>.json (shared by the test and scripts/make_golden.py).

A family is every machine whose llama.cpp gives the same probe hashes (engine/probe.py): the bits,
not a CPU string, decide. Each family's file is named for the machine that made it first (its best
SIMD feature set and CPU vendor), and holds that family's own hashes for the same cases.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvgraft.app.core.textgen import prefix_tokens
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


GOLDEN_DIR = Path(__file__).parent / "golden"


def family_files() -> dict[Path, dict]:
    """Every committed family's golden file, parsed, by path."""
    return {p: json.loads(p.read_text()) for p in sorted(GOLDEN_DIR.glob("engine_golden-*.json"))}


def matching_family(probe: dict, families: dict[Path, dict]) -> Path | None:
    """The family whose probe equals `probe` (this machine's bits), if one is committed."""
    return next((path for path, golden in families.items() if golden["probe"] == probe), None)


def family_name(environment: dict) -> str:
    """A file-name slug for a new family: its widest vector ISA and its CPU, e.g. "avx512-intel-xeon"."""
    info = environment.get("system_info", "")
    isa = next((name for flag, name in _ISAS if re.search(rf"\b{flag} = 1", info)), "generic")
    cpu = re.sub(r"\(r\)|\(tm\)|processor|cpu|\d+-core", " ", str(environment.get("cpu", "")).lower())
    words = re.findall(r"[a-z]+", cpu)[:2] or [str(environment.get("machine", "unknown")).lower()]
    return "-".join([isa, *words])


_ISAS = (("AVX512", "avx512"), ("AVX2", "avx2"), ("AVX", "avx"), ("SSE3", "sse3"), ("NEON", "neon"))
