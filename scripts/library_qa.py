#!/usr/bin/env python3
"""Questions answered from the whole library: a held-out evaluation of retrieval and answers.

    .venv/bin/python scripts/library_qa.py [--docs 30] [--seed 1] [--home DIR] [--json]

Builds N invented documents (a fact about made-up names inside 1,000 to 2,500 words of filler, so
the model cannot know it), writes each to a .txt file and deposits the files as `kvgraft deposit
FILE...` does (app/ingest/documents.py), and asks one question per document plus N/3 questions
about names that are in no document. It reports: retrieval hit rate (the right document first and
above the threshold), accuracy from the library (`kvgraft ask`), accuracy fresh (no library), the
ceiling (the right document given with --context), false retrievals on the absent questions, the
time per answer, and the library's size as a multiple of n_ctx. It prints the coverage of right hits
and of absent questions, to tune RETRIEVAL_MIN_COVERAGE (app/ask.py): tune with one seed (the default
tuning seed is 101), report with another (the README uses seed 1). An answer counts as correct when
it contains the fact's key (a surname, a year, a river's name), case-insensitive.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvgraft.app.answer.ask import RETRIEVAL_MIN_COVERAGE, ask  # noqa: E402
from kvgraft.app.core.runtime import Settings, open_engine  # noqa: E402
from kvgraft.app.core.textgen import synthetic_text  # noqa: E402
from kvgraft.app.ingest.documents import deposit_file  # noqa: E402
from kvgraft.app.service import LibraryService, open_library  # noqa: E402

SYLLABLES = "dor mar vel qu ist an bel tor ren sal mi ka lo thu ven gri os pa zel run fe ad ko lys".split()
ROLES = ["lighthouse keeper", "harbor master", "head brewer", "chief archivist", "bridge warden", "clockmaker"]
BUDGET = 16


def name(rng: random.Random, parts: int = 2) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def make_doc(rng: random.Random, i: int) -> dict:
    place = name(rng, 3)
    kind = i % 3
    if kind == 0:
        role, person = rng.choice(ROLES), f"{name(rng)} {name(rng, 3)}"
        fact = f"The {role} of {place} is {person}."
        question, key = f"Who is the {role} of {place}?", person.split()[-1]
    elif kind == 1:
        year = str(rng.randint(1200, 1899))
        fact = f"The town of {place} was founded in the year {year}."
        question, key = f"In what year was {place} founded?", year
    else:
        river = name(rng, 3)
        fact = f"The river that runs through {place} is called the {river}."
        question, key = f"What is the river that runs through {place} called?", river
    words = rng.randint(1000, 2500)
    paras = [synthetic_text(120, rng.randrange(1 << 30)) for _ in range(max(2, words // 120))]
    paras.insert(rng.randrange(len(paras) + 1), fact)
    title = f"Survey notes on {place}"
    return {"title": title, "text": f"{title}\n\n" + "\n\n".join(paras), "question": question, "key": key}


def absent_question(rng: random.Random) -> str:
    return f"Who is the {rng.choice(ROLES)} of {name(rng, 3)}?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=101, help="101 tunes; report with another (the README: 1)")
    ap.add_argument("--home", type=Path, default=None, help="data dir (default: a temporary one)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    docs: list[dict] = []
    for i in range(args.docs):
        d = make_doc(rng, i)
        while any(x["title"] == d["title"] for x in docs):  # one document per place: a question names one
            d = make_doc(rng, i)
        docs.append(d)
    held = {d["title"].split()[-1].lower() for d in docs}  # a drawn name may be one a document holds
    absent = []
    while len(absent) < max(1, args.docs // 3):
        q = absent_question(rng)
        if q.rstrip("?").split()[-1].lower() not in held:
            absent.append(q)
    tmp = None if args.home else tempfile.TemporaryDirectory()
    home = args.home or Path(tmp.name)
    settings = Settings()
    engine = open_engine(settings, on_progress=lambda m: print(m, file=sys.stderr))
    rows, absent_rows = [], []
    try:
        with open_library(home) as lib, LibraryService(engine, lib) as service:
            t0 = time.perf_counter()
            files = home / "documents"
            files.mkdir(parents=True, exist_ok=True)
            for k, d in enumerate(docs):
                f = files / f"doc{k:03d}.txt"
                f.write_text(d["text"], encoding="utf-8")
                fd = deposit_file(service, f)
                d["entry_id"] = fd.entries[0].id
                d["title"] = fd.title
                print(f"deposit {k + 1}/{len(docs)}", file=sys.stderr, flush=True)
            deposit_s = time.perf_counter() - t0
            for k, d in enumerate(docs):
                lib_r = ask(service, d["question"], budget=BUDGET)
                fresh = ask(service, d["question"], budget=BUDGET, use_library=False)
                ceiling = ask(service, d["question"], budget=BUDGET, context=d["text"], use_library=True)
                key = d["key"].lower()
                rows.append(
                    {
                        "question": d["question"],
                        "key": d["key"],
                        "hit": lib_r.source == "retrieved" and lib_r.entry_id == d["entry_id"],
                        "score": lib_r.score,
                        "coverage": lib_r.coverage,
                        "library_ok": key in lib_r.answer.lower(),
                        "fresh_ok": key in fresh.answer.lower(),
                        "ceiling_ok": key in ceiling.answer.lower(),
                        "library_ms": lib_r.wall_ms,
                        "answer": lib_r.answer,
                    }
                )
                print(f"ask {k + 1}/{len(docs)}: {rows[-1]['hit']} {lib_r.answer!r}", file=sys.stderr, flush=True)
            for q in absent:
                r = ask(service, q, budget=BUDGET)
                absent_rows.append(
                    {"question": q, "retrieved": r.source == "retrieved", "score": r.score, "coverage": r.coverage}
                )
            size = lib.stats(n_ctx=engine.config.n_ctx)
    finally:
        engine.close()
        if tmp is not None:
            tmp.cleanup()
    n = len(rows)
    hit_scores = sorted(r["coverage"] for r in rows if r["hit"])
    absent_scores = sorted(r["coverage"] for r in absent_rows if r["coverage"] is not None)
    summary = {
        "seed": args.seed,
        "documents": n,
        "threshold": RETRIEVAL_MIN_COVERAGE,
        "retrieval_hit_rate": sum(r["hit"] for r in rows) / n,
        "accuracy_library": sum(r["library_ok"] for r in rows) / n,
        "accuracy_fresh": sum(r["fresh_ok"] for r in rows) / n,
        "accuracy_ceiling": sum(r["ceiling_ok"] for r in rows) / n,
        "false_retrievals": sum(r["retrieved"] for r in absent_rows),
        "absent_questions": len(absent_rows),
        "median_ms_per_answer": statistics.median(r["library_ms"] for r in rows),
        "document_tokens": size["tokens"],
        "context_multiple": round(size["context_multiple"], 2),
        "deposit_s": round(deposit_s, 1),
        "min_hit_coverage": hit_scores[0] if hit_scores else None,
        "max_absent_coverage": absent_scores[-1] if absent_scores else None,
    }
    if args.json:
        print(json.dumps({"summary": summary, "questions": rows, "absent": absent_rows}, indent=1))
    else:
        s = summary
        print(
            f"{n} documents, {s['document_tokens']:,} tokens ({s['context_multiple']}x n_ctx), seed {s['seed']}, "
            f"threshold {s['threshold']}\n"
            f"retrieval hit rate {s['retrieval_hit_rate']:.0%}; accuracy: library {s['accuracy_library']:.0%}, "
            f"right document given {s['accuracy_ceiling']:.0%}, fresh {s['accuracy_fresh']:.0%}\n"
            f"false retrievals {s['false_retrievals']}/{s['absent_questions']} questions about absent names; "
            f"median {s['median_ms_per_answer']:.0f} ms per answer from the library\n"
            f"coverage: lowest right hit {s['min_hit_coverage']}, highest absent question {s['max_absent_coverage']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
