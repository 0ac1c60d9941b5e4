"""`kvgraft demo` (engine stage): deposit a document's state, graft it back, prove it exact, time it.

For each prefix length: prefill a synthetic document fresh (timed), snapshot it and write the
blob to `<data dir>/demo/` (atomic: temp file, fsync, rename), read it back and check its
SHA-256, graft it into a new context (read + check + graft timed, median of 3), then decode the
same probe in both contexts and compare logits (SHA-256) and 8 greedy tokens.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from pathlib import Path
from typing import Callable

from engine.compare import compare_logits
from engine.engine import Engine
from engine.session import Snapshot

from .paths import data_dir
from .textgen import prefix_tokens

DEMO_LENGTHS = (1000, 2000, 3000)
PROBE = " Question: what does the river carry in the story above? Answer:"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _read_checked(path: Path, sha256: str) -> bytes:
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError(f"blob {path} does not match its SHA-256")
    return data


def run_demo(engine: Engine, lengths=DEMO_LENGTHS, on_step: Callable[[str], None] | None = None) -> dict:
    say = on_step or (lambda _m: None)
    out_dir = data_dir() / "demo"
    out_dir.mkdir(parents=True, exist_ok=True)
    probe = engine.model.tokenize(PROBE, add_bos=False)
    rows = []
    for n in lengths:
        toks = prefix_tokens(engine.model, n, seed=n)
        say(f"prefilling a {n}-token document fresh")
        with engine.session() as s:
            t0 = time.perf_counter()
            s.prefill(toks)
            prefill_s = time.perf_counter() - t0
            snap = s.snapshot()
            s.prefill(probe)
            fresh_logits = s.logits()
            fresh_gen = s.generate(8)
        blob = out_dir / f"{snap.sha256}.state"
        _write_atomic(blob, snap.data)
        say(f"deposited {len(snap.data) / 1e6:.1f} MB as {blob.name[:16]}...; grafting it back")
        graft_times = []
        for _ in range(3):
            with engine.session() as g:
                t0 = time.perf_counter()
                data = _read_checked(blob, snap.sha256)
                g.graft(Snapshot(data, snap.tokens, engine.fingerprint, snap.sha256), bytes_verified=True)
                graft_times.append(time.perf_counter() - t0)
                g.prefill(probe)
                graft_logits = g.logits()
                graft_gen = g.generate(8)
        cmp = compare_logits(fresh_logits, graft_logits)
        graft_s = statistics.median(graft_times)
        rows.append({
            "prefix_tokens": n,
            "blob_sha256": snap.sha256,
            "blob_bytes": len(snap.data),
            "prefill_s": prefill_s,
            "graft_s": graft_s,
            "speedup": prefill_s / graft_s,
            "logits_sha256_fresh": cmp.sha256_a,
            "logits_sha256_graft": cmp.sha256_b,
            "sha256_equal": cmp.sha256_equal,
            "tokens_equal": fresh_gen.tokens == graft_gen.tokens,
            "continuation": graft_gen.text,
        })
    return {"fingerprint": engine.fingerprint, "rows": rows, "all_exact": all(r["sha256_equal"] and r["tokens_equal"] for r in rows)}


def format_demo(result: dict) -> str:
    head = f"{'prefix tokens':>13} | {'blob MB':>7} | {'fresh prefill':>13} | {'graft (read+check+restore)':>26} | {'ratio':>6} | exact"
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        exact = "yes (logits SHA-256 equal, tokens equal)" if r["sha256_equal"] and r["tokens_equal"] else "NO"
        lines.append(
            f"{r['prefix_tokens']:>13,} | {r['blob_bytes'] / 1e6:>7.1f} | {r['prefill_s']:>11.2f} s | "
            f"{r['graft_s'] * 1e3:>23.1f} ms | {r['speedup']:>5.0f}x | {exact}"
        )
    return "\n".join(lines)
