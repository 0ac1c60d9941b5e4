"""`kvgraft solve`: the flywheel. Ask the library first, else work it out fresh; check; deposit what verifies.

`solve` returns a `SolveReport`; its `as_dict()` is `kvgraft solve --json`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from kvgraft.app.answer.ask import ask
from kvgraft.app.proof.checkers import get_checker
from kvgraft.app.proof.problems import Problem
from kvgraft.app.proof.prompts import fresh_prompt
from kvgraft.app.service import LibraryService


@dataclass(frozen=True)
class RelatedTry:
    """A held-out problem asked again after grafting the best related proven solution."""

    entry_id: int
    answer: str
    checked: bool
    decode_tokens: int

    def as_dict(self) -> dict:
        return {
            "entry_id": self.entry_id,
            "answer": self.answer,
            "checked": self.checked,
            "decode_tokens": self.decode_tokens,
        }


@dataclass(frozen=True)
class SolveRow:
    """One problem: where its answer came from, whether the checker passed it, what it cost."""

    id: str
    source: str  # "graft" (from the library) or "fresh"
    entry_id: int | None
    answer: str
    reference: str
    checked: bool
    decode_tokens: int
    prefill_tokens: int
    prefill_tokens_saved: int
    exact: bool | None
    deposited: int | None  # the entry a checked fresh answer was deposited as
    wall_s: float
    tried_related: bool = False  # --related and not from the library: `related` says what that gave
    related: RelatedTry | None = None  # None: no related entry fitted

    def as_dict(self) -> dict:
        out = {
            "id": self.id,
            "source": self.source,
            "entry_id": self.entry_id,
            "answer": self.answer,
            "reference": self.reference,
            "checked": self.checked,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens": self.prefill_tokens,
            "prefill_tokens_saved": self.prefill_tokens_saved,
            "exact": self.exact,
            "deposited": self.deposited,
        }
        if self.tried_related:
            out["related"] = self.related.as_dict() if self.related else None
        out["wall_s"] = self.wall_s
        return out


@dataclass(frozen=True)
class HeldOut:
    """The problems not answered from the library, with and without the best related entry grafted."""

    problems: int
    accuracy_without_related: float | None
    accuracy_with_related: float | None
    with_a_related_entry: int

    def as_dict(self) -> dict:
        return {
            "problems": self.problems,
            "accuracy_without_related": self.accuracy_without_related,
            "accuracy_with_related": self.accuracy_with_related,
            "with_a_related_entry": self.with_a_related_entry,
        }


@dataclass(frozen=True)
class SolveReport:
    rows: tuple[SolveRow, ...]
    related: bool  # --related: each held-out problem was also tried after a related entry

    @property
    def problems(self) -> int:
        return len(self.rows)

    @property
    def solved_from_library(self) -> int:
        return sum(r.checked for r in self.rows if r.source == "graft")

    @property
    def solved_fresh(self) -> int:
        return sum(r.checked for r in self.rows if r.source != "graft")

    @property
    def unsolved(self) -> int:
        return sum(not r.checked for r in self.rows)

    @property
    def decode_tokens(self) -> int:
        return sum(r.decode_tokens for r in self.rows)

    @property
    def prefill_tokens_saved(self) -> int:
        return sum(r.prefill_tokens_saved for r in self.rows)

    @property
    def deposited(self) -> int:
        return sum(1 for r in self.rows if r.deposited)

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.rows)

    @property
    def held_out(self) -> HeldOut | None:
        if not self.related:
            return None
        held = [r for r in self.rows if r.source != "graft"]
        tried = [r for r in held if r.related]
        return HeldOut(
            problems=len(held),
            accuracy_without_related=(sum(r.checked for r in held) / len(held)) if held else None,
            accuracy_with_related=(sum(r.related.checked for r in tried) / len(tried)) if tried else None,
            with_a_related_entry=len(tried),
        )

    def as_dict(self) -> dict:
        out = {
            "problems": self.problems,
            "solved_from_library": self.solved_from_library,
            "solved_fresh": self.solved_fresh,
            "unsolved": self.unsolved,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens_saved": self.prefill_tokens_saved,
            "deposited": self.deposited,
            "wall_s": self.wall_s,
            "results": [r.as_dict() for r in self.rows],
        }
        if self.held_out is not None:
            out["held_out"] = self.held_out.as_dict()
        return out


def _with_related(service: LibraryService, p: Problem, budget: int) -> RelatedTry | None:
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
    return RelatedTry(best.id, gen.text.strip(), ok, len(gen.tokens))


def solve(
    service: LibraryService,
    problems: list[Problem],
    budget: int = 256,
    related: bool = False,
    deposit: bool = True,
    progress: Callable[[str, int, int], None] = lambda *a: None,
) -> SolveReport:
    rows = []
    for i, p in enumerate(problems):
        t0 = time.perf_counter()
        r = ask(service, p.question, budget=budget, retrieve=False)
        if r.source == "graft":
            checked = get_checker(p.checker)(r.answer, p.answer)
        else:
            checked = get_checker("final_number" if p.checker == "numeric" else p.checker)(r.answer, p.answer)
        deposited = None
        if r.source != "graft" and checked and deposit:
            # the model's own worked answer, confirmed by the checker, becomes verified knowledge
            dep = service.deposit_solution(
                p.question, r.answer, p.answer, checker=p.checker, vouched_by=f"checker:{p.checker}"
            )
            deposited = dep.entry.id
        tried = related and r.source != "graft"
        rel = _with_related(service, p, budget) if tried else None
        rows.append(
            SolveRow(
                id=p.id,
                source=r.source,
                entry_id=r.entry_id,
                answer=r.answer,
                reference=p.answer,
                checked=checked,
                decode_tokens=r.tokens_decoded,
                prefill_tokens=r.tokens_prefilled,
                prefill_tokens_saved=r.tokens_restored,
                exact=r.exact,
                deposited=deposited,
                wall_s=time.perf_counter() - t0,
                tried_related=tried,
                related=rel,
            )
        )
        progress("solve", i + 1, len(problems))
    return SolveReport(tuple(rows), related)
