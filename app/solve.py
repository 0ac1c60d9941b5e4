"""`kvgraft solve`: the flywheel. Ask the library first, else work it out fresh; check; deposit what verifies."""

from __future__ import annotations

import time
from typing import Callable

from .ask import ask
from .checker import get_checker
from .library_service import LibraryService
from .problems import Problem
from .prompts import fresh_prompt


def _with_related(service: LibraryService, p: Problem, budget: int) -> dict | None:
    """Graft the best related proven solution (FTS), then ask the new question fresh after it."""
    engine, lib = service.engine, service.library
    candidates = [e for e in lib.related(p.question, engine.fingerprint, limit=5) if e.kind == "solution"]
    if not candidates:
        return None
    best = candidates[0]
    prompt_rest = engine.model.tokenize("\n\n" + fresh_prompt(p.question), add_bos=False)
    if best.n_tokens + len(prompt_rest) + budget > engine.config.n_ctx:
        return None
    with service.session() as s:
        service.graft(s, best)
        s.prefill(prompt_rest)
        gen = s.generate(budget, stop=["\nQ:"])
    ok = get_checker("final_number")(gen.text, p.answer)
    return {"entry_id": best.id, "answer": gen.text.strip(), "checked": ok, "decode_tokens": len(gen.tokens)}


def solve(
    service: LibraryService,
    problems: list[Problem],
    budget: int = 256,
    related: bool = False,
    deposit: bool = True,
    progress: Callable[[str, int, int], None] = lambda *a: None,
) -> dict:
    rows = []
    for i, p in enumerate(problems):
        t0 = time.perf_counter()
        r = ask(service, p.question, budget=budget, retrieve=False)
        if r.source == "graft":
            checked = get_checker(p.checker)(r.answer, p.answer)
        else:
            checked = get_checker("final_number" if p.checker == "numeric" else p.checker)(r.answer, p.answer)
        row = {
            "id": p.id,
            "source": r.source,
            "entry_id": r.entry_id,
            "answer": r.answer,
            "reference": p.answer,
            "checked": checked,
            "decode_tokens": r.tokens_decoded,
            "prefill_tokens": r.tokens_prefilled,
            "prefill_tokens_saved": r.tokens_restored,
            "exact": r.exact,
            "deposited": None,
        }
        if r.source != "graft" and checked and deposit:
            # the model's own worked answer, confirmed by the checker, becomes verified knowledge
            dep = service.deposit_solution(
                p.question, r.answer, p.answer, checker=p.checker, vouched_by=f"checker:{p.checker}"
            )
            row["deposited"] = dep.entry.id
        if related and r.source != "graft":
            row["related"] = _with_related(service, p, budget)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        progress("solve", i + 1, len(problems))
    held_out = [r for r in rows if r["source"] != "graft"]
    with_rel = [r for r in held_out if r.get("related")]
    out = {
        "problems": len(rows),
        "solved_from_library": sum(r["checked"] for r in rows if r["source"] == "graft"),
        "solved_fresh": sum(r["checked"] for r in rows if r["source"] != "graft"),
        "unsolved": sum(not r["checked"] for r in rows),
        "decode_tokens": sum(r["decode_tokens"] for r in rows),
        "prefill_tokens_saved": sum(r["prefill_tokens_saved"] for r in rows),
        "deposited": sum(1 for r in rows if r["deposited"]),
        "wall_s": sum(r["wall_s"] for r in rows),
        "results": rows,
    }
    if related:
        out["held_out"] = {
            "problems": len(held_out),
            "accuracy_without_related": (sum(r["checked"] for r in held_out) / len(held_out)) if held_out else None,
            "accuracy_with_related": (sum(r["related"]["checked"] for r in with_rel) / len(with_rel))
            if with_rel
            else None,
            "with_a_related_entry": len(with_rel),
        }
    return out
