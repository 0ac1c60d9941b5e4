#!/usr/bin/env python3
"""The exactness suite of the GPU kit: graft vs fresh on the synthetic models, all layers offloaded.

    python gpu_exactness.py --models DIR --out receipts.json [--n-gpu-layers 99] [--quick]

For each synthetic model in DIR (gemma3.gguf with a 32-token window, llama.gguf with none), for
flash attention off and on, and for each (n_batch, n_ubatch) in SCHEDULES, it runs the paper's
experiment (engine/exactness.py: prefill a prefix, snapshot, graft it into a fresh context, prefill
the same question in both, compare the float32 logits' SHA-256 and 8 greedy tokens) at prefix lengths
under and past the window, and the engine's probe (engine/probe.py) under that schedule. It also
says whether the fresh logits of one prefix are the same bits under every schedule (batch
invariance: measured true on the CPU backend, not known for CUDA).

It writes one receipts JSON: every hash it compared, the build and machine it ran on, and the time
the run took, so a later run can be sized and anyone with the same build can re-check the hashes.
Exit status 0 when every graft was exact, 1 when one was not (the receipts say which), 2 on an error.
It imports only kvgraft.engine (numpy and llama_cpp), so it runs from a plain copy of the source.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

from kvgraft.engine.bindings import llama, supports_gpu_offload
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
from kvgraft.engine.exactness import graft_vs_fresh
from kvgraft.engine.probe import probe_prompt, run_probe

RECEIPT_KIND = "kvgraft-gpu-exactness"
RECEIPT_VERSION = 1
N_CTX = 1024
N_GEN = 8
QUESTION_TOKENS = 12
PREFIXES = (20, 100, 300, 700)  # tokens: under, and three past, the synthetic gemma3's 32-token window
SCHEDULES = ((512, 512), (512, 128), (256, 256), (64, 64), (37, 37))  # (n_batch, n_ubatch); 37 splits oddly
QUICK_PREFIXES = (20, 300)
QUICK_SCHEDULES = ((512, 512), (64, 64))
MODELS = ("gemma3.gguf", "llama.gguf")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_model(path: Path, n_gpu_layers: int, prefixes, schedules, say) -> dict:
    base = EngineConfig(model_path=path, n_ctx=N_CTX, n_gpu_layers=n_gpu_layers)
    engine = Engine.load(base, file_sha256(path))
    info = engine.model.info
    out = {
        "model": path.name,
        "sha256": info.sha256,
        "architecture": info.architecture,
        "n_swa": info.n_swa,
        "n_layer": info.n_layer,
        "environment": engine.environment,
        "runs": [],
    }
    try:
        question = probe_prompt(engine.model, QUESTION_TOKENS + 1)[1:]  # no BOS inside the question
        prompts = {n: probe_prompt(engine.model, n) for n in prefixes}
        for fa in (False, True):
            for n_batch, n_ubatch in schedules:
                cfg = base.replace(flash_attn=fa, n_batch=n_batch, n_ubatch=n_ubatch)
                eng = engine.with_config(cfg)
                t0 = time.perf_counter()
                records = [graft_vs_fresh(eng, prompts[n], question, N_GEN).as_dict() for n in prefixes]
                probe = run_probe(eng)
                run = {
                    "flash_attn": fa,
                    "n_batch": n_batch,
                    "n_ubatch": n_ubatch,
                    "exact": all(r["sha256_equal"] and r["tokens_equal"] for r in records),
                    "fingerprint": eng.fingerprint,
                    "probe": probe,
                    "records": records,
                    "seconds": round(time.perf_counter() - t0, 3),
                }
                out["runs"].append(run)
                past = sum(1 for n in prefixes if n > info.n_swa)
                window = f"{past} past the window" if info.n_swa > 0 else "no sliding window"
                say(
                    f"{path.name}: fa {'on ' if fa else 'off'} batch {n_batch}/{n_ubatch}: "
                    f"{sum(r['sha256_equal'] for r in records)}/{len(records)} byte-equal logits "
                    f"({window}), {run['seconds']:.2f} s"
                )
        out["schedule_invariant"] = schedule_invariance(out["runs"], prefixes)
    finally:
        engine.close()
    return out


def schedule_invariance(runs: list[dict], prefixes) -> dict:
    """Per flash-attention setting: are the fresh logits of each prefix the same bits under every schedule?"""
    verdict = {}
    for fa in (False, True):
        chosen = [r for r in runs if r["flash_attn"] is fa]
        per_prefix = [{r["records"][i]["fresh_logits_sha256"] for r in chosen} for i in range(len(prefixes))]
        verdict["fa_on" if fa else "fa_off"] = all(len(s) == 1 for s in per_prefix)
    return verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, required=True, help="folder holding gemma3.gguf and llama.gguf")
    ap.add_argument("--out", type=Path, required=True, help="the receipts JSON to write")
    ap.add_argument("--n-gpu-layers", type=int, default=99, help="layers to offload (99: all; ignored on CPU)")
    ap.add_argument("--quick", action="store_true", help="two prefixes and two schedules (the CPU rehearsal)")
    args = ap.parse_args(argv)
    prefixes = QUICK_PREFIXES if args.quick else PREFIXES
    schedules = QUICK_SCHEDULES if args.quick else SCHEDULES
    missing = [m for m in MODELS if not (args.models / m).is_file()]
    if missing:
        print(
            f"error: {args.models} lacks {', '.join(missing)} (scripts/synthetic_gguf.py writes them)", file=sys.stderr
        )
        return 2

    def say(line: str) -> None:
        print(line, flush=True)

    t0 = time.perf_counter()
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    say(f"backend: {'GPU' if supports_gpu_offload() else 'CPU'}, n_gpu_layers {args.n_gpu_layers}; {llama.__file__}")
    models = [check_model(args.models / m, args.n_gpu_layers, prefixes, schedules, say) for m in MODELS]
    run_s = time.perf_counter() - t0
    runs = [r for m in models for r in m["runs"]]
    receipt = {
        "kind": RECEIPT_KIND,
        "version": RECEIPT_VERSION,
        "started": started,
        "host": platform.node(),
        "backend": "GPU" if supports_gpu_offload() else "CPU",
        "n_gpu_layers": args.n_gpu_layers,
        "build": {
            "llama_cpp": llama.__file__,  # which build ran: the kit's, not an installed one
            "cmake_args": os.environ.get("CMAKE_ARGS", ""),
            "seconds": float(os.environ["KIT_BUILD_S"]) if os.environ.get("KIT_BUILD_S") else None,
        },
        "environment": [m.pop("environment") for m in models][0],  # one process, one build: the same for each
        "prefixes": list(prefixes),
        "schedules": [list(s) for s in schedules],
        "n_gen": N_GEN,
        "models": models,
        "all_exact": all(r["exact"] for r in runs),
        "runs": len(runs),
        "run_seconds": round(run_s, 3),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(receipt, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, args.out)
    exact = sum(r["exact"] for r in runs)
    inv = {m["model"]: m["schedule_invariant"] for m in models}
    say(f"exact runs: {exact}/{len(runs)}; schedule-invariant fresh logits: {inv}")
    say(f"run time: {run_s:.1f} s; receipts: {args.out}")
    return 0 if receipt["all_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
