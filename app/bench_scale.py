"""Library-scale figures for `kvgraft bench` and scripts/bench_lookup.py: lookup latency at N entries."""

from __future__ import annotations

import datetime
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kvgraft.library.index import Library
from kvgraft.library.normalize import question_key
from kvgraft.library.schema import insert_prefix_keys
from kvgraft.library.tokens import pack_tokens, tokens_sha256

from .textgen import synthetic_text

FP = "e" * 64


def fill(
    lib: Library, start: int, stop: int, rng: random.Random, preambles: list[list[int]], blob_sha: str
) -> list[list[int]]:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    made = []
    with lib.write():
        for i in range(start, stop):
            pre = rng.choice(preambles)[: rng.randint(0, 400)]
            toks = pre + [rng.randrange(262144) for _ in range(rng.randint(20, 300))]
            cur = lib.db.conn.execute(
                "INSERT INTO entries (kind, title, question, question_key, text, tokens, n_tokens, tokens_sha256, "
                "answer, blob_sha256, blob_size, fingerprint, source, created_at, proof) "
                "VALUES ('solution', ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, 'local', ?, 'local')",
                [
                    f"problem {i}",
                    f"Question number {i}: what is {i} plus {i}?",
                    question_key(f"Question number {i}: what is {i} plus {i}?"),
                    synthetic_text(40, i),
                    pack_tokens(toks),
                    len(toks),
                    tokens_sha256(toks),
                    str(2 * i),
                    blob_sha,
                    FP,
                    now,
                ],
            )
            insert_prefix_keys(lib.db, cur.lastrowid, pack_tokens(toks), len(toks))
            made.append(toks)
    return made


def _index_mb(lib: Library, home: Path) -> float:
    lib.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return round((home / "index.db").stat().st_size / 1e6, 1)


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
