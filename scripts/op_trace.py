"""Op by op: which kernel ran and whether its bits depend on the rows in the call, or on the build.

    .venv/bin/python scripts/op_trace.py                       # the engine's build and mode, the 270M
    .venv/bin/python scripts/op_trace.py --flash-attn --kv q8_0
    .venv/bin/python scripts/op_trace.py --model qwen2.5-coder-1.5b
    .venv/bin/python scripts/op_trace.py --build stock=build/llama-default/lib:upstream
                                           # beside the engine: another build's libraries, in a mode
    .venv/bin/python scripts/op_trace.py --variants DIR        # each CPU variant of a portable build
                                           # (make bundle: --no-engine --require-invariant on its own)

The same tokens are decoded in a fresh context as one call and as each split below, every row an output
row, and llama.cpp's eval callback hands over each computed op's output (engine/op_trace.py). Per op
label (the op and, for a product, its weights' type), the table says which kernel serves it at the row
counts the splits take, by the dispatch of the patched source in the engine's mode (docs/exact-graft.md,
"The switches"), and how many (node, token) rows equal the one call's. An op that differs while each of
its computed inputs is equal is where the bits part ("origin"). With other builds, each build's one call
is compared with the first build's the same way: which ops make a CPU variant's bits its own.
Each build runs in its own process (llama.cpp reads its switches once per process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvgraft.engine.switches import MODE, SWITCH, VARIABLES  # noqa: E402  (no llama import)

N = 48  # tokens: more than 16 (the small-row kernel's bound), fewer than 256 (one KV padding step)
SPLITS = {
    "one-token calls": [1] * N,
    "calls of 1-16 rows": [1, 2, 3, 7, 8, 15, 12],
    "16 then 17 rows": [15, 16, 17],
    "31 rows then 17": [31, 17],
}
K_QUANTS = {"q2_K", "q3_K", "q4_K", "q5_K", "q6_K"}


def kernel(label: str, rows: set[int], mode: str) -> str:
    """The kernel the patched source dispatches `label` to at these row counts, in `mode` (read from
    the source, not observed: ggml-cpu.c's mul_mat, tiled.cpp, sgemm.cpp and our patches)."""
    op, _, weight = label.partition(" ")
    small, big = any(r <= 16 for r in rows), any(r > 16 for r in rows)
    if op == "MUL_MAT" and mode == "tiled-small":
        if weight in ("q4_K", "q6_K"):
            return " + ".join(k for k, on in (("small-row kernel", small), ("tiled K-quant GEMM", big)) if on)
        if weight in K_QUANTS:
            return "tiled K-quant GEMM (its narrow path at 1-16 rows)"
        if weight in ("f16", "f32", "bf16"):
            return "tinyBLAS (sgemm) at every row count"
        one, more = 1 in rows, any(r > 1 for r in rows)
        return " + ".join(k for k, on in ((f"vec_dot_{weight}_q8_0", one), ("tinyBLAS_Q0", more)) if on)
    if op == "FLASH_ATTN_EXT":
        return "one_chunk (per query row)" if mode != "upstream" else "by shape: split-KV / tiled / one_chunk"
    if op == "MUL_MAT":
        return "llama.cpp's own switches (by row count)"
    return "row-wise ggml-cpu op"


def child(model: str, fa: bool, kv: str, out: Path) -> None:
    from kvgraft.app.core.model_registry import known
    from kvgraft.app.core.model_store import embedded_model_path, model_sha256
    from kvgraft.app.core.paths import model_dir
    from kvgraft.app.core.textgen import prefix_tokens
    from kvgraft.engine import op_trace
    from kvgraft.engine.bindings import cpu_backend
    from kvgraft.engine.config import EngineConfig
    from kvgraft.engine.engine import Engine

    path = embedded_model_path() if model == "270m" else model_dir() / known(model).file_name
    cfg = EngineConfig(model_path=path, n_ctx=1024, flash_attn=fa, type_k=kv, type_v=kv, lookup=0)
    engine = Engine.load(cfg, model_sha256(path))
    try:
        tokens = prefix_tokens(engine.model, N, seed=5)
        traces = {"one call": op_trace.to_json(op_trace.trace(engine, tokens, [N]))}
        for name, calls in SPLITS.items():
            traces[name] = op_trace.to_json(op_trace.trace(engine, tokens, calls))
        inv = engine.probe["invariance"]
        probe = {
            "invariant": engine.batch_invariant,
            "splits": f"{sum(x['same'] for x in inv['splits'])} of {len(inv['splits'])}",
            "logits": [c["logits_sha256"][:12] for c in engine.probe["cases"]],
            "states": [c["snapshot_sha256"][:12] for c in engine.probe["cases"]],
        }
        out.write_text(json.dumps({"cpu": cpu_backend().describe(), "probe": probe, "traces": traces}))
    finally:
        engine.close()


def run_build(name: str, lib: Path | None, mode: str, args, work: Path, optional: bool = False) -> dict | None:
    """One build's traces, from a process of its own; None for an `optional` build that could not run
    (a CPU variant this CPU lacks the instructions for)."""
    env = {k: v for k, v in os.environ.items() if k not in (*VARIABLES, SWITCH, "LLAMA_CPP_LIB_PATH")}
    env[SWITCH] = "0" if mode == "upstream" else mode
    if lib is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib.resolve())
    out = work / f"{name}.json"
    cmd = [sys.executable, __file__, "--child", str(out), "--model", args.model, "--kv", args.kv]
    cmd += ["--flash-attn"] if args.flash_attn else []
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0 and optional:
        print(f"{name}: did not run here: {res.stderr.strip().splitlines()[-1:]}", file=sys.stderr, flush=True)
        return None
    if res.returncode != 0:
        raise SystemExit(f"{name}: failed\n{res.stderr[-3000:]}")
    print(f"{name}: traced", file=sys.stderr, flush=True)
    return json.loads(out.read_text())


def variant_builds(root: Path, work: Path) -> list[tuple[str, Path, str]]:
    """One library folder per CPU variant of a portable build: its core libraries and that variant only
    (ggml then registers it if this CPU can run it)."""
    builds = []
    for lib in sorted(root.glob("libggml-cpu-*.so")):
        variant = lib.name.removeprefix("libggml-cpu-").removesuffix(".so")
        folder = work / f"lib-{variant}"
        folder.mkdir()
        for core in root.iterdir():
            if core.is_file() and not core.name.startswith("libggml-cpu-"):
                (folder / core.name).symlink_to(core.resolve())
        (folder / lib.name).symlink_to(lib.resolve())
        builds.append((variant, folder, MODE))
    return builds


def _table(verdicts: dict[str, list], kernel_of: dict[str, str] | None = None) -> None:
    """One row per op label, one column per compared trace (the verdict lists share their labels' order)."""
    columns = list(verdicts)
    print("| op | " + ("kernel | " if kernel_of else "") + " | ".join(columns) + " |")
    print("|---|" + ("---|" if kernel_of else "") + "---|" * len(columns))
    for i, v in enumerate(verdicts[columns[0]]):
        cells = [_cell(verdicts[c][i]) for c in columns]
        print(f"| {v.label} | " + (f"{kernel_of.get(v.label, '')} | " if kernel_of else "") + " | ".join(cells) + " |")


def _cell(w) -> str:
    if not w.compared:
        return "not compared"
    return f"{w.equal}/{w.compared}" + (f" ({w.origins} origin)" if w.origins else "")


def report(results: dict[str, dict], mode_of: dict[str, str]) -> None:
    from kvgraft.engine import op_trace

    print("\nthe engine's probe (engine/probe.py) in each build: its 16- and 600-token prompts' logits and states")
    print("| build | CPU backend | invariant | probe splits with one call's bits | logits SHA-256 | state SHA-256 |")
    print("|---|---|---|---|---|---|")
    for name, res in results.items():
        p = res["probe"]
        print(
            f"| {name} | {res['cpu']} | {'yes' if p['invariant'] else 'no'} | {p['splits']} | "
            f"{', '.join(p['logits'])} | {', '.join(p['states'])} |"
        )

    for name, res in results.items():
        traces = {k: op_trace.from_json(v) for k, v in res["traces"].items()}
        one = traces.pop("one call")
        print(f"\n{name} ({mode_of[name]}; {res['cpu']}): each split against one call of {N} tokens")
        verdicts = {split: op_trace.compare(one, t) for split, t in traces.items()}
        rows: dict[str, set[int]] = {}
        for t in traces.values():
            for r in t.values():
                rows.setdefault(r.label, set()).update(r.call_rows.values())
        kernels = {label: kernel(label, seen, mode_of[name]) for label, seen in rows.items()}
        _table(verdicts, kernels)
    names = list(results)
    if len(names) > 1:
        base = op_trace.from_json(results[names[0]]["traces"]["one call"])
        print(f"\nacross builds: each build's one call against {names[0]}'s")
        others = {n: op_trace.from_json(results[n]["traces"]["one call"]) for n in names[1:]}
        _table({n: op_trace.compare(base, t) for n, t in others.items()})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="270m", help="270m or a model of the registry (kvgraft models)")
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--kv", choices=("f16", "q8_0"), default="f16")
    ap.add_argument(
        "--build",
        action="append",
        default=[],
        metavar="NAME=LIBDIR:MODE",
        help="another build to trace beside the engine's (repeatable)",
    )
    ap.add_argument("--variants", type=Path, help="a portable build's lib folder: trace each CPU variant")
    ap.add_argument("--no-engine", action="store_true", help="only the --build / --variants builds")
    ap.add_argument(
        "--require-invariant", action="store_true", help="exit 1 when a build's probe says not invariant (make bundle)"
    )
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.kv != "f16" and not args.flash_attn:
        ap.error("a q8_0 KV cache needs --flash-attn")
    if args.child:
        child(args.model, args.flash_attn, args.kv, args.child)
        return 0
    work = Path(tempfile.mkdtemp(prefix="op-trace-"))
    builds: list[tuple[str, Path | None, str]] = [] if args.no_engine else [("engine", None, MODE)]
    for spec in args.build:
        name, _, rest = spec.partition("=")
        lib, _, mode = rest.rpartition(":")
        builds.append((name, Path(lib), mode or MODE))
    variants = variant_builds(args.variants, work) if args.variants else []
    results, mode_of, skipped = {}, {}, []
    for name, lib, mode in builds + variants:
        res = run_build(name, lib, mode, args, work, optional=(name, lib, mode) in variants)
        if res is None:
            skipped.append(name)
            continue
        results[name], mode_of[name] = res, mode
    print(f"{args.model}, {N} tokens, flash attention {'on' if args.flash_attn else 'off'}, KV {args.kv}")
    report(results, mode_of)
    if skipped:
        print(f"\nnot run on this CPU (it lacks their instructions): {', '.join(skipped)}")
    lost = [n for n, r in results.items() if not r["probe"]["invariant"] and mode_of[n] != "upstream"]
    if args.require_invariant and lost:
        print(f"not batch-invariant: {', '.join(lost)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
