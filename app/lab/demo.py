"""`kvgraft demo`: the main job on the embedded model, with receipts.

1. The recurring case (the paper's 6,574x row in miniature): build a starter pack from bundled
   problems that are verified by construction (app/proof/problems.py), answer each problem fresh within
   a token budget, then from the library by graft; compare accuracy, decode tokens and wall time,
   and check every graft byte-exact against the fresh logits in its entry's receipt.
2. Prefill vs graft: deposit documents of about 1K, 2K and 3K tokens, time a fresh prefill against
   a graft from the library (read + SHA-256 check + validate + restore, median of 3), and check each
   graft against its receipt.
Everything lands in the data dir: the starter problems and pack, and a receipts file.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import Callable

from kvgraft.app.answer.ask import ask
from kvgraft.app.core.paths import data_dir
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.lab.starter_problems import GENERATOR, starter_problems
from kvgraft.app.packs.export import build_pack
from kvgraft.app.proof.checkers import get_checker
from kvgraft.app.proof.problems import write_jsonl
from kvgraft.app.proof.prompts import DOCUMENT_PROBE
from kvgraft.app.proof.receipt import Receipt
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.engine import Engine

N_PROBLEMS = 24
FRESH_BUDGET = 96
TIMING_WORDS = (760, 1520, 2280)  # about 1K, 2K and 3K tokens of synthetic text


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recurring_case(service: LibraryService, say: Callable[[str], None], budget: int = FRESH_BUDGET) -> dict:
    problems = starter_problems(N_PROBLEMS)
    out_dir = service.library.root / "starter"
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / "problems.jsonl"
    write_jsonl(problems, jsonl)
    say(
        f"building the starter pack: {len(problems)} verified problems (solutions stored once; already stored ones "
        "are skipped)"
    )
    t0 = time.perf_counter()
    pack = build_pack(
        service,
        jsonl,
        out_dir / "starter.kvpack",
        vouched_by=GENERATOR,
        progress=lambda st, d, n: say(f"  deposited {d}/{n}") if d % 6 == 0 or d == n else None,
    )
    build_s = time.perf_counter() - t0
    rows = []
    say(f"answering each problem fresh (budget {budget} decode tokens), then from the library by graft")
    for p in problems:
        fresh = ask(service, p.question, budget=budget, use_library=False)
        graft = ask(service, p.question, retrieve=False)
        rows.append(
            {
                "id": p.id,
                "reference": p.answer,
                "fresh_answer_sha256": _sha(fresh.answer.encode()),
                "fresh_ok": get_checker("final_number")(fresh.answer, p.answer),
                "fresh_decode_tokens": fresh.tokens_decoded,
                "fresh_prefill_tokens": fresh.tokens_prefilled,
                "fresh_s": fresh.wall_ms / 1e3,
                "graft_source": graft.source,
                "graft_entry": graft.entry_id,
                "graft_answer": graft.answer,
                "graft_ok": bool(graft.answer_checked) and graft.source == "graft",
                "graft_decode_tokens": graft.tokens_decoded,
                "graft_prefill_tokens": graft.tokens_prefilled,
                "tokens_restored": graft.tokens_restored,
                "graft_ms": graft.graft_ms,
                "graft_s": graft.wall_ms / 1e3,
                "fresh_ttft_ms": fresh.ttft_ms,
                "graft_ttft_ms": graft.ttft_ms,
                "answer_ready": graft.answer_ready,
                "exact": graft.exact,
                "proof": graft.proof,
                "verified_by": graft.verified_by,
            }
        )
    return {
        "problems_jsonl_sha256": _sha(jsonl.read_bytes()),
        "pack": pack.as_dict(),
        "build_s": build_s,
        "rows": rows,
        "fresh_budget": budget,
    }


def graft_timing(service: LibraryService, say: Callable[[str], None]) -> list[dict]:
    engine = service.engine
    probe = engine.model.tokenize(DOCUMENT_PROBE, add_bos=False)
    out = []
    for words in TIMING_WORDS:
        text = synthetic_text(words, seed=words)
        tokens = engine.model.tokenize(text)
        say(f"prefill vs graft: a {len(tokens):,}-token document")
        with engine.session() as s:
            t0 = time.perf_counter()
            s.prefill(tokens)
            prefill_s = time.perf_counter() - t0
        entry = service.deposit(text, title=f"timing document, {len(tokens)} tokens").entry
        receipt = Receipt.read(entry.receipt)
        times, exact = [], receipt is not None  # compared with the receipt's fresh logits, or not shown exact
        for _ in range(3):
            with engine.session() as g:
                t0 = time.perf_counter()
                service.graft(g, entry)
                times.append(time.perf_counter() - t0)
                g.prefill(probe)
                exact = exact and receipt.matches(probe, logits_sha256(g.logits())) is True
        graft_s = statistics.median(times)
        out.append(
            {
                "tokens": len(tokens),
                "entry": entry.id,
                "blob_sha256": entry.blob_sha256,
                "blob_bytes": entry.blob_size,
                "prefill_s": prefill_s,
                "graft_s": graft_s,
                "ratio": prefill_s / graft_s,
                "exact": exact,
            }
        )
    return out


def run_demo(
    engine: Engine,
    on_step: Callable[[str], None] | None = None,
    budget: int = FRESH_BUDGET,
    home: Path | None = None,
) -> dict:
    say = on_step or (lambda _m: None)
    with open_library(home) as lib, LibraryService(engine, lib) as service:
        rec = recurring_case(service, say, budget)
        timing = graft_timing(service, say)
    rows = rec["rows"]
    result = {
        "kind": "kvgraft-demo-receipts",
        "kvgraft_fingerprint": engine.fingerprint,
        "fingerprint_info": engine.fingerprint_info,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "inputs": {"problems_jsonl_sha256": rec["problems_jsonl_sha256"], "starter_pack": rec["pack"]},
        "recurring": {
            "problems": len(rows),
            "fresh_budget": rec["fresh_budget"],
            "fresh_correct": sum(r["fresh_ok"] for r in rows),
            "graft_correct": sum(r["graft_ok"] for r in rows),
            "fresh_decode_tokens": sum(r["fresh_decode_tokens"] for r in rows),
            "graft_decode_tokens": sum(r["graft_decode_tokens"] for r in rows),
            "max_graft_decode_tokens": max(r["graft_decode_tokens"] for r in rows),
            "fresh_s": sum(r["fresh_s"] for r in rows),
            "graft_s": sum(r["graft_s"] for r in rows),
            "tokens_restored": sum(r["tokens_restored"] for r in rows),
            "exact_grafts": sum(r["exact"] is True for r in rows),
            "fresh_ttft_median_ms": _median([r["fresh_ttft_ms"] for r in rows]),
            "graft_ttft_median_ms": _median([r["graft_ttft_ms"] for r in rows]),
            "fresh_answer_median_s": _median([r["fresh_s"] for r in rows]),
            "graft_answer_median_s": _median([r["graft_s"] for r in rows]),
            "rows": rows,
        },
        "timing": timing,
    }
    r = result["recurring"]
    result["all_exact"] = r["exact_grafts"] == r["problems"] and all(t["exact"] for t in timing)
    receipts_dir = data_dir(home) / "receipts"
    receipts_dir.mkdir(parents=True, exist_ok=True)
    path = receipts_dir / f"demo-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    result["receipts_file"] = str(path)
    result["receipts_sha256"] = _sha(path.read_bytes())
    return result


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} ms"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.0f}x"


def format_demo(result: dict) -> str:
    r = result["recurring"]
    n = r["problems"]
    restored = [x["tokens_restored"] for x in r["rows"]]
    past = sum(1 for t in restored if t > 512)
    fresh_acc, graft_acc = f"{r['fresh_correct']}/{n}", f"{r['graft_correct']}/{n}"
    tok_ratio = r["fresh_decode_tokens"] / max(1, r["graft_decode_tokens"])
    s_ratio = r["fresh_s"] / max(1e-9, r["graft_s"])
    lines = [
        f"Recurring problems: {n} verified problems, worked solutions of {min(restored):,}-{max(restored):,} tokens "
        f"({past} past the 512-token window)",
        "",
        f"{'':<24}{'fresh':>16}{'from the library':>20}{'ratio':>10}",
        f"{'accuracy':<24}{fresh_acc:>16}{graft_acc:>20}",
        f"{'decode tokens':<24}{r['fresh_decode_tokens']:>16,}{r['graft_decode_tokens']:>20,}{tok_ratio:>9.0f}x",
        f"{'wall time':<24}{r['fresh_s']:>14.1f} s{r['graft_s']:>18.1f} s{s_ratio:>9.0f}x",
        f"{'per answer (median)':<24}{r['fresh_answer_median_s'] * 1e3:>13,.0f} "
        f"ms{r['graft_answer_median_s'] * 1e3:>17,.0f} ms"
        f"{r['fresh_answer_median_s'] / max(1e-9, r['graft_answer_median_s']):>9.0f}x",
        f"{'first token (median)':<24}{_ms(r['fresh_ttft_median_ms']):>16}{_ms(r['graft_ttft_median_ms']):>20}"
        f"{_ratio(r['fresh_ttft_median_ms'], r['graft_ttft_median_ms']):>10}",
        f"{'tokens restored':<24}{'-':>16}{r['tokens_restored']:>20,}",
        f"{'exact grafts':<24}{'-':>16}{str(r['exact_grafts']) + '/' + str(n):>20}",
        f"(fresh: budget {r['fresh_budget']} decode tokens per problem; from the library: at most "
        f"{r['max_graft_decode_tokens']} decode tokens per answer; exact = logits after the question are "
        "SHA-256-equal to the fresh run in the entry's receipt)",
        "",
        "Prefill vs graft (graft = read blob + SHA-256 check + validate + restore, median of 3):",
        "",
        f"{'tokens':>8} | {'blob MB':>7} | {'fresh prefill':>13} | {'graft':>9} | {'ratio':>6} | exact",
    ]
    for t in result["timing"]:
        lines.append(
            f"{t['tokens']:>8,} | {t['blob_bytes'] / 1e6:>7.1f} | {t['prefill_s']:>11.2f} s | "
            f"{t['graft_s'] * 1e3:>6.1f} ms | "
            f"{t['ratio']:>5.0f}x | {'yes' if t['exact'] else 'NO'}"
        )
    lines += ["", f"receipts: {result['receipts_file']} (sha256 {result['receipts_sha256'][:16]}...)"]
    return "\n".join(lines)
