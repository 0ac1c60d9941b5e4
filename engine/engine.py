"""Engine: a loaded model plus the frozen config it runs under, its fingerprint and state layout.

One Engine per (model, config). Engines that differ only in context settings (flash attention,
KV types, n_ctx, threads, batch sizes) share the loaded model: see `with_config`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
from functools import cached_property

from .bindings import SWITCH_MODE, cpu_backend, package_version, supports_gpu_offload, system_info
from .compaction import WindowSpec
from .config import KV_TYPES, EngineConfig
from .errors import ConfigError, EngineError
from .lookup_decode import DraftStats
from .model import USE_EXTRA_BUFTS, Model
from .probe import PROBE_VERSION, ProbeCache, cache_key, probe_schedule, run_probe
from .session import Session
from .state import StateLayout, parse_state

log = logging.getLogger(__name__)

# Probe results this process computed or read, by their cache key: the probe is a pure function of the key's
# material (model, bit-deciding config, build, machine), so engines of one config share one probe run.
_PROBES: dict[str, dict] = {}

FINGERPRINT_VERSION = 4  # 3: the probe says whether the engine is batch-invariant; 4: the tiled-small mode's bits


def _sha_json(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class Engine:
    def __init__(self, model: Model, config: EngineConfig, probe_cache: ProbeCache | None = None) -> None:
        if str(config.model_path.resolve()) != model.info.path:
            raise ConfigError(f"config names model {config.model_path}, the loaded model is {model.info.path}")
        if config.n_gpu_layers != model.info.n_gpu_layers:
            raise ConfigError("n_gpu_layers differs from the loaded model's; load the model again")
        if config.n_ctx > model.info.n_ctx_train:
            raise ConfigError(f"n_ctx {config.n_ctx} exceeds the model's trained context {model.info.n_ctx_train}")
        self.model = model
        self.config = config
        self.kv_type_ids = (KV_TYPES[config.type_k], KV_TYPES[config.type_v])
        self._layout: StateLayout | None = None
        self.probe_cache = probe_cache
        self.draft_stats = DraftStats()  # what prompt-lookup drafts cost and saved here (engine/lookup_decode.py)

    @classmethod
    def load(cls, config: EngineConfig, model_sha256: str, probe_cache: ProbeCache | None = None) -> "Engine":
        return cls(Model(config.model_path, model_sha256, config.n_gpu_layers), config, probe_cache)

    def with_config(self, config: EngineConfig) -> "Engine":
        """An Engine for `config`, sharing this one's loaded model when the model-level fields match."""
        if config.model_level != self.config.model_level:
            raise ConfigError("model path or GPU layers changed: load a new Engine")
        return Engine(self.model, config, self.probe_cache)

    def session(self, eval_callback=None) -> Session:
        """A fresh, empty context. The calling thread owns it (see engine/session.py)."""
        return Session(self, eval_callback)

    # -- what decides the bits -----------------------------------------------------------------
    @property
    def backend(self) -> str:
        return "GPU" if supports_gpu_offload() else "CPU"

    def _config_bits(self) -> dict:
        """The settings that decide the bits (compared between engines)."""
        bits = {
            "model_sha256": self.model.info.sha256,
            "architecture": self.model.info.architecture,
            "backend": self.backend,
            "n_gpu_layers": self.config.n_gpu_layers,
            "extra_buffer_types": USE_EXTRA_BUFTS,
            "type_k": self.config.type_k,
            "type_v": self.config.type_v,
            "flash_attn": self.config.flash_attn,
            "swa_full": self.config.swa_full,
        }
        if self.backend != "CPU":
            # GPU kernels are not known to be batch-invariant: the batch shape is part of the bits there.
            bits["n_batch"] = self.config.n_batch
            bits["n_ubatch"] = self.config.n_ubatch
        return bits

    @cached_property
    def environment(self) -> dict:
        """Descriptive facts about this machine and build: recorded for diagnosis; they key caches (probe
        results, selftest outcomes) but never decide whether two engines are compatible (the probe does)."""
        return {
            "llama_cpp_python": package_version(),
            "system_info": system_info(),
            # which CPU kernels ran (a portable build picks a variant at load time) and their library's
            # hash: the probe cache keys on this environment, so a native and a portable build never reuse
            # each other's cached probe results (whether their bits agree is the probe's to say)
            "cpu_backend": cpu_backend().as_dict(),
            # which of llama.cpp's row-count switches this process set (engine/switches.py): other kernels
            "switches": SWITCH_MODE,
            "cpu": cpu_model(),
            "machine": platform.machine(),
            "python": platform.python_version(),
        }

    @cached_property
    def probe(self) -> dict:
        """The probe hashes of this engine (engine/probe.py), from the cache when it has them."""
        material = {
            "probe_version": PROBE_VERSION,
            **self._config_bits(),
            **self.environment,
            "schedule": list(probe_schedule(self)),
            "n_threads": self.config.n_threads,  # the invariance splits run at it (it may decide bits)
        }
        key = cache_key(material)
        hit = _PROBES.get(key) or (self.probe_cache.get(key) if self.probe_cache is not None else None)
        if hit is not None:
            _PROBES[key] = hit
            return hit
        result = run_probe(self)
        log.info("probe computed: %s", ", ".join(c["logits_sha256"][:12] for c in result["cases"]))
        _PROBES[key] = result
        if self.probe_cache is not None:
            self.probe_cache.put(key, result)
        return result

    @cached_property
    def fingerprint_info(self) -> dict:
        """What decides the bits of a snapshot and of the logits after it: the bit-deciding config and
        the probe hashes (with its batch-invariance splits). Two engines with equal fingerprints make
        equal bits on the probe prompts, in every split the probe tries. n_threads is in it only where
        the probe found that it decides the bits."""
        info = {"fingerprint_version": FINGERPRINT_VERSION, **self._config_bits(), "probe": self.probe}
        if self.threads_decide_bits:
            info["n_threads"] = self.config.n_threads
        return info

    @cached_property
    def fingerprint(self) -> str:
        return _sha_json(self.fingerprint_info)

    @property
    def batch_invariant(self) -> bool:
        """Whether the probe found this engine's bits independent of how tokens are split into decode
        calls (engine/invariance.py). False: every exact path keeps its recorded schedule."""
        return bool(self.probe.get("invariance", {}).get("invariant"))

    @property
    def threads_decide_bits(self) -> bool:
        return bool(self.probe.get("invariance", {}).get("threads_decide_bits", True))

    @cached_property
    def legacy_fingerprint(self) -> str:
        """The fingerprint of kvgraft before the probe (version 1: it hashed the CPU feature string).
        Library entries made under it on this machine are relabelled to `fingerprint`."""
        info = {
            "fingerprint_version": 1,
            **{k: v for k, v in self._config_bits().items()},
            "llama_cpp_python": package_version(),
            "system_info": system_info(),
        }
        return _sha_json(info)

    # -- state layout --------------------------------------------------------------------------
    @property
    def layout(self) -> StateLayout:
        """The snapshot layout this model + config produces, probed once from a 1-token state."""
        if self._layout is None:
            self._layout = self._probe_layout()
        return self._layout

    @cached_property
    def window(self) -> WindowSpec:
        """What canonicalization needs: the model's sliding window and the cache that holds it."""
        info = self.model.info
        return WindowSpec.for_model(info.n_swa, info.architecture, len(self.layout.caches))

    def _probe_layout(self) -> StateLayout:
        probe_cfg = self.config.replace(n_ctx=64, n_batch=64, n_ubatch=64)
        with Engine(self.model, probe_cfg).session() as s:
            s.prefill([self.model.bos])
            data = s.state_bytes()
        parsed = parse_state(data)
        if parsed.n_tokens != 1:
            raise EngineError(f"layout probe found {parsed.n_tokens} cells for 1 token")
        log.debug(
            "state layout: %s, %d caches, %d B/token",
            parsed.arch,
            len(parsed.layout.caches),
            parsed.layout.bytes_per_token(),
        )
        return parsed.layout

    def close(self) -> None:
        self.model.close()
