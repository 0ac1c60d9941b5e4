"""Building the engine from user settings: the one place the CLI and the app turn options into an Engine."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kvgraft.engine.config import EngineConfig, physical_cores
from kvgraft.engine.engine import Engine
from kvgraft.engine.errors import ModelLoadError
from kvgraft.engine.probe import ProbeCache

from .model_store import ModelStoreError, embedded_model_path, model_sha256
from .paths import model_dir

PROBE_CACHE = "probe-cache.json"  # in the model cache, beside the model SHA-256 cache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    """What a user can choose. `model=None` means the embedded default model."""

    model: Path | None = None
    n_ctx: int = 8192
    n_threads: int = field(default_factory=physical_cores)
    n_gpu_layers: int = 0
    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"


def resolve_model_path(settings: Settings, on_progress: Callable[[str], None] | None = None) -> Path:
    if settings.model is None:
        return embedded_model_path(on_progress)
    path = Path(settings.model).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    return path.resolve()


def engine_config(settings: Settings, model_path: Path) -> EngineConfig:
    return EngineConfig(
        model_path=model_path,
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        n_gpu_layers=settings.n_gpu_layers,
        flash_attn=settings.flash_attn,
        type_k=settings.type_k,
        type_v=settings.type_v,
    )


def open_engine(settings: Settings, on_progress: Callable[[str], None] | None = None) -> Engine:
    """Put the model in place (assembling the embedded one on first use), hash it (cached), load it."""
    path = resolve_model_path(settings, on_progress)
    try:
        sha = model_sha256(path)
    except ModelStoreError as exc:
        raise ModelLoadError(str(exc)) from exc
    return Engine.load(engine_config(settings, path), sha, probe_cache())


def probe_cache() -> ProbeCache:
    """Probe hashes (engine/probe.py) per model, build, config and device, in the model cache."""
    return ProbeCache(model_dir() / PROBE_CACHE)
