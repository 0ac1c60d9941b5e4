#!/usr/bin/env python3
"""Questions answered from the whole library: a held-out evaluation of retrieval and answers.

    .venv/bin/python scripts/library_qa.py [--set easy,paraphrase,neardup,pydoc] [--docs 30] [--seed 1] [--json]

For each set (scripts/qa_sets.py: questions in the documents' words, questions in other words about
documents that mention each other, near-duplicates told apart by the year asked, and real texts from
Python's own documentation), the documents are written to .txt files and deposited into a library of
their own as `kvgraft deposit FILE...` does. Each question is then asked by `kvgraft ask`'s own path
under both acceptance rules, side by side in one run: `words` (a document is grafted only when its
words cover the question: the rule before) and `reading` (the model's reading decides where words do
not: app/answer/reading.py). Also asked: fresh (no library) and with the right document given
(`--context`, the ceiling). Reported per set and rule: retrieval hit rate (the right document
grafted), accuracy from the library, false retrievals on questions about names no document holds,
and the median time per answer (where words decided, where the reading decided, and for the
absent questions). Tune with one seed (the default tuning seed is 101), report with another (the
README uses seed 1). An answer counts as correct when it contains the key, case-insensitive.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvgraft.app.answer.ask import RULES, ask  # noqa: E402
from kvgraft.app.answer.thresholds import READ_MIN_GAIN, READ_MIN_MARGIN, RETRIEVAL_MIN_COVERAGE  # noqa: E402
from kvgraft.app.core.runtime import Settings, open_engine  # noqa: E402
from kvgraft.app.ingest.documents import deposit_file  # noqa: E402
from kvgraft.app.service import LibraryService, open_library  # noqa: E402
from scripts.qa_sets import SETS  # noqa: E402

BUDGET = 16


def _med(xs) -> float | None:
    xs = list(xs)
    return round(statistics.median(xs)) if xs else None


def run_set(engine, set_name: str, seed: int, n: int, home: Path) -> dict:
    docs, absent = SETS[set_name](seed, n)
    rows, absent_rows = [], []
    with open_library(home) as lib, LibraryService(engine, lib) as service:
        files = home / "documents"
        files.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        for k, d in enumerate(docs):
            f = files / f"doc{k:03d}.txt"
            f.write_text(d["text"], encoding="utf-8")
            fd = deposit_file(service, f)
            d["entry_ids"] = [e.id for e in fd.entries]
            print(f"{set_name}: deposit {k + 1}/{len(docs)}", file=sys.stderr, flush=True)
        deposit_s = time.perf_counter() - t0
        for k, d in enumerate(docs):
            key = d["key"].lower()
            ranked = [x.entry.id for x in lib.rank_documents(d["question"], engine.fingerprint)]
            right = [i for i, x in enumerate(ranked) if x in d["entry_ids"]]
            row = {"question": d["question"], "key": d["key"], "bm25_rank": right[0] + 1 if right else None}
            for rule in RULES:
                r = ask(service, d["question"], budget=BUDGET, rule=rule)
                row[rule] = {
                    "hit": r.source == "retrieved" and r.entry_id in d["entry_ids"],
                    "source": r.source,
                    "by": ("reading" if r.gain is not None else "words") if r.source == "retrieved" else None,
                    "ok": key in r.answer.lower(),
                    "ms": r.wall_ms,
                    "coverage": r.coverage,
                    "gain": r.gain,
                    "next_gain": r.next_gain,
                    "why": r.not_grafted,
                    "candidates": r.runners_up,
                    "answer": r.answer,
                }
            row["fresh_ok"] = key in ask(service, d["question"], budget=BUDGET, use_library=False).answer.lower()
            row["ceiling_ok"] = key in ask(service, d["question"], budget=BUDGET, context=d["text"]).answer.lower()
            rows.append(row)
            print(
                f"{set_name}: ask {k + 1}/{len(docs)}: " + " ".join(f"{x}={row[x]['hit']}" for x in RULES),
                file=sys.stderr,
                flush=True,
            )
        for q in absent:
            row = {"question": q}
            for rule in RULES:
                r = ask(service, q, budget=BUDGET, rule=rule)
                row[rule] = {
                    "retrieved": r.source == "retrieved",
                    "ms": r.wall_ms,
                    "gain": r.gain,
                    "next_gain": r.next_gain,
                    "why": r.not_grafted,
                }
            absent_rows.append(row)
        tokens = lib.stats(n_ctx=engine.config.n_ctx)["tokens"]
    n_q = len(rows)
    summary = {
        "set": set_name,
        "documents": len(docs),
        "document_tokens": tokens,
        "absent_questions": len(absent_rows),
        "deposit_s": round(deposit_s, 1),
        "accuracy_ceiling": sum(r["ceiling_ok"] for r in rows) / n_q,
        "accuracy_fresh": sum(r["fresh_ok"] for r in rows) / n_q,
    }
    for rule in RULES:
        mine = [r[rule] for r in rows]
        summary[rule] = {
            "hit_rate": sum(m["hit"] for m in mine) / n_q,
            "accuracy_library": sum(m["ok"] for m in mine) / n_q,
            "false_retrievals": sum(a[rule]["retrieved"] for a in absent_rows),
            "median_ms": _med(m["ms"] for m in mine),
            "median_ms_words": _med(m["ms"] for m in mine if m["by"] == "words"),
            "median_ms_reading": _med(m["ms"] for m in mine if m["by"] == "reading"),
            "median_ms_absent": _med(a[rule]["ms"] for a in absent_rows),
            "decided_by_reading": sum(m["by"] == "reading" for m in mine),
        }
    return {"summary": summary, "questions": rows, "absent": absent_rows}


def _pct(x: float) -> str:
    return f"{x:.0%}"


def print_table(seed: int, results: list[dict]) -> None:
    print(
        f"seed {seed}; words: coverage >= {RETRIEVAL_MIN_COVERAGE}; reading: gain >= {READ_MIN_GAIN} nats/token, "
        f"lead >= {READ_MIN_MARGIN}"
    )
    print("set         rule     hit   library  ceiling  fresh  false  median ms (words / reading / absent)")
    for res in results:
        s = res["summary"]
        for rule in RULES:
            x = s[rule]
            parts = (x["median_ms_words"], x["median_ms_reading"], x["median_ms_absent"])
            ms = " / ".join("-" if v is None else str(v) for v in parts)
            print(
                f"{s['set']:<11} {rule:<8} {_pct(x['hit_rate']):>4} {_pct(x['accuracy_library']):>8} "
                f"{_pct(s['accuracy_ceiling']):>8} {_pct(s['accuracy_fresh']):>6} "
                f"{x['false_retrievals']:>2}/{s['absent_questions']:<3} {x['median_ms']:>5}  ({ms})"
            )
    for res in results:
        s = res["summary"]
        print(
            f"{s['set']}: {s['documents']} documents, {s['document_tokens']:,} tokens, deposited in {s['deposit_s']} s"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="easy,paraphrase,neardup,pydoc", help="comma-separated: " + ", ".join(SETS))
    ap.add_argument("--docs", type=int, default=30, help="documents per invented set (pydoc has 21)")
    ap.add_argument("--seed", type=int, default=101, help="101 tunes; report with another (the README: 1)")
    ap.add_argument("--json", type=Path, default=None, help="also write every answer and the summary here")
    args = ap.parse_args(argv)
    names = [x.strip() for x in args.set.split(",") if x.strip()]
    unknown = [x for x in names if x not in SETS]
    if unknown:
        ap.error(f"unknown set {', '.join(unknown)}: one of {', '.join(SETS)}")
    engine = open_engine(Settings(), on_progress=lambda m: print(m, file=sys.stderr))
    results = []
    try:
        for set_name in names:
            with tempfile.TemporaryDirectory() as tmp:
                results.append(run_set(engine, set_name, args.seed, args.docs, Path(tmp)))
    finally:
        engine.close()
    if args.json is not None:
        args.json.write_text(json.dumps({"seed": args.seed, "sets": results}, indent=1), encoding="utf-8")
    print_table(args.seed, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
