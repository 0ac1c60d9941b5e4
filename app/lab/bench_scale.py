"""Library-scale figures for `kvgraft bench` and scripts/bench_lookup.py: lookup latency at N entries."""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kvgraft.app.core.textgen import synthetic_text
from kvgraft.library.library import Library
from kvgraft.library.scale import insert_benchmark_entries

FP = "e" * 64


def fill(
    lib: Library, start: int, stop: int, rng: random.Random, preambles: list[list[int]], blob_sha: str
) -> list[list[int]]:
    made, rows = [], []
    for i in range(start, stop):
        pre = rng.choice(preambles)[: rng.randint(0, 400)]
        toks = pre + [rng.randrange(262144) for _ in range(rng.randint(20, 300))]
        question = f"Question number {i}: what is {i} plus {i}?"
        rows.append((f"problem {i}", question, synthetic_text(40, i), toks, str(2 * i)))
        made.append(toks)
    insert_benchmark_entries(lib, rows, blob_sha, FP)
    return made


def _index_mb(lib: Library, home: Path) -> float:
    return round(lib.index_bytes() / 1e6, 1)


def timed(fn, queries) -> float:
    times = []
    for q in queries:
        t0 = time.perf_counter()
        fn(q)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def lookup_scale(sizes: list[int], log=lambda msg: None) -> list[dict]:
    """Fill one temp library in steps; at each size, median latency of many lookups of each kind."""
    rng = random.Random(0)
    preambles = [[rng.randrange(262144) for _ in range(400)] for _ in range(50)]
    home = Path(tempfile.mkdtemp(prefix="kvgraft-bench-lookup-"))
    lib = Library(home)
    try:
        stored = lib.blobs.put(b"\0")
        blob_sha = stored.sha256
        with lib.write():
            lib.insert_blob_row(stored)
        all_tokens: list[list[int]] = []
        results = []
        for size in sizes:
            t0 = time.perf_counter()
            all_tokens += fill(lib, len(all_tokens), size, rng, preambles, blob_sha)
            fill_s = time.perf_counter() - t0
            qrng = random.Random(size)
            exact_q = [
                f"Question number {i}: what is {i} plus {i}?" for i in (qrng.randrange(size) for _ in range(500))
            ]
            hits = [all_tokens[qrng.randrange(size)] + [qrng.randrange(262144) for _ in range(16)] for _ in range(200)]
            misses = [qrng.choice(preambles)[:300] + [qrng.randrange(262144) for _ in range(200)] for _ in range(200)]
            for q in exact_q[:20]:
                assert lib.find_question(q, FP) is not None
            for p in hits[:20]:
                assert lib.longest_prefix(p, FP) is not None
            row = {
                "entries": size,
                "fill_s": round(fill_s, 2),
                "exact_question_ms": timed(lambda q: lib.find_question(q, FP), exact_q) * 1e3,
                "longest_prefix_hit_ms": timed(lambda p: lib.longest_prefix(p, FP), hits) * 1e3,
                "longest_prefix_miss_ms": timed(lambda p: lib.longest_prefix(p, FP), misses) * 1e3,
                "fts_search_ms": timed(
                    lambda q: lib.search(q, limit=10), ["plus", "river stone", "question number 7"] * 30
                )
                * 1e3,
                "index_mb": _index_mb(lib, home),
            }
            results.append(row)
            log(
                f"{size:>7,} entries: exact {row['exact_question_ms']:.3f} ms | longest prefix hit "
                f"{row['longest_prefix_hit_ms']:.3f} ms, "
                f"miss {row['longest_prefix_miss_ms']:.3f} ms | FTS {row['fts_search_ms']:.3f} ms | index "
                f"{row['index_mb']} MB"
            )
        return results
    finally:
        lib.close()
        shutil.rmtree(home, ignore_errors=True)
