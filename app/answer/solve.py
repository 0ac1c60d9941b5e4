"""`kvgraft solve`: the flywheel. Ask the library first, else work it out fresh; check; deposit what verifies.

An instruct model is asked through its chat template and checked on its final 'Answer: N' line; a
base model keeps the Q/A format (app/proof/solution_format.py). `--related` grafts the best sibling
solution (same kind, other numbers) before asking again, and names it.

`solve` returns a `SolveReport`; its `as_dict()` is `kvgraft solve --json`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from kvgraft.app.answer.ask import ask
from kvgraft.app.answer.attempts import attempt, question_tokens
from kvgraft.app.proof.checkers import get_checker
from kvgraft.app.proof.problems import Problem
from kvgraft.app.proof.solution_format import checked_part, uses_turns
from kvgraft.app.service import LibraryService
from kvgraft.library.records import Entry
from kvgraft.library.retrieval import same_numbers


@dataclass(frozen=True)
class RelatedTry:
    """A held-out problem asked again after grafting the best related proven solution."""

    entry_id: int
    question: str  # the grafted solution's own problem (a sibling: other numbers)
    answer: str
    checked: bool
    decode_tokens: int

    def as_dict(self) -> dict:
        return {
            "entry_id": self.entry_id,
            "grafted_question": self.question,
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


def related_entry(service: LibraryService, question: str, budget: int) -> Entry | None:
    """The best related proven solution for `question` (full-text search over stored questions): a sibling
    of the same kind, never one stated with the very same numbers (that would copy its answer), and
    one that fits the context with the question and the answer's budget."""
    engine, lib = service.engine, service.library
    for e in lib.related(question, engine.fingerprint, limit=5):
        if e.kind != "solution" or same_numbers(question, e.question or ""):
            continue
        if e.n_tokens + len(question_tokens(engine.model, question, e)[0]) + budget <= engine.config.n_ctx:
            return e
    return None


def _with_related(service: LibraryService, p: Problem, budget: int) -> RelatedTry | None:
    """Graft the best related proven solution, then ask the new question fresh after it."""
    best = related_entry(service, p.question, budget)
    if best is None:
        return None
    a = attempt(service, p.question, p.answer, how="graft", entry=best, budget=budget, checker=p.checker)
    return RelatedTry(best.id, best.question or best.title, a.text, a.checked, a.decode_tokens)


def solve(
    service: LibraryService,
    problems: list[Problem],
    budget: int = 256,
    related: bool = False,
    deposit: bool = True,
    progress: Callable[[str, int, int], None] = lambda *a: None,
) -> SolveReport:
    rows = []
    model = service.engine.model
    turns = uses_turns(model)  # an instruct model: problems go through its chat template
    for i, p in enumerate(problems):
        t0 = time.perf_counter()
        stored = service.library.find_question(p.question, service.engine.fingerprint)
        if turns and (stored is None or not stored.graftable(service.engine.fingerprint)):
            a = attempt(service, p.question, p.answer, how="fresh", budget=budget, checker=p.checker)
            source, entry_id, answer, checked, exact = "fresh", None, a.text, a.checked, None
            decoded, prefilled, restored = a.decode_tokens, a.prefilled_tokens, 0
        else:
            r = ask(service, p.question, budget=budget, retrieve=False)
            source, entry_id, answer, exact = r.source, r.entry_id, r.answer, r.exact
            decoded, prefilled, restored = r.tokens_decoded, r.tokens_prefilled, r.tokens_restored
            if r.source == "graft":  # the stored solution's format says how its answer reads
                part = checked_part(model, stored.text, r.answer)
                checked = part is not None and get_checker(p.checker)(part, p.answer)
            else:  # a base model's fresh or prefix answer (an instruct model's fresh one is an attempt above)
                checked = get_checker("final_number" if p.checker == "numeric" else p.checker)(r.answer, p.answer)
        deposited = None
        if source != "graft" and checked and deposit:
            # the model's own worked answer, confirmed by the checker, becomes verified knowledge
            dep = service.deposit_solution(
                p.question, answer, p.answer, checker=p.checker, vouched_by=f"checker:{p.checker}"
            )
            deposited = dep.entry.id
        tried = related and source != "graft"
        rel = _with_related(service, p, budget) if tried else None
        rows.append(
            SolveRow(
                id=p.id,
                source=source,
                entry_id=entry_id,
                answer=answer,
                reference=p.answer,
                checked=checked,
                decode_tokens=decoded,
                prefill_tokens=prefilled,
                prefill_tokens_saved=restored,
                exact=exact,
                deposited=deposited,
                wall_s=time.perf_counter() - t0,
                tried_related=tried,
                related=rel,
            )
        )
        progress("solve", i + 1, len(problems))
    return SolveReport(tuple(rows), related)
