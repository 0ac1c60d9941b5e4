#!/usr/bin/env python3
"""Widen the library: fill it with distinct long documents and measure it as it grows.

Resumable and safe to kill: every document is one transactional deposit, and a rerun continues
from the documents already stored. Runs in the background across sessions:

    nohup .venv/bin/python scripts/widen.py --home ~/.cache/kvgraft-widen --target-tokens 327680 &
    .venv/bin/python scripts/widen.py --home ~/.cache/kvgraft-widen --baseline   # 100-entry library
    .venv/bin/python scripts/widen.py --home ~/.cache/kvgraft-widen --summary    # table + extrapolation

With --qa the library is filled instead with invented documents, each holding one fact about made-up
names (scripts/qa_sets.py's easy set, one seeded draw per document, so a rerun continues), and at
each of --qa-at library sizes (and at the end) it asks the question of --ask random stored documents
and --ask/3 questions about absent names, through `kvgraft ask`'s own path (retrieval, graft, answer).
One JSON line per checkpoint (`"event": "qa"`: hit rate, accuracy, false retrievals, ms per answer,
tokens, multiple of n_ctx); --summary prints them as a table by library size:

    nohup .venv/bin/python scripts/widen.py --qa --home ~/.cache/kvgraft-widen-qa --target-tokens 819200 &
    .venv/bin/python scripts/widen.py --qa --compare --home ~/.cache/kvgraft-widen-qa   # side by side
    .venv/bin/python scripts/widen.py --qa --home ~/.cache/kvgraft-widen-qa --summary

--qa --compare deposits the first --compare-docs documents again into a small library of their own
(<home>/small-qa) and asks their questions of it and of the wide library, alternating which goes
first, so the accuracy and time per answer of the two are measured side by side in one run.

Each measurement (every --measure-every documents, and at the end) records the blob disk used
(bytes of the files, and blocks allocated), bytes per stored token (on disk and uncompacted), and
the lookup + graft latency of random entries: look the entry up by its tokens followed by a probe
(longest stored prefix), read its blob with the integrity check, graft it into a reused context,
prefill the probe and compare the logits' SHA-256 with the fresh one in the entry's receipt. One
JSON line per measurement goes to <home>/widen.jsonl.

--baseline builds a library of 100 entries in <home>/small: the first 10 long documents, moved in
with `kvgraft export`/`import` (format 2 packs, no prefill), and 90 short notes. The same latency
is measured there, on the long documents, so the comparison holds the blob size fixed and varies
only the library's size; and on the wide library, for the same 10 documents and for random ones.
Each is measured with the page cache warm and with each blob dropped from it before its graft
(posix_fadvise), i.e. read from disk.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvgraft.app.core.runtime import Settings, open_engine  # noqa: E402
from kvgraft.app.core.textgen import synthetic_text  # noqa: E402
from kvgraft.app.packs.export import export_pack  # noqa: E402
from kvgraft.app.packs.imports import import_pack  # noqa: E402
from kvgraft.app.proof.prompts import DOCUMENT_PROBE  # noqa: E402
from kvgraft.app.service import LibraryService  # noqa: E402
from kvgraft.engine.compare import logits_sha256  # noqa: E402
from kvgraft.library.library import Library  # noqa: E402
from scripts.widen_qa import qa_compare, qa_fill, qa_summary  # noqa: E402

MIN_DOC, MAX_DOC = 6000, 8000
N_CTX = 8192
TARGET_100X = 100 * 32768


def doc_text(model, i: int) -> str:
    """Document i: distinct synthetic text of MIN_DOC..MAX_DOC tokens (its length drawn from i)."""
    want = random.Random(i).randint(MIN_DOC, MAX_DOC)
    words = int(want / 1.25)
    while True:
        text = f"Document {i}.\n" + synthetic_text(words, seed=1_000_000 + i)
        n = len(model.tokenize(text))
        if n >= want or n >= MAX_DOC:
            break
        words = int(words * want / n) + 8
    while n > MAX_DOC:  # trim words until it fits the context with room for a question
        words -= max(1, (n - MAX_DOC) // 2)
        text = f"Document {i}.\n" + synthetic_text(words, seed=1_000_000 + i)
        n = len(model.tokenize(text))
    return text


def blob_disk(lib: Library) -> tuple[int, int]:
    """(bytes of the blob files, bytes of blocks allocated for them)."""
    size = blocks = 0
    for sha in lib.blobs.iter_shas():
        st = lib.blobs.path(sha).stat()
        size += st.st_size
        blocks += st.st_blocks * 512
    return size, blocks


def evict(lib: Library, sha: str) -> None:
    """Drop one blob file's pages from the page cache (posix_fadvise; no root needed)."""
    fd = os.open(lib.blobs.path(sha), os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure_latency(service: LibraryService, entries, samples: int, seed: int, cold: bool = False) -> dict:
    """Lookup + graft latency of `samples` random entries (each checked exact against its receipt).
    With `cold`, each entry's blob is dropped from the page cache before its graft."""
    engine, lib = service.engine, service.library
    probe = engine.model.tokenize(DOCUMENT_PROBE, add_bos=False)
    rng = random.Random(seed)
    picks = [rng.choice(entries) for _ in range(samples)]
    rows = []
    with engine.session() as s:
        for e in picks:
            s.reset()
            if cold:
                evict(lib, e.blob_sha256)
            t0 = time.perf_counter()
            hit = lib.longest_prefix(list(e.tokens) + probe, engine.fingerprint)
            t1 = time.perf_counter()
            g = service.graft(s, hit)
            t2 = time.perf_counter()
            s.prefill(probe)
            exact = (hit.receipt or {}).get("fresh_logits_sha256") == logits_sha256(s.logits())
            rows.append(
                {
                    "entry": e.id,
                    "hit": hit.id,
                    "tokens": e.n_tokens,
                    "lookup_ms": (t1 - t0) * 1e3,
                    "graft_ms": (t2 - t1) * 1e3,
                    "read_validate_ms": g.validate_ms,
                    "restore_ms": g.restore_ms,
                    "exact": exact and hit.id == e.id,
                }
            )

    def med(key):
        return statistics.median(r[key] for r in rows)

    return {
        "samples": len(rows),
        "lookup_ms": med("lookup_ms"),
        "graft_ms": med("graft_ms"),
        "lookup_graft_ms": statistics.median(r["lookup_ms"] + r["graft_ms"] for r in rows),
        "graft_ms_per_1k_tokens": statistics.median(r["graft_ms"] / r["tokens"] * 1e3 for r in rows),
        "all_exact": all(r["exact"] for r in rows),
        "rows": rows,
    }


def snapshot_row(
    lib: Library,
    service: LibraryService,
    samples: int,
    seed: int,
    docs_only: bool = True,
    entry_ids: list[int] | None = None,
    cold: bool = False,
) -> dict:
    st = lib.stats()
    size, blocks = blob_disk(lib)
    docs = [e for e in lib.entries() if (e.title or "").startswith("widen doc") or not docs_only]
    if entry_ids is not None:
        docs = [e for e in docs if e.id in set(entry_ids)]
    lat = measure_latency(service, docs, samples, seed, cold=cold)
    return {
        "entries": st["entries"],
        "blob_tokens": st["blob_tokens"],
        "blob_bytes": size,
        "blob_blocks_bytes": blocks,
        "bytes_per_token": size / st["blob_tokens"],
        "canonical_bytes_per_token": st["canonical_bytes_per_token"],
        "latency": lat,
    }


def fill(args, service: LibraryService, log) -> None:
    lib = service.library
    done = {e.title for e in lib.entries() if (e.title or "").startswith("widen doc")}
    i = len(done)
    while True:
        st = lib.stats()
        if st["blob_tokens"] >= args.target_tokens:
            break
        title = f"widen doc {i:05d}"
        if title not in done:
            text = doc_text(service.engine.model, i)
            res = service.deposit(text, kind="document", title=title)
            log(
                {
                    "event": "deposit",
                    "doc": i,
                    "tokens": res.entry.n_tokens,
                    "prefill_s": round(res.prefill_s, 2),
                    "stored_bytes": lib.blobs.stored_size(res.entry.blob_sha256),
                    "canonical_bytes": res.entry.blob_size,
                    "receipt_equal": (res.entry.receipt or {}).get("equal"),
                }
            )
            if (i + 1) % args.measure_every == 0:
                log({"event": "measure", **snapshot_row(lib, service, args.samples, seed=i)})
        i += 1
    log({"event": "measure", "final": True, **snapshot_row(lib, service, args.samples, seed=12345)})


def baseline(args, service: LibraryService, home: Path, log) -> None:
    """The 100-entry library: the first 10 long documents (moved by pack) and 90 short notes."""
    wide = service.library
    first = sorted((e for e in wide.entries() if (e.title or "").startswith("widen doc")), key=lambda e: e.title)[:10]
    if len(first) < 10:
        raise SystemExit("the wide library holds fewer than 10 documents: run the fill first")
    small_home = home / "small"
    small = Library(small_home)
    small_service = LibraryService(service.engine, small)
    if small.count() < 10:
        pack = home / "first10.kvpack"
        export_pack(wide, first, pack)
        log({"event": "baseline_import", **import_pack(small_service, pack).as_dict()})
    n = small.count()
    for k in range(n - 10, 90):
        small_service.deposit(
            f"Note {k}.\n" + synthetic_text(450, seed=2_000_000 + k), kind="document", title=f"note {k:03d}"
        )
    long_ids = [e.id for e in small.entries() if (e.title or "").startswith("widen doc")]
    out = {"event": "baseline"}
    for cold in (False, True):  # warm page cache, then each blob dropped from it before its graft
        key = "cold" if cold else "warm"
        out[key] = {
            "small": snapshot_row(small, small_service, args.samples, seed=777, entry_ids=long_ids, cold=cold),
            "wide_same_documents": snapshot_row(
                wide, service, args.samples, seed=777, entry_ids=[e.id for e in first], cold=cold
            ),
            "wide_random": snapshot_row(wide, service, args.samples, seed=778, cold=cold),
        }
    (home / "baseline.json").write_text(json.dumps(out, indent=1))
    log(out)
    small.close()


def summary(home: Path) -> None:
    rows = [json.loads(x) for x in (home / "widen.jsonl").read_text().splitlines() if x.strip()]
    deposits = [r for r in rows if r["event"] == "deposit"]
    measures = [r for r in rows if r["event"] == "measure"]
    base = json.loads((home / "baseline.json").read_text()) if (home / "baseline.json").exists() else None
    print(
        "| entries | tokens | blob disk | bytes/token on disk | uncompacted bytes/token | lookup + graft (median) "
        "| graft per 1K tokens | exact |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in measures:
        lat = m["latency"]
        print(
            f"| {m['entries']:,} | {m['blob_tokens']:,} | {m['blob_bytes'] / 1e9:.2f} GB | "
            f"{m['bytes_per_token']:,.0f} | "
            f"{m['canonical_bytes_per_token']:,.0f} | {lat['lookup_graft_ms']:.1f} ms | "
            f"{lat['graft_ms_per_1k_tokens']:.2f} ms | "
            f"{'yes' if lat['all_exact'] else 'NO'} |"
        )
    if base:
        print(
            "\nThe 100-entry library (10 of the same documents + 90 short notes) against the wide one, "
            "lookup + graft, median of 20:"
        )
        for key, label in (("warm", "page cache warm"), ("cold", "each blob dropped from the page cache first")):
            s, w, r = (base[key][k]["latency"] for k in ("small", "wide_same_documents", "wide_random"))
            print(
                f"  {label}: small {s['lookup_graft_ms']:.1f} ms; wide, same 10 documents "
                f"{w['lookup_graft_ms']:.1f} ms "
                f"({w['lookup_graft_ms'] / s['lookup_graft_ms']:.2f}x); wide, random documents "
                f"{r['lookup_graft_ms']:.1f} ms, "
                f"{r['graft_ms_per_1k_tokens'] / s['graft_ms_per_1k_tokens']:.2f}x per 1K tokens; all exact: "
                f"{'yes' if s['all_exact'] and w['all_exact'] and r['all_exact'] else 'NO'}"
            )
    if deposits and measures:
        m = measures[-1]
        tok = sum(d["tokens"] for d in deposits)
        pre = sum(d["prefill_s"] for d in deposits)
        print(
            f"\nMeasured: {len(deposits)} documents deposited in this log, {tok:,} tokens, prefill {pre / 60:.1f} min "
            f"({pre / tok * 1e3:.2f} ms/token)."
        )
        print(
            f"EXTRAPOLATED (not measured) to 100 x 32,768 = {TARGET_100X:,} tokens from the measured per-token costs: "
            f"blob disk {m['bytes_per_token'] * TARGET_100X / 1e9:.1f} GB compacted vs "
            f"{m['canonical_bytes_per_token'] * TARGET_100X / 1e9:.1f} GB uncompacted; "
            f"prefill {pre / tok * TARGET_100X / 3600:.1f} h on this machine."
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, default=Path.home() / ".cache" / "kvgraft-widen")
    ap.add_argument("--target-tokens", type=int, default=10 * 32768)
    ap.add_argument("--measure-every", type=int, default=10, help="documents between measurements")
    ap.add_argument("--samples", type=int, default=20, help="random grafts per measurement")
    ap.add_argument("--baseline", action="store_true", help="build and measure the 100-entry library")
    ap.add_argument("--summary", action="store_true", help="print the table and the extrapolation")
    ap.add_argument("--qa", action="store_true", help="fill with invented documents and ask questions of them")
    ap.add_argument("--seed", type=int, default=7, help="--qa: the documents' seed")
    ap.add_argument("--ask", type=int, default=60, help="--qa: questions per checkpoint")
    ap.add_argument("--compare", action="store_true", help="--qa: small and wide library side by side")
    ap.add_argument("--compare-docs", type=int, default=30, help="--qa --compare: documents in the small library")
    ap.add_argument(
        "--qa-at", type=int, nargs="+", default=[30, 100, 200, 300], help="--qa: library sizes (documents) to ask at"
    )
    args = ap.parse_args()
    home = args.home.expanduser()
    if args.summary:
        qa_summary(home) if args.qa else summary(home)
        return
    home.mkdir(parents=True, exist_ok=True)
    os.environ["KVGRAFT_HOME"] = str(home / "wide")  # packs' trust store etc. live in the wide library
    logf = open(home / "widen.jsonl", "a")  # noqa: SIM115 (open for the whole run, closed at exit)

    def log(obj: dict) -> None:
        obj = {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), **obj}
        logf.write(json.dumps(obj) + "\n")
        logf.flush()
        brief = {k: v for k, v in obj.items() if k not in ("latency", "warm", "cold", "rows")}
        print(json.dumps(brief), flush=True)

    engine = open_engine(Settings(n_ctx=N_CTX))
    lib = Library(home / "wide")
    service = LibraryService(engine, lib)
    try:
        if args.qa and args.compare:
            qa_compare(args, service, home, log)
        elif args.qa:
            qa_fill(args, service, home, log)
        elif args.baseline:
            baseline(args, service, home, log)
        else:
            fill(args, service, log)
    finally:
        service.close()
        lib.close()
        engine.close()


if __name__ == "__main__":
    main()
