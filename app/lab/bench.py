"""`kvgraft bench`: kvgraft against the peers, side by side in one run, with receipts.

Time to first token (TTFT) for a stored prefix of L tokens followed by the same 16-token question:
  fresh                        prefill prefix, then the question, in a reused context
  kvgraft                      look up the entry, read its blob with the integrity check, graft, prefill the question
  llama_cpp_python_state       llama-cpp-python's Llama.load_state(), then the question
  llama_cpp_python_disk_cache  its LlamaDiskCache fetch + load_state(), then the question
  floor                        read the stored blob from the page cache + one memcpy of it (no TTFT; exact is null)
Each method's median over several runs. "exact" is only ever the result of a logits comparison
(null where none ran): for fresh, that its runs (same prompt, same decode schedule) gave
SHA-256-equal logits, i.e. run-to-run determinism (null with a single run; also `deterministic`);
for every other method, that each of its runs gave logits SHA-256-equal to every fresh run of
that stack. Also: the graft alone (read + check + restore) vs prefilling the prefix, the same graft
with and without compaction (blob bytes per token on disk and graft time), decode-token economy on
starter problems, lookup latency by library size, and for f16 and q8_0 KV caches the whole-state
bytes per token and the stored (compacted) bytes per token, with graft exactness.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kvgraft.app import __version__
from kvgraft.app.answer.ask import ask
from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.app.lab.bench_kv_types import kv_types
from kvgraft.app.lab.bench_question import QUESTION
from kvgraft.app.lab.bench_recurring import recurring
from kvgraft.app.lab.bench_scale import lookup_scale
from kvgraft.app.lab.starter_problems import GENERATOR, starter_problems
from kvgraft.app.proof.checkers import get_checker
from kvgraft.app.service import LibraryService
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.engine import Engine
from kvgraft.engine.peers import LlamaCppPythonPeer
from kvgraft.library.library import Library
from kvgraft.library.tokens import tokens_sha256

TARGETS = {
    "graft_vs_prefill": {2048: 150, 4096: 200},
    "ttft_fresh_vs_kvgraft": {2048: 50, 4096: 100},
    "peer_state_vs_kvgraft": 10,
    "graft_vs_floor_max": 2.0,
}


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _equal_to_fresh(shas: list[str], fresh_shas: list[str]) -> bool | None:
    """True when every run's logits SHA-256 equals every fresh run's; None when nothing was compared."""
    if not shas or not fresh_shas:
        return None
    return len(set(shas) | set(fresh_shas)) == 1


def _tokens_sha(tokens) -> str:
    return tokens_sha256(tokens)


def prefix_methods(
    engine: Engine, lib: Library, n: int, runs: int, say: Callable[[str], None], plain: Library | None = None
) -> tuple[list[dict], dict]:
    """fresh, kvgraft and the floor for one prefix length (the peers run later: their 0.5 GB pickles
    churn the page cache and memory bandwidth, which would tax whatever runs right after them).
    With `plain`, a second library holding the same blob without compaction: its size and graft
    time are measured beside the compact one's."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    model = engine.model
    service = LibraryService(engine, lib)
    prefix = prefix_tokens(model, n, seed=n)
    question = model.tokenize(QUESTION, add_bos=False)[:16]
    prompt = prefix + question
    fp = engine.fingerprint
    out, extra = (
        [],
        {
            "prefix_tokens": n,
            "prefix_tokens_sha256": _tokens_sha(prefix),
            "question_tokens_sha256": _tokens_sha(question),
        },
    )
    with engine.session() as s:
        say(f"{n} tokens: storing the prefix")
        s.prefill(prefix)
        snap = s.snapshot()
        entry, _ = lib.add_entry(
            kind="prefix",
            text=model.detokenize(prefix),
            tokens=prefix,
            blob=snap.data,
            fingerprint=fp,
            elided=snap.elided,
        )
        stored = lib.blobs.stored_size(entry.blob_sha256)
        extra.update(
            blob_sha256=entry.blob_sha256,
            blob_bytes=entry.blob_size,
            stored_bytes=stored,
            bytes_per_token_uncompacted=entry.blob_size / n,
            bytes_per_token_compacted=stored / n,
        )
        if plain is not None:
            plain_entry, _ = plain.add_entry(
                kind="prefix", text=model.detokenize(prefix), tokens=prefix, blob=snap.data, fingerprint=fp
            )

        say(f"{n} tokens: fresh x{runs}")
        ttft, pre, fresh_shas = [], [], []
        for _ in range(runs):
            s.reset()
            t0 = time.perf_counter()
            s.prefill(prefix)
            t1 = time.perf_counter()
            s.prefill(question)
            fresh_shas.append(logits_sha256(s.logits()))
            ttft.append(time.perf_counter() - t0)
            pre.append(t1 - t0)
        # Fresh is the reference, so its own "exact" is run-to-run determinism: the same prompt in the
        # same decode schedule, SHA-256-equal logits every run. One run compares nothing.
        deterministic = len(set(fresh_shas)) == 1 if runs >= 2 else None
        out.append(
            {
                "method": "fresh",
                "prefix_tokens": n,
                "median_s": _median(ttft),
                "exact": deterministic,
                "deterministic": deterministic,
                "distinct_logits_sha256": len(set(fresh_shas)),
                "runs_s": ttft,
            }
        )
        extra.update(
            prefill_prefix_s=_median(pre), fresh_logits_sha256=fresh_shas[0], fresh_deterministic=deterministic
        )

        say(f"{n} tokens: kvgraft x{runs}")
        ttft, alone, lookup, shas = [], [], [], []
        for _ in range(runs):
            s.reset()
            t0 = time.perf_counter()
            hit = lib.longest_prefix(prompt, fp)
            t1 = time.perf_counter()
            service.graft(s, hit)
            t2 = time.perf_counter()
            s.prefill(prompt[hit.n_tokens :])
            shas.append(logits_sha256(s.logits()))
            ttft.append(time.perf_counter() - t0)
            alone.append(t2 - t1)
            lookup.append(t1 - t0)
        out.append(
            {
                "method": "kvgraft",
                "prefix_tokens": n,
                "median_s": _median(ttft),
                "exact": _equal_to_fresh(shas, fresh_shas),
                "runs_s": ttft,
                "graft_alone_s": _median(alone),
                "lookup_s": _median(lookup),
            }
        )
        extra.update(graft_alone_s=_median(alone), graft_logits_sha256=shas[-1])
        if plain is not None:
            say(f"{n} tokens: graft without compaction x{runs}")
            plain_service, times, plain_shas = LibraryService(engine, plain), [], []
            for _ in range(runs):
                s.reset()
                t1 = time.perf_counter()
                plain_service.graft(s, plain_entry)
                times.append(time.perf_counter() - t1)
                s.prefill(question)
                plain_shas.append(logits_sha256(s.logits()))
            extra.update(
                graft_alone_uncompacted_s=_median(times), uncompacted_exact=_equal_to_fresh(plain_shas, fresh_shas)
            )

    say(f"{n} tokens: floor (page-cache read of the uncompacted blob + one memcpy) x{runs}")
    path = (plain or lib).blobs.path(entry.blob_sha256)
    size = path.stat().st_size
    src, dst = bytearray(size), bytearray(size)  # allocated (and touched) once, like the graft's buffer
    floor = []
    for _ in range(runs):
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as fh:
            got = fh.readinto(src)
        dst[:] = src
        floor.append(time.perf_counter() - t0)
        assert got == size
    del src, dst
    out.append({"method": "floor", "prefix_tokens": n, "median_s": _median(floor), "exact": None, "runs_s": floor})
    extra["floor_s"] = _median(floor)
    return out, extra


def peer_methods(
    engine: Engine, peer: LlamaCppPythonPeer, n: int, peer_runs: int, say: Callable[[str], None]
) -> list[dict]:
    model = engine.model
    prefix = prefix_tokens(model, n, seed=n)
    question = model.tokenize(QUESTION, add_bos=False)[:16]
    prompt = prefix + question
    out = []
    say(f"{n} tokens: llama-cpp-python save_state/load_state x{peer_runs}")
    _, peer_fresh_sha = peer.fresh(prompt)
    state = peer.save_prefix(prefix)
    ttft, shas = [], set()
    for _ in range(peer_runs):
        t, sha = peer.state_ttft(state, question)
        ttft.append(t)
        shas.add(sha)
    out.append(
        {
            "method": "llama_cpp_python_state",
            "prefix_tokens": n,
            "median_s": _median(ttft),
            "exact": shas == {peer_fresh_sha},
            "runs_s": ttft,
        }
    )
    say(f"{n} tokens: llama-cpp-python LlamaDiskCache x{peer_runs}")
    ttft, shas = [], set()
    for _ in range(peer_runs):
        t, sha = peer.disk_cache_ttft(tuple(prefix), state, question)
        ttft.append(t)
        shas.add(sha)
    out.append(
        {
            "method": "llama_cpp_python_disk_cache",
            "prefix_tokens": n,
            "median_s": _median(ttft),
            "exact": shas == {peer_fresh_sha},
            "runs_s": ttft,
        }
    )
    del state
    return out


def decode_economy(engine: Engine, lib: Library, n: int, say) -> dict:
    service = LibraryService(engine, lib)
    problems = sorted(starter_problems(24), key=lambda p: len(p.solution))[:n]
    rows = []
    for p in problems:
        say(f"decode economy: {p.id}")
        service.deposit_solution(p.question, p.solution, p.answer, vouched_by=GENERATOR)
        fresh = ask(service, p.question, budget=96, use_library=False)
        graft = ask(service, p.question, retrieve=False)
        rows.append(
            {
                "id": p.id,
                "fresh_tokens": fresh.tokens_decoded,
                "fresh_s": fresh.wall_ms / 1e3,
                "fresh_ok": get_checker("final_number")(fresh.answer, p.answer),
                "graft_tokens": graft.tokens_decoded,
                "graft_s": graft.wall_ms / 1e3,
                "graft_ok": bool(graft.answer_checked),
                "exact": graft.exact,
            }
        )
    ft, gt = sum(r["fresh_tokens"] for r in rows), sum(r["graft_tokens"] for r in rows)
    fs, gs = sum(r["fresh_s"] for r in rows), sum(r["graft_s"] for r in rows)
    return {
        "problems": len(rows),
        "fresh_decode_tokens": ft,
        "graft_decode_tokens": gt,
        "token_ratio": ft / max(1, gt),
        "fresh_s": fs,
        "graft_s": gs,
        "time_ratio": fs / max(1e-9, gs),
        "fresh_correct": sum(r["fresh_ok"] for r in rows),
        "graft_correct": sum(r["graft_ok"] for r in rows),
        "exact_grafts": sum(r["exact"] is True for r in rows),
        "rows": rows,
    }


def ratios(results: list[dict], extras: list[dict]) -> dict:
    by = {(r["method"], r["prefix_tokens"]): r for r in results}
    out = {}
    for x in extras:
        n = x["prefix_tokens"]
        k = by[("kvgraft", n)]
        out[str(n)] = {
            "graft_vs_prefill": x["prefill_prefix_s"] / x["graft_alone_s"],
            "ttft_fresh_vs_kvgraft": by[("fresh", n)]["median_s"] / k["median_s"],
            "peer_state_vs_kvgraft": by[("llama_cpp_python_state", n)]["median_s"] / k["median_s"],
            "peer_disk_cache_vs_kvgraft": by[("llama_cpp_python_disk_cache", n)]["median_s"] / k["median_s"],
            "graft_vs_floor": x["graft_alone_s"] / x["floor_s"],
        }
    return out


def run_bench(engine: Engine, quick: bool, say: Callable[[str], None] = lambda m: None) -> dict:
    lengths = [512, 1024, 2048] if quick else [512, 1024, 2048, 4096]
    runs, peer_runs = (5, 2) if quick else (7, 3)
    if engine.config.n_ctx < max(lengths) + 64:
        raise ValueError(f"the benchmark needs n_ctx >= {max(lengths) + 64}")
    t0 = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="kvgraft-bench-") as tmp,
        Library(Path(tmp) / "lib") as lib,
        Library(Path(tmp) / "plain") as plain,
    ):
        results, extras = [], []
        for n in lengths:
            r, x = prefix_methods(engine, lib, n, runs, say, plain=plain)
            results += r
            extras.append(x)
        say("loading llama-cpp-python's Llama for the peer methods")
        peer = LlamaCppPythonPeer(engine.config)
        try:
            for n in lengths:
                results += peer_methods(engine, peer, n, peer_runs, say)
        finally:
            peer.close()
        recurring_rows = [recurring(engine, lib, n, runs, say) for n in lengths]
        economy = decode_economy(engine, lib, 4 if quick else 8, say)
    say("library scale: lookup latency")
    scale = lookup_scale([1000, 10000] if quick else [1000, 10000, 100000])
    kv = kv_types(engine, say)
    out = {
        "kind": "kvgraft-bench",
        "kvgraft_version": __version__,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "fingerprint": engine.fingerprint,
        "fingerprint_info": engine.fingerprint_info,
        "environment": engine.environment,
        "n_ctx": engine.config.n_ctx,
        "results": results,
        "prefixes": extras,
        "ratios": ratios(results, extras),
        "targets": TARGETS,
        "kvgraft_recurring": recurring_rows,
        "decode_economy": economy,
        "library_scale": scale,
        "kv_types": kv,
        "seconds": time.perf_counter() - t0,
    }
    out["outputs_sha256"] = hashlib.sha256(
        json.dumps([(x["blob_sha256"], x["fresh_logits_sha256"], x["graft_logits_sha256"]) for x in extras]).encode()
    ).hexdigest()
    return out
