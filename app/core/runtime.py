"""Building the engine from user settings: the one place the CLI and the app turn options into an Engine."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

from kvgraft.app.core.model_registry import KNOWN, check_file, fetched_path, known_for_path
from kvgraft.app.core.model_store import ModelStoreError, embedded_model_path, model_sha256
from kvgraft.app.core.paths import model_dir
from kvgraft.engine.config import DEFAULT_LOOKUP, DEFAULT_N_CTX, KV_TYPES, MAX_LOOKUP, EngineConfig, physical_cores
from kvgraft.engine.engine import Engine
from kvgraft.engine.errors import ModelLoadError
from kvgraft.engine.probe import ProbeCache

PROBE_CACHE = "probe-cache.json"  # in the model cache, beside the model SHA-256 cache

log = logging.getLogger(__name__)

KV_TYPE_NAMES = tuple(KV_TYPES)  # the KV cache types a user can choose (engine/config.py)


@dataclass(frozen=True)
class Settings:
    """What a user can choose: the one config object of the CLI and the app (the app persists it
    whole). `model=None` means the embedded default model. Every other field is an EngineConfig
    field of the same name and meaning (engine_config copies them by name, not by hand)."""

    model: Path | None = None
    n_ctx: int = DEFAULT_N_CTX
    n_threads: int = field(default_factory=physical_cores)
    n_gpu_layers: int = 0
    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    n_batch: int = 512  # decide the bits on a GPU backend only (engine/engine.py, _config_bits)
    n_ubatch: int = 512
    lookup: int = DEFAULT_LOOKUP  # prompt-lookup drafts per greedy verify call (0: off); not part of the bits

    def engine_fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}

    def to_dict(self) -> dict:
        """JSON-ready, every field (the app stores this whole)."""
        return {"model": str(self.model) if self.model else None, **self.engine_fields()}

    @classmethod
    def from_dict(cls, raw: dict) -> "Settings":
        """Read what `to_dict` wrote; unknown keys are ignored and a field of the wrong type keeps
        its default, so a settings file from another version never stops the app from starting."""
        defaults = cls()
        values = {}
        for f in fields(cls):
            if f.name not in raw:
                continue
            v = raw[f.name]
            if f.name == "model":
                values["model"] = Path(v) if isinstance(v, str) and v else None
            elif f.name == "lookup" and not (type(v) is int and 0 <= v <= MAX_LOOKUP):
                continue
            elif type(v) is type(getattr(defaults, f.name)):
                values[f.name] = v
        return replace(defaults, **values)


def resolve_model_path(
    settings: Settings,
    on_progress: Callable[[str], None] | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
) -> Path:
    if settings.model is None:
        return embedded_model_path(on_progress, on_bytes)
    path = Path(settings.model).expanduser()
    if not path.is_file() and str(settings.model) in KNOWN:  # a known model by name (app/core/model_registry.py)
        m = KNOWN[str(settings.model)]
        found = fetched_path(m)
        if found is None:
            raise ModelLoadError(f"{m.name} is not fetched yet: run `kvgraft models fetch {m.name}` (or `make models`)")
        path = found
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    known_model = known_for_path(path)
    if known_model is not None:  # the hash checked before llama.cpp reads a byte of it
        try:
            check_file(known_model, path)
        except ModelStoreError as exc:
            raise ModelLoadError(str(exc)) from exc
    return path.resolve()


def engine_config(settings: Settings, model_path: Path) -> EngineConfig:
    return EngineConfig(model_path=model_path, **settings.engine_fields())


def open_engine(
    settings: Settings,
    on_progress: Callable[[str], None] | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
) -> Engine:
    """Put the model in place (assembling the embedded one on first use, `on_bytes(done, total)` as it
    is written), hash it (cached), load it."""
    path = resolve_model_path(settings, on_progress, on_bytes)
    try:
        sha = model_sha256(path)
    except ModelStoreError as exc:
        raise ModelLoadError(str(exc)) from exc
    return Engine.load(engine_config(settings, path), sha, probe_cache())


def probe_cache() -> ProbeCache:
    """Probe hashes (engine/probe.py) per model, build, config and device, in the model cache."""
    return ProbeCache(model_dir() / PROBE_CACHE)
