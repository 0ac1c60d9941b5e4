"""Where a graft has been shown exact on this device, and under which settings.

`kvgraft selftest` compares a grafted context with a fresh one on prefixes past the sliding window.
Its outcome is kept here, per engine fingerprint (model, backend, the settings that decide the bits,
the probe hashes) and device (llama.cpp build, CPU, system info), in the model cache beside the probe
cache, so that `kvgraft doctor` can say whether the graft has been shown exact here under the
settings in use, and under which other settings it has been. A check is shown for what it was: the
number of samples, how many were past the window, and when it ran.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from kvgraft.app.core.paths import model_dir
from kvgraft.engine.engine import Engine
from kvgraft.engine.probe import ProbeCache, cache_key

GRAFT_CHECKS = "graft-checks.json"  # in the model cache, beside the probe cache
CHECK_VERSION = 1


def graft_check_store(path: Path | None = None) -> ProbeCache:
    return ProbeCache(path or model_dir() / GRAFT_CHECKS, version=CHECK_VERSION)


def settings_of(engine: Engine) -> dict:
    """The settings a check ran under. The batch shape is part of them on every backend: it is part of
    the decode schedule, which decides the bits (on the CPU some splits, and with flash attention on
    any split into micro-batches, give other bits: README, "CUDA offload and the GPU kit"); on a GPU
    backend it is also in the fingerprint."""
    cfg = engine.config
    return {
        "backend": engine.backend,
        "n_gpu_layers": cfg.n_gpu_layers,
        "flash_attn": cfg.flash_attn,
        "type_k": cfg.type_k,
        "type_v": cfg.type_v,
        "n_batch": cfg.n_batch,
        "n_ubatch": cfg.n_ubatch,
    }


def _device_key(engine: Engine) -> str:
    return cache_key(
        {"fingerprint": engine.fingerprint, "environment": engine.environment, "settings": settings_of(engine)}
    )


def record_selftest(engine: Engine, result: dict, store: ProbeCache | None = None) -> dict:
    """Keep the outcome of run_selftest for this engine and device; returns the entry."""
    n = result["samples"]
    entry = {
        "version": CHECK_VERSION,
        "exact": result["sha256_equal"] == n and result["tokens_equal"] == n,
        "samples": n,
        "sha256_equal": result["sha256_equal"],
        "tokens_equal": result["tokens_equal"],
        "past_sliding_window": result["past_sliding_window"],
        "n_swa": result["n_swa"],
        "checked_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "by": "kvgraft selftest",
        "fingerprint": engine.fingerprint,
        "model_sha256": engine.model.info.sha256,
        "environment": engine.environment,
        "settings": settings_of(engine),
    }
    (store or graft_check_store()).put(_device_key(engine), entry)
    return entry


def graft_check_report(engine: Engine, store: ProbeCache | None = None) -> dict:
    """What `kvgraft doctor` says: "exact", "not exact" or "not checked" for the settings in use, and
    the other settings this model was checked under on this device."""
    store = store or graft_check_store()
    key = _device_key(engine)
    entries = store.entries()
    here = entries.get(key)
    others = [
        {k: e[k] for k in ("exact", "samples", "past_sliding_window", "checked_at", "settings")}
        for k2, e in sorted(entries.items(), key=lambda kv: kv[1].get("checked_at", ""))
        if k2 != key
        and e.get("model_sha256") == engine.model.info.sha256
        and e.get("environment") == engine.environment
    ]
    status = "not checked" if here is None else ("exact" if here["exact"] else "not exact")
    return {"status": status, "this_config": here, "other_settings": others}


def settings_words(s: dict) -> str:
    batch = f"batch {s['n_batch']}/{s['n_ubatch']}"
    gpu = f", {s['n_gpu_layers']} GPU layers" if s["backend"] != "CPU" else ""
    return (
        f"{s['backend']}{gpu}, flash attention {'on' if s['flash_attn'] else 'off'}, "
        f"KV {s['type_k']}/{s['type_v']}, {batch}"
    )


def check_words(report: dict) -> list[str]:
    """Human lines for the doctor's graft-check section."""
    here = report["this_config"]
    if here is None:
        lines = ["not shown on this device under these settings: run `kvgraft selftest` to check"]
    else:
        past = here["past_sliding_window"]
        window = "no sliding window" if past is None else f"{past} past the {here['n_swa']}-token window"
        verdict = "shown exact here" if here["exact"] else "NOT exact here"
        lines = [
            f"{verdict}: {here['sha256_equal']}/{here['samples']} byte-equal logits, "
            f"{here['tokens_equal']}/{here['samples']} equal greedy tokens ({window}), "
            f"{here['by']} at {here['checked_at']}",
            f"under {settings_words(here['settings'])}",
        ]
    for o in report["other_settings"]:
        verdict = "exact" if o["exact"] else "NOT exact"
        lines.append(f"also checked here: {verdict} under {settings_words(o['settings'])} ({o['checked_at']})")
    return lines
