"""The probe: a few fixed prompts whose hashes decide whether two engines make the same bits.

Two machines graft each other's states exactly when their llama.cpp builds turn the same tokens
into the same bytes. A CPU feature string cannot say that (an Intel Xeon with AMX and an AMD EPYC
without it were measured to give identical snapshots and logits: ../shared/FINDINGS.md), so the
engine fingerprint carries the outcome instead: for each probe prompt, the canonical snapshot
SHA-256 and the logits SHA-256 after it, one prompt past the sliding window, and whether the long
prompt gives the same bits in every split into decode calls (engine/invariance.py).

The probe runs once per (model, llama.cpp build, bit-deciding config, device) and is cached in
the model cache (`ProbeCache`). Its prompts are a pure function of the model's tokenizer and
PROBE_VERSION; changing either changes every fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from .compare import logits_sha256
from .invariance import run_invariance
from .session import tokens_sha256

log = logging.getLogger(__name__)

PROBE_VERSION = 2  # 2: the batch-invariance splits (engine/invariance.py)
SHORT_TOKENS = 16
PAST_WINDOW_MARGIN = 88  # the long prompt ends this far past the window (600 tokens for n_swa 512)
CPU_SCHEDULE = (512, 512)  # (n_batch, n_ubatch) of the probe on the CPU, whatever the user's batch size

_WORDS = (
    "amber",
    "basin",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "grove",
    "harbor",
    "inlet",
    "juniper",
    "kiln",
    "lantern",
    "meadow",
    "nectar",
    "orchard",
    "pebble",
    "quarry",
    "ridge",
    "saddle",
    "thicket",
    "upland",
    "valley",
    "willow",
    "yarrow",
    "zephyr",
    "copper",
    "signal",
    "winter",
    "paper",
    "stone",
    "seven",
    "ninety",
)


def probe_text(n_words: int) -> str:
    """Deterministic filler text (a linear congruential walk over a fixed word list)."""
    x, out = 12345, []
    for i in range(n_words):
        x = (1103515245 * x + 12345) % (1 << 31)
        out.append(_WORDS[x % len(_WORDS)])
        if i % 11 == 10:
            out[-1] += "."
    return " ".join(out)


def probe_lengths(n_swa: int, n_ctx_train: int) -> tuple[int, ...]:
    """A short prompt and one past the sliding window (or of 600 tokens where there is none)."""
    long = (n_swa if n_swa > 0 else 512) + PAST_WINDOW_MARGIN
    return (SHORT_TOKENS, max(SHORT_TOKENS + 1, min(long, n_ctx_train - 8)))


def probe_prompt(model, n_tokens: int) -> list[int]:
    words = n_tokens
    while True:
        toks = model.tokenize(probe_text(words), add_bos=True)
        if len(toks) >= n_tokens:
            return toks[:n_tokens]
        words *= 2


def run_probe(engine) -> dict:
    """Compute the probe on `engine`'s model and bit-deciding config (a few hundred tokens of prefill)."""
    info = engine.model.info
    n_batch, n_ubatch = probe_schedule(engine)
    lengths = probe_lengths(info.n_swa, info.n_ctx_train)
    n_ctx = min(info.n_ctx_train, max(1024, lengths[-1] + 16))
    cfg = engine.config.replace(n_ctx=n_ctx, n_batch=min(n_batch, n_ctx), n_ubatch=min(n_ubatch, n_batch, n_ctx))
    probe_engine = type(engine)(engine.model, cfg)
    cases = []
    for n in lengths:
        toks = probe_prompt(engine.model, n)
        with probe_engine.session() as s:
            s.prefill(toks)
            data, _elided = s.canonical_state()
            cases.append(
                {
                    "tokens": n,
                    "tokens_sha256": tokens_sha256(toks),
                    "snapshot_sha256": hashlib.sha256(data).hexdigest(),
                    "logits_sha256": logits_sha256(s.logits()),
                }
            )
    # the long prompt again, split across each of llama.cpp's row-count switches (engine/invariance.py)
    prompts = {
        name: (probe_prompt(engine.model, case["tokens"]), (case["logits_sha256"], case["snapshot_sha256"]))
        for name, case in (("short", cases[0]), ("long", cases[-1]))
    }
    invariance = run_invariance(probe_engine, prompts)
    return {"version": PROBE_VERSION, "schedule": [cfg.n_batch, cfg.n_ubatch], "cases": cases, "invariance": invariance}


def probe_schedule(engine) -> tuple[int, int]:
    """The probe's batch shape: fixed on the CPU (measured batch-invariant there), the user's own on a
    GPU backend, where the batch shape is part of what decides the bits."""
    if engine.backend == "CPU":
        return CPU_SCHEDULE
    return engine.config.n_batch, engine.config.n_ubatch


class ProbeCache:
    """Probe results by key, in one JSON file (written atomically; a damaged file is recomputed).
    An entry counts only when its "version" is `version` (PROBE_VERSION unless another record
    kind, such as app/maintain/graft_checks.py's, keeps its own file)."""

    def __init__(self, path: Path, version: int = PROBE_VERSION) -> None:
        self.path = Path(path)
        self.version = version

    def _load(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> dict | None:
        hit = self._load().get(key)
        return hit if isinstance(hit, dict) and hit.get("version") == self.version else None

    def entries(self) -> dict[str, dict]:
        """Every current entry by key."""
        return {k: v for k, v in self._load().items() if isinstance(v, dict) and v.get("version") == self.version}

    def put(self, key: str, result: dict) -> None:
        data = self._load()
        data[key] = result
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".probe-", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:  # a cache that cannot be written costs a probe next time, nothing more
            log.warning("could not write the probe cache %s: %s", self.path, exc)


def cache_key(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
