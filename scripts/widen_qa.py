"""Questions over the wide library: `scripts/widen.py --qa` (the fill, its checkpoints, --compare, --summary).

The fill deposits invented documents (scripts/qa_sets.py's easy set, one seeded draw per
document, one document per place name) and, at each checkpoint size, asks the questions of random
stored documents and about absent names through `kvgraft ask`'s own path. `<home>/qa_docs.jsonl`
holds one line per stored document (its question, key, entry id); `<home>/widen.jsonl` the events.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from kvgraft.app.service import LibraryService
from kvgraft.library.library import Library
from scripts.library_qa import BUDGET as QA_BUDGET
from scripts.qa_sets import absent_question
from scripts.qa_sets import easy_doc as make_doc


def qa_doc(seed: int, i: int, attempt: int = 0) -> dict:
    """Invented document i of the QA fill: its own seeded draw, so any prefix of the run is reproducible
    (`attempt` > 0: drawn again because its place's name was taken by an earlier document)."""
    return make_doc(random.Random(f"widen-qa:{seed}:{i}" + (f":{attempt}" if attempt else "")), i)


def _place(title: str) -> str:
    return title.split()[-1].lower()  # "Survey notes on <place>"


def qa_ask(service: LibraryService, stored: list[dict], n_ask: int, seed: int) -> dict:
    """Ask the questions of `n_ask` random stored documents, and n_ask/3 about absent names."""
    from kvgraft.app.answer.ask import ask

    rng = random.Random(seed)
    # a question is about one document: documents whose place shares its name with another's (drawn before
    # the fill made names unique) are left out, their question being ambiguous
    places: dict[str, int] = {}
    for d in stored:
        places[d["place"]] = places.get(d["place"], 0) + 1
    unique = [d for d in stored if places[d["place"]] == 1]
    picks = rng.sample(unique, min(n_ask, len(unique)))
    rows = []
    for d in picks:
        r = ask(service, d["question"], budget=QA_BUDGET)
        rows.append(
            {
                "doc": d["doc"],
                "hit": r.source == "retrieved" and r.entry_id == d["entry_id"],
                "ok": d["key"].lower() in r.answer.lower(),
                "ms": r.wall_ms,
                "ttft_ms": r.ttft_ms,
                "coverage": r.coverage,
                "answer": r.answer,
            }
        )
    # questions about names no stored document holds: with hundreds of documents a drawn name can be one
    # the library holds (3 syllables of 25: 15,625 names), so those are drawn again
    held = set(places) | {w.lower() for e in service.library.entries(kind="document") for w in (e.title or "").split()}
    absent_qs = []
    while len(absent_qs) < max(1, n_ask // 3):
        q = absent_question(rng)
        if q.rstrip("?").split()[-1].lower() not in held:
            absent_qs.append(q)
    absent = [ask(service, q, budget=QA_BUDGET) for q in absent_qs]
    st = service.library.stats(n_ctx=service.engine.config.n_ctx)
    n = len(rows)
    return {
        "documents": len(stored),
        "tokens": st["tokens"],
        "context_multiple": round(st["context_multiple"], 2),
        "questions": n,
        "ambiguous_left_out": len(stored) - len(unique),
        "hit_rate": sum(r["hit"] for r in rows) / n,
        "accuracy": sum(r["ok"] for r in rows) / n,
        "false_retrievals": sum(a.source == "retrieved" for a in absent),
        "absent_questions": len(absent),
        "absent": [
            {"question": q, "retrieved": a.entry_id if a.source == "retrieved" else None, "coverage": a.coverage}
            for q, a in zip(absent_qs, absent, strict=True)
        ],
        "median_ms": statistics.median(r["ms"] for r in rows),
        "median_ttft_ms": statistics.median([r["ttft_ms"] for r in rows if r["ttft_ms"] is not None] or [0.0]),
        "rows": rows,
    }


def qa_fill(args, service: LibraryService, home: Path, log) -> None:
    lib = service.library
    book = home / "qa_docs.jsonl"  # one line per stored document: its question, key and entry id
    stored = _book(book, args.seed)
    asked = {r["documents"] for r in _events(home, "qa")}
    checkpoints = sorted(set(args.qa_at))
    with open(book, "a") as out:
        i = len(stored)
        while lib.stats()["tokens"] < args.target_tokens:
            taken = {x["place"] for x in stored}
            attempt = 0
            d = qa_doc(args.seed, i)
            while _place(d["title"]) in taken:  # one document per place: a question names one
                attempt += 1
                d = qa_doc(args.seed, i, attempt)
            res = service.deposit(d["text"], kind="document", title=d["title"])
            rec = {
                "doc": i,
                "attempt": attempt,
                "place": _place(d["title"]),
                "entry_id": res.entry.id,
                "question": d["question"],
                "key": d["key"],
            }
            out.write(json.dumps(rec) + "\n")
            out.flush()
            stored.append(rec)
            log({"event": "deposit", "doc": i, "tokens": res.entry.n_tokens, "prefill_s": round(res.prefill_s, 2)})
            i += 1
            if len(stored) in checkpoints and len(stored) not in asked:
                log({"event": "qa", **qa_ask(service, stored, args.ask, seed=len(stored))})
    if len(stored) not in asked:
        log({"event": "qa", "final": True, **qa_ask(service, stored, args.ask, seed=len(stored))})


def qa_compare(args, service: LibraryService, home: Path, log) -> None:
    """The first documents' questions, asked of a library of just those documents and of the wide one."""
    from kvgraft.app.answer.ask import ask

    stored = _book(home / "qa_docs.jsonl", args.seed)
    first = [d for d in stored if sum(x["place"] == d["place"] for x in stored) == 1][: args.compare_docs]
    if len(first) < args.compare_docs:
        raise SystemExit(f"the wide library holds {len(stored)} question documents: run the --qa fill first")
    small = Library(home / "small-qa")
    small_service = LibraryService(service.engine, small)
    try:
        ids = {}
        for d in first:
            doc = qa_doc(args.seed, d["doc"], d["attempt"])
            ids[d["doc"]] = small_service.deposit(doc["text"], kind="document", title=doc["title"]).entry.id
        sides = {"small": [], "wide": []}
        for k, d in enumerate(first):
            order = [("small", small_service), ("wide", service)]
            for side, svc in order if k % 2 == 0 else order[::-1]:  # which goes first alternates
                r = ask(svc, d["question"], budget=QA_BUDGET)
                want = ids[d["doc"]] if side == "small" else d["entry_id"]
                sides[side].append(
                    {
                        "hit": r.source == "retrieved" and r.entry_id == want,
                        "ok": d["key"].lower() in r.answer.lower(),
                        "ms": r.wall_ms,
                    }
                )
        out = {"event": "qa_compare", "questions": len(first)}
        for side, rows in sides.items():
            lib = small if side == "small" else service.library
            st = lib.stats(n_ctx=service.engine.config.n_ctx)
            out[side] = {
                "documents": len(first) if side == "small" else len(stored),
                "tokens": st["tokens"],
                "context_multiple": round(st["context_multiple"], 2),
                "hit_rate": sum(r["hit"] for r in rows) / len(rows),
                "accuracy": sum(r["ok"] for r in rows) / len(rows),
                "median_ms": statistics.median(r["ms"] for r in rows),
            }
        out["time_ratio"] = out["wide"]["median_ms"] / out["small"]["median_ms"]
        log(out)
    finally:
        small_service.close()
        small.close()


def _book(path: Path, seed: int) -> list[dict]:
    """The QA fill's stored documents (lines written before places were recorded get theirs here)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    for r in rows:
        r.setdefault("attempt", 0)
        r.setdefault("place", _place(qa_doc(seed, r["doc"], r["attempt"])["title"]))
    return rows


def _events(home: Path, kind: str) -> list[dict]:
    f = home / "widen.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []
    return [r for r in rows if r.get("event") == kind]


def qa_summary(home: Path) -> None:
    rows = _events(home, "qa")
    if not rows:
        raise SystemExit(f"no question checkpoints in {home / 'widen.jsonl'}: run with --qa first")
    print(
        "| documents | tokens | x n_ctx | questions | right document first | accuracy | false retrievals "
        "| median ms per answer | median ms to first token |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['documents']:,} | {r['tokens']:,} | {r['context_multiple']} | {r['questions']} | "
            f"{r['hit_rate']:.0%} | {r['accuracy']:.0%} | {r['false_retrievals']}/{r['absent_questions']} | "
            f"{r['median_ms']:.0f} | {r['median_ttft_ms']:.0f} |"
        )
    misses = [x for r in rows for x in r["rows"] if not x["ok"]]
    if misses:
        print(
            f"\nEach row asks other random documents. Of its {len(misses)} wrong answers, "
            f"{sum(x['hit'] for x in misses)} had the right document grafted (the model misread it); "
            "the same questions, asked of a small and of the wide library, are compared side by side below."
        )
    for c in _events(home, "qa_compare"):
        s_, w_ = c["small"], c["wide"]
        print(
            f"\nSide by side, the same {c['questions']} questions (of the first documents): a library of those "
            f"{s_['documents']} documents ({s_['context_multiple']}x n_ctx) right document first {s_['hit_rate']:.0%}, "
            f"accuracy {s_['accuracy']:.0%}, median {s_['median_ms']:.0f} ms per answer; the wide library of "
            f"{w_['documents']:,} ({w_['context_multiple']}x) {w_['hit_rate']:.0%}, {w_['accuracy']:.0%}, "
            f"{w_['median_ms']:.0f} ms: {c['time_ratio']:.2f}x the time."
        )
    deposits = _events(home, "deposit")
    if deposits:
        tok = sum(d["tokens"] for d in deposits)
        pre = sum(d["prefill_s"] for d in deposits)
        print(f"Deposited in this log: {len(deposits)} documents, {tok:,} tokens, prefill {pre / 60:.1f} min.")
        print(
            f"EXTRAPOLATED (not measured) to 100 x 32,768 = 3,276,800 tokens at the measured {pre / tok * 1e3:.2f} ms "
            f"per token: {pre / tok * 3_276_800 / 3600:.1f} h of prefill on this machine."
        )
