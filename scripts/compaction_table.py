#!/usr/bin/env python3
"""Blob bytes per token before and after compaction at 1K, 4K and 32K-token prefixes.

For each length: prefill a synthetic prefix fresh, snapshot it, store the canonical snapshot as a
compact blob in a temp library, and report llama.cpp's bytes per token against the stored file's
bytes per token. Then graft the blob from disk, prefill a probe, and check the logits are
SHA-256-equal to the fresh run's (so every row of the table is an exact graft).

    .venv/bin/python scripts/compaction_table.py [--lengths 1024 4096 32704] [--json out.json]

32,704 = 32,768 - 64: the model's trained context minus room for the probe.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvgraft.app.core.runtime import Settings, open_engine  # noqa: E402
from kvgraft.app.core.textgen import prefix_tokens  # noqa: E402
from kvgraft.app.service import LibraryService  # noqa: E402
from kvgraft.engine.compare import logits_sha256  # noqa: E402
from kvgraft.library.library import Library  # noqa: E402

PROBE = " Question: which word came up most often above? Answer:"


def row(engine, n: int, say) -> dict:
    eng = engine.with_config(engine.config.replace(n_ctx=max(8192, n + 64)))
    tokens = prefix_tokens(eng.model, n, seed=n)
    probe = eng.model.tokenize(PROBE, add_bos=False)
    with eng.session() as s:
        t0 = time.perf_counter()
        s.prefill(tokens, on_progress=lambda d, t: say(f"{n}: prefill {d:,}/{t:,}") if d % 8192 == 0 else None)
        prefill_s = time.perf_counter() - t0
        raw_bytes = len(s.state_bytes())
        snap = s.snapshot()
        s.prefill(probe)
        fresh = logits_sha256(s.logits())
    with tempfile.TemporaryDirectory(prefix="kvgraft-compaction-") as tmp, Library(Path(tmp)) as lib:
        entry, _ = lib.add_entry(
            kind="prefix",
            text=f"prefix {n}",
            tokens=tokens,
            blob=snap.data,
            blob_sha256=snap.sha256,
            fingerprint=eng.fingerprint,
            elided=snap.elided,
        )
        stored = lib.blobs.stored_size(entry.blob_sha256)
        service = LibraryService(eng, lib)
        with eng.session() as g:
            t0 = time.perf_counter()
            service.graft(g, entry)
            graft_s = time.perf_counter() - t0
            g.prefill(probe)
            exact = logits_sha256(g.logits()) == fresh
    del snap
    return {
        "prefix_tokens": n,
        "uncompacted_bytes": raw_bytes,
        "stored_bytes": stored,
        "bytes_per_token_before": raw_bytes / n,
        "bytes_per_token_after": stored / n,
        "stored_fraction": stored / raw_bytes,
        "prefill_s": prefill_s,
        "graft_s": graft_s,
        "exact": exact,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 32704])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    engine = open_engine(Settings())
    rows = []
    try:
        for n in args.lengths:
            r = row(engine, n, lambda m: print(m, file=sys.stderr, flush=True))
            print(json.dumps(r), file=sys.stderr, flush=True)
            rows.append(r)
    finally:
        engine.close()
    print("| prefix | bytes/token before | bytes/token after | stored | graft from disk | exact |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['prefix_tokens']:,} tokens | {r['bytes_per_token_before']:,.0f} | "
            f"{r['bytes_per_token_after']:,.0f} | "
            f"{r['stored_fraction']:.0%} | {r['graft_s'] * 1e3:,.0f} ms | {'yes' if r['exact'] else 'NO'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
