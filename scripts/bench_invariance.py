"""What the batch-invariant build costs: prefill and decode tokens/s, default build vs invariant, side by side.

    .venv/bin/python scripts/bench_invariance.py                  # both models, 3 rounds (~6 min on 2 cores)
    .venv/bin/python scripts/bench_invariance.py --models 270m --rounds 1
    .venv/bin/python scripts/bench_invariance.py --builds default tiled-small per-row-no-sgemm
                                                  # the stock build, the engine's mode and the one before it
    .venv/bin/python scripts/bench_invariance.py --models 270m --prompt 1700 --turn 19 --reply 1
                                                  # a warm server turn: what part of its time is the build's
    .venv/bin/python scripts/bench_invariance.py --builds default tiled-small --flash-attn [--kv q8_0]
                                                  # flash attention (one_chunk for every call in the modes)

Builds compared, each in its own process (llama.cpp reads its switches once per process):
  default      llama-cpp-python 0.3.36 unpatched, as PyPI builds it (`python packaging/llama_build.py
               --stock` puts its libraries in build/llama-default/lib; loaded through LLAMA_CPP_LIB_PATH)
  tiled-small, tiled, per-row, per-row-no-sgemm
               the patched build in each invariant mode of engine/switches.py (tiled-small is the
               engine's; per-row-no-sgemm was, before it)
Rounds alternate the builds, so drift hits them alike; the table shows each build's median and its ratio to
the default's. The workloads: a cold prompt (512 tokens in one call) plus a 64-token reply, and a warm turn
(40 new tokens after the 512 already held) plus a 64-token reply; greedy, one token per call (lookup off).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvgraft.engine.switches import MODES, SWITCH, VARIABLES  # noqa: E402  (no llama import)

BUILDS = ("default", *[m for m in MODES if m != "upstream"])
PROMPT, TURN, REPLY = 512, 40, 64


STOCK_LIB = REPO / "build/llama-default/lib"  # python packaging/llama_build.py --stock


def add_stock_option(ap: argparse.ArgumentParser) -> None:
    """The servers' benchmarks' --stock: kvgraft serve again, on llama.cpp as shipped."""
    ap.add_argument(
        "--stock",
        nargs="?",
        type=Path,
        const=STOCK_LIB,
        default=None,
        help=f"also run kvgraft serve on llama.cpp as shipped (its libraries; default {STOCK_LIB.relative_to(REPO)}, "
        "from python packaging/llama_build.py --stock): what the exact kernels cost the server",
    )


def check_stock_option(ap: argparse.ArgumentParser, stock: Path | None) -> None:
    if stock and not (stock / "libllama.so").is_file():
        ap.error(f"no stock build in {stock}: python packaging/llama_build.py --stock")


def build_overrides(build: str, default_lib: Path) -> dict:
    """What a child measuring `build` changes in its environment (None: unset): llama.cpp as shipped
    (the stock libraries, its own switches), or kvgraft's build in one of its invariant modes."""
    env: dict = {k: None for k in (*VARIABLES, "LLAMA_CPP_LIB_PATH")}
    if build == "default":
        env["LLAMA_CPP_LIB_PATH"] = str(default_lib.resolve())
        env[SWITCH] = "0"
    else:
        env[SWITCH] = build
    return env


def build_env(build: str, default_lib: Path) -> dict:
    """The whole environment of a child measuring `build` (build_overrides applied to this one's)."""
    env = {**os.environ, **build_overrides(build, default_lib)}
    return {k: v for k, v in env.items() if v is not None}


def measure(
    model: str,
    threads: int,
    prompt: int = PROMPT,
    turn: int = TURN,
    reply: int = REPLY,
    fa: bool = False,
    kv: str = "f16",
) -> dict:
    """One process: seconds for the prompt, the reply after it, the warm turn and the reply after it."""
    from kvgraft.app.core.model_registry import known
    from kvgraft.app.core.model_store import embedded_model_path, model_sha256
    from kvgraft.app.core.paths import model_dir
    from kvgraft.app.core.textgen import prefix_tokens
    from kvgraft.engine.config import EngineConfig
    from kvgraft.engine.engine import Engine

    path = embedded_model_path() if model == "270m" else model_dir() / known(model).file_name
    n_ctx = max(1024, -(-(prompt + turn + reply) // 256) * 256)
    cfg = EngineConfig(model_path=path, n_ctx=n_ctx, n_threads=threads, lookup=0, flash_attn=fa, type_k=kv, type_v=kv)
    engine = Engine.load(cfg, model_sha256(path))
    try:
        toks = prefix_tokens(engine.model, prompt + turn, seed=3)
        with engine.session() as s:
            s.prefill(toks[:8])  # warm the kernels and buffers outside the clock
        with engine.session() as s:
            t0 = time.perf_counter()
            s.prefill(toks[:prompt])
            t1 = time.perf_counter()
            s.generate(reply, stop_at_eog=False)
            t2 = time.perf_counter()
            s.trim(prompt)
            t3 = time.perf_counter()
            s.prefill(toks[prompt:])
            t4 = time.perf_counter()
            s.generate(reply, stop_at_eog=False)
            t5 = time.perf_counter()
        return {"prefill": t1 - t0, "reply": t2 - t1, "turn": t4 - t3, "turn_reply": t5 - t4}
    finally:
        engine.close()


def table(results: dict, prompt: int = PROMPT, reply: int = REPLY) -> str:
    lines = [
        "| model | build | prefill tok/s | decode tok/s | cold prompt + reply (s) | warm turn + reply (s) "
        "| vs default |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, by_build in results.items():
        base = None
        for build in BUILDS:
            runs = by_build.get(build)
            if not runs:
                continue
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            cold = med["prefill"] + med["reply"]
            warm = med["turn"] + med["turn_reply"]
            if base is None:
                base = (cold, warm)
            ratio = f"cold {base[0] / cold:.2f}x, warm {base[1] / warm:.2f}x"
            lines.append(
                f"| {model} | {build} | {prompt / med['prefill']:.0f} | {reply / med['reply']:.1f} | "
                f"{cold:.2f} | {warm:.2f} | {ratio} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["270m", "qwen2.5-coder-1.5b"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--default-lib", type=Path, default=STOCK_LIB)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--builds", nargs="+", choices=BUILDS, default=list(BUILDS), help="the builds to compare")
    ap.add_argument("--prompt", type=int, default=PROMPT, help="tokens of the cold prompt (one prefill)")
    ap.add_argument("--turn", type=int, default=TURN, help="new tokens of the warm turn, after the prompt")
    ap.add_argument("--reply", type=int, default=REPLY, help="tokens decoded after each")
    ap.add_argument("--flash-attn", action="store_true", help="flash attention on (off: the engine's default)")
    ap.add_argument(
        "--kv", choices=("f16", "q8_0"), default="f16", help="the KV cache's type (q8_0 needs --flash-attn)"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.kv != "f16" and not args.flash_attn:
        ap.error("a q8_0 KV cache needs --flash-attn")
    sizes = ["--prompt", str(args.prompt), "--turn", str(args.turn), "--reply", str(args.reply), "--kv", args.kv]
    sizes += ["--flash-attn"] if args.flash_attn else []
    if args.child:
        print(
            json.dumps(measure(args.child, args.threads, args.prompt, args.turn, args.reply, args.flash_attn, args.kv))
        )
        return 0
    builds = [b for b in BUILDS if b in args.builds]
    if not (args.default_lib / "libllama.so").is_file() and "default" in builds:
        builds.remove("default")
    if "default" not in builds:
        print(f"no default build in {args.default_lib}: comparing the patched build's modes only", file=sys.stderr)
    results: dict = {m: {} for m in args.models}
    for r in range(args.rounds):
        for model in args.models:
            for build in builds:
                cmd = [sys.executable, __file__, "--child", model, "--threads", str(args.threads), *sizes]
                out = subprocess.run(cmd, env=build_env(build, args.default_lib), capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{model} {build}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                    return 1
                results[model].setdefault(build, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1}/{args.rounds} {model} {build}: done", file=sys.stderr, flush=True)
    print(
        f"{args.threads} threads, {args.rounds} rounds, medians; {os.uname().machine}; prompt {args.prompt}, "
        f"turn {args.turn}, reply {args.reply} tokens; flash attention {'on' if args.flash_attn else 'off'}, "
        f"KV {args.kv}"
    )
    print(table(results, args.prompt, args.reply))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
