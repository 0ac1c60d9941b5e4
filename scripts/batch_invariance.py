"""Do the bits depend on how the same tokens are split into decode calls? (docs/exact-graft.md, "The switches")

    .venv/bin/python scripts/batch_invariance.py                        # the engine as kvgraft loads it
    .venv/bin/python scripts/batch_invariance.py --mode upstream --flash-attn      # llama.cpp's own switches
    .venv/bin/python scripts/batch_invariance.py --lib build/llama-default/lib --mode upstream  # as PyPI builds it
    .venv/bin/python scripts/batch_invariance.py --all --json out.json   # every --mode x flash attention
    .venv/bin/python scripts/batch_invariance.py --probe qwen2.5-coder-1.5b  # the engine's own check, timed

The same N tokens are decoded in a fresh context as each split (one call, [N-1, 1], [64] x k + rest, ...);
the logits after the last token and the canonical state are hashed, and the splits are grouped by equal
bits. Modes (engine/switches.py; the engine's own by default): `tiled-small`, `tiled`, `per-row`, `per-row-no-sgemm`,
and `upstream` (llama.cpp's own switches). llama.cpp reads them once per process, so each mode runs in
its own process. `--lib DIR` loads llama.cpp's libraries from DIR (LLAMA_CPP_LIB_PATH): `python
packaging/llama_build.py --stock` puts the unpatched build's in build/llama-default/lib. Prints a table;
the first group is the one-call bits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvgraft.engine.switches import MODE, MODES, SWITCH, VARIABLES  # noqa: E402  (no llama import)


def splits(n: int) -> list[list[int]]:
    """The splits FINDINGS.md and issue 41 name, for n tokens (n > 650)."""
    return [
        [n],
        [600, n - 600],
        [512, n - 512],
        [n - 10, 10],
        [64] * (n // 64) + ([n % 64] if n % 64 else []),
        [n - 1, 1],
        [n - 2, 1, 1],
        [n - 3, 3],
        [n - 4, 4],
        [n - 7, 7],
        [n - 8, 8],
        [650] + [1] * (n - 650),
        [1] * 40 + [n - 40],
    ]


def measure(n: int, flash_attn: bool, n_threads: int, seed: int, kv: str = "f16") -> dict:
    """One process: every split's (logits SHA-256, canonical state SHA-256) and wall seconds."""
    from kvgraft.app.core.model_store import embedded_model_path, model_sha256
    from kvgraft.app.core.textgen import prefix_tokens
    from kvgraft.app.proof.replay import decode_in_calls
    from kvgraft.engine.compare import logits_sha256
    from kvgraft.engine.config import EngineConfig
    from kvgraft.engine.engine import Engine

    path = embedded_model_path()
    engine = Engine.load(
        EngineConfig(model_path=path, flash_attn=flash_attn, n_threads=n_threads, type_k=kv, type_v=kv),
        model_sha256(path),
    )
    try:
        tokens = prefix_tokens(engine.model, n, seed=seed)
        rows = []
        for calls in splits(n):
            with engine.session() as s:
                t0 = time.perf_counter()
                decode_in_calls(s, tokens, calls)
                wall = time.perf_counter() - t0
                rows.append(
                    {"calls": calls, "logits": logits_sha256(s.logits()), "state": s.snapshot().sha256, "s": wall}
                )
        return {"backend": engine.backend, "rows": rows}
    finally:
        engine.close()


def label(calls: list[int]) -> str:
    out, i = [], 0
    while i < len(calls):
        j = i
        while j < len(calls) and calls[j] == calls[i]:
            j += 1
        out.append(f"[{calls[i]}]x{j - i}" if j - i > 2 else ",".join(map(str, calls[i:j])))
        i = j
    return " + ".join(out)


def report(mode: str, flash_attn: bool, result: dict) -> str:
    rows = result["rows"]
    groups: dict[tuple, int] = {}
    for r in rows:
        groups.setdefault((r["logits"], r["state"]), len(groups))
    one = groups[(rows[0]["logits"], rows[0]["state"])]
    same = sum(groups[(r["logits"], r["state"])] == one for r in rows)
    lines = [
        f"mode={mode} flash_attn={'on' if flash_attn else 'off'}: {same} of {len(rows)} splits give the one-call bits"
    ]
    for r in rows:
        g = groups[(r["logits"], r["state"])]
        lines.append(f"  group {g}  {r['logits'][:12]} {r['state'][:12]}  {r['s']:6.2f} s  {label(r['calls'])}")
    return "\n".join(lines)


def probe_run(model: str, flash_attn: bool) -> int:
    """The engine's own load-time check (engine/invariance.py), timed on a fresh engine (no probe cache)."""
    from kvgraft.app.core.model_registry import known
    from kvgraft.app.core.model_store import embedded_model_path, model_sha256
    from kvgraft.app.core.paths import model_dir
    from kvgraft.engine.config import EngineConfig
    from kvgraft.engine.engine import Engine

    path = embedded_model_path() if model == "270m" else model_dir() / known(model).file_name
    engine = Engine.load(EngineConfig(model_path=path, flash_attn=flash_attn), model_sha256(path))
    try:
        t0 = time.perf_counter()
        inv = engine.probe["invariance"]
        wall = time.perf_counter() - t0
        differ = [s["name"] for s in inv["splits"] if not s["same"]]
        print(
            f"{model} flash_attn={'on' if flash_attn else 'off'}: probe {wall:.1f} s, invariant {inv['invariant']}"
            f"{' (differ: ' + ', '.join(differ) + ')' if differ else ''}, n_threads decides bits "
            f"{inv['threads_decide_bits']}"
        )
    finally:
        engine.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=700, help="tokens (more than 650)")
    ap.add_argument("--mode", choices=list(MODES), default=MODE)
    ap.add_argument("--lib", type=Path, help="llama.cpp's libraries from this folder (LLAMA_CPP_LIB_PATH)")
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", choices=("f16", "q8_0"), default="f16", help="KV cache type (q8_0 needs --flash-attn)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--all", action="store_true", help="every --mode, flash attention off and on")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--probe", metavar="MODEL", help="time the engine's probe instead (270m or a known model name)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.n <= 650:
        ap.error("--n must be more than 650 (the splits include 650 + single tokens)")
    if args.probe:
        return probe_run(args.probe, args.flash_attn)
    if args.child:
        print(json.dumps(measure(args.n, args.flash_attn, args.threads, args.seed, args.kv)))
        return 0
    results = []
    configs = [(m, fa) for m in MODES for fa in (False, True)] if args.all else [(args.mode, args.flash_attn)]
    base = {k: v for k, v in os.environ.items() if k not in (*VARIABLES, SWITCH)}
    if args.lib:
        base["LLAMA_CPP_LIB_PATH"] = str(args.lib.resolve())
    for mode, fa in configs:
        cmd = [sys.executable, __file__, "--child", "--n", str(args.n), "--threads", str(args.threads)]
        cmd += ["--seed", str(args.seed), "--kv", args.kv] + (["--flash-attn"] if fa else [])
        out = subprocess.run(
            cmd, env={**base, SWITCH: "0" if mode == "upstream" else mode}, capture_output=True, text=True
        )
        if out.returncode != 0:
            print(f"mode={mode} flash_attn={fa}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            return 1
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(report(mode, fa, result), flush=True)
        run = {"mode": mode, "lib": str(args.lib or ""), "flash_attn": fa, "n": args.n, "threads": args.threads}
        results.append({**run, **result})
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
