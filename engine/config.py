"""EngineConfig: every setting that decides how the engine runs, frozen and passed explicitly."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

# KV cache element types we accept, by the names llama.cpp uses (ggml_type).
KV_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2}
QUANTIZED_KV = {"q8_0", "q4_0"}
DEFAULT_N_CTX = 8192  # the context size when nobody chose one (CLI, app, engine)
DEFAULT_LOOKUP, MAX_LOOKUP = 8, 32  # prompt-lookup drafts per verify call (measured: README, benchmarks)


def physical_cores() -> int:
    """Number of physical CPU cores (not hyper-threads); falls back to os.cpu_count()."""
    try:
        seen = set()
        phys = core = None
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("physical id"):
                    phys = line.split(":", 1)[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":", 1)[1].strip()
                elif not line.strip():
                    if core is not None:
                        seen.add((phys, core))
                    phys = core = None
        if core is not None:
            seen.add((phys, core))
        if seen:
            return len(seen)
    except OSError:
        pass
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class EngineConfig:
    """How to load the model and build contexts.

    Fields that decide the bits of a snapshot or of the logits (model file, KV types, flash
    attention, backend) go into the engine fingerprint. On kvgraft's build of llama.cpp the decode
    schedule does not decide the bits on the CPU (docs/exact-graft.md, the invariant build): the
    probe checks that on every machine (`Engine.batch_invariant`), and n_threads enters the
    fingerprint only where the probe finds that it decides them. Every entry still records its
    schedule (app/proof/replay.py) and replays in it, which is what keeps a non-invariant engine
    (another build, a GPU backend, whose batch shape is in the fingerprint) exact.
    """

    model_path: Path
    n_ctx: int = DEFAULT_N_CTX
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = field(default_factory=physical_cores)
    n_gpu_layers: int = 0
    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = True
    seed: int = 0
    lookup: int = DEFAULT_LOOKUP  # tokens drafted per verify call in greedy decoding; 0: one token per call

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_path", Path(self.model_path))
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_gpu_layers", "seed", "lookup"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
        if self.n_ctx < 16:
            raise ConfigError(f"n_ctx must be at least 16, got {self.n_ctx}")
        if not 1 <= self.n_batch <= self.n_ctx:
            raise ConfigError(f"n_batch must be in 1..n_ctx ({self.n_ctx}), got {self.n_batch}")
        if not 1 <= self.n_ubatch <= self.n_batch:
            raise ConfigError(f"n_ubatch must be in 1..n_batch ({self.n_batch}), got {self.n_ubatch}")
        if not 0 <= self.lookup <= MAX_LOOKUP:
            raise ConfigError(f"lookup must be in 0..{MAX_LOOKUP} drafted tokens per call, got {self.lookup}")
        if self.n_threads < 1:
            raise ConfigError(f"n_threads must be at least 1, got {self.n_threads}")
        if self.n_gpu_layers < 0:
            raise ConfigError(f"n_gpu_layers must be >= 0, got {self.n_gpu_layers}")
        if not isinstance(self.flash_attn, bool):
            raise ConfigError("flash_attn must be True or False (never 'auto': it decides the bits)")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise ConfigError(f"{name} must be one of {sorted(KV_TYPES)}, got {getattr(self, name)!r}")
        if self.type_v in QUANTIZED_KV and not self.flash_attn:
            raise ConfigError(
                f"a quantized V cache ({self.type_v}) needs flash attention on (--flash-attn, or Settings: "
                "Flash attention); with it off, keep the V cache at f16"
            )
        if self.swa_full is not True:
            raise ConfigError(
                "swa_full must be True: an exact own-position graft needs every sliding-window cell "
                "kept in place (see FINDINGS: whole-state payload through the per-sequence restore)"
            )

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    @property
    def model_level(self) -> tuple:
        """The fields that require loading the model again when they change."""
        return (str(self.model_path), self.n_gpu_layers)
