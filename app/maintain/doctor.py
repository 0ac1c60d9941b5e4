"""`kvgraft doctor`: what is installed, where things live, and the engine fingerprint."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from kvgraft.app import __version__
from kvgraft.app.core.desktop_libs import missing_window_libraries
from kvgraft.app.core.paths import data_dir, model_dir
from kvgraft.app.maintain.graft_checks import graft_check_report
from kvgraft.app.maintain.migrate import pending_count
from kvgraft.engine.bindings import supports_gpu_offload
from kvgraft.engine.engine import Engine
from kvgraft.engine.probe import ProbeCache


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


@dataclass(frozen=True)
class DoctorReport:
    """What `kvgraft doctor` reports; `as_dict()` is `kvgraft doctor --json` (the fields in this order)."""

    kvgraft: str
    python: str
    platform: str
    packages: dict  # distribution name -> installed version (None: not installed)
    backend: str
    gpu_offload_supported: bool
    cpu_backend: dict  # which llama.cpp CPU kernels run: built in, or the variant a portable build chose here
    model: dict  # path, sha256, name, architecture, size_bytes, n_layer, n_ctx_train, n_swa, n_vocab
    config: dict  # the engine's settings
    kv_bytes_per_token: int
    compaction: dict
    data_dir: str
    model_dir: str
    fingerprint: str
    graft_check: dict  # kvgraft selftest's outcomes on this device
    fingerprint_info: dict  # compared: config and probe hashes
    batch_invariance: dict  # the probe's splits: invariant, threads_decide_bits, which splits differ
    to_migrate: int  # library entries under this engine's earlier fingerprint (kvgraft migrate)
    environment: dict  # descriptive: recorded, never compared
    window_libraries: dict  # missing shared object -> its Debian package (empty: the window can start)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def invariance_summary(engine: Engine) -> dict:
    inv = engine.probe.get("invariance", {})
    return {
        "invariant": engine.batch_invariant,
        "threads_decide_bits": engine.threads_decide_bits,
        "splits": len(inv.get("splits", [])),
        "differ": [s["name"] for s in inv.get("splits", []) if not s["same"]],
    }


def doctor_report(engine: Engine, home: Path | None = None, checks: ProbeCache | None = None) -> DoctorReport:
    info = engine.model.info
    cfg = engine.config
    return DoctorReport(
        kvgraft=__version__,
        python=sys.version.split()[0],
        platform=platform.platform(),
        packages={
            d: _version(d)
            for d in (
                "llama-cpp-python",
                "numpy",
                "gguf",
                "sqlite-utils",
                "PySide6-Essentials",
                "platformdirs",
                "click",
            )
        },
        backend=engine.backend,
        gpu_offload_supported=supports_gpu_offload(),
        cpu_backend=engine.environment["cpu_backend"],
        model={
            "path": info.path,
            "sha256": info.sha256,
            "name": info.name,
            "architecture": info.architecture,
            "size_bytes": info.size_bytes,
            "n_layer": info.n_layer,
            "n_ctx_train": info.n_ctx_train,
            "n_swa": info.n_swa,
            "n_vocab": info.n_vocab,
        },
        config={
            "n_ctx": cfg.n_ctx,
            "n_batch": cfg.n_batch,
            "n_ubatch": cfg.n_ubatch,
            "n_threads": cfg.n_threads,
            "n_gpu_layers": cfg.n_gpu_layers,
            "flash_attn": cfg.flash_attn,
            "type_k": cfg.type_k,
            "type_v": cfg.type_v,
            "swa_full": cfg.swa_full,
        },
        kv_bytes_per_token=engine.layout.bytes_per_token(),
        compaction=engine.window.as_dict() | {"active": engine.window.active},
        data_dir=str(data_dir(home)),
        model_dir=str(model_dir()),
        fingerprint=engine.fingerprint,
        graft_check=graft_check_report(engine, checks),
        fingerprint_info=engine.fingerprint_info,
        batch_invariance=invariance_summary(engine),
        to_migrate=pending_count(engine, home),
        environment=engine.environment,
        window_libraries=missing_window_libraries(),
    )
