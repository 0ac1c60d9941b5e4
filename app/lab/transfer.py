"""Held-out transfer: does a library of verified worked solutions make the model answer new problems,
and what does each answer cost? (scripts/transfer.py)

One worked solution per problem family is deposited (its answer computed by the family's program and
checked before it is stored). Then, side by side for every held-out problem of those families (other
numbers, other names), one after another in the same process:

  (a) fresh: the problem alone;
  (b) graft: the family's solution, found by the library's related search, grafted, the problem asked after it;
  (c) prefill: the same solution's text prefilled in the schedule its state was computed in, the problem after it.

(b) and (c) hold the same tokens decoded in the same calls, so their logits after the question must be
SHA-256-equal: the graft changes the cost, not the answer. The recurring case asks the library's own
problems, answered from their answer-ready states (`kvgraft ask`). Every number is measured in the run;
the seed decides the problems, and nothing is tuned on the reported one.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from kvgraft.app.answer.ask import ask
from kvgraft.app.answer.attempts import Attempt, attempt
from kvgraft.app.answer.solve import related_entry
from kvgraft.app.lab.transfer_problems import FAMILIES, FamilyProblem, family_sets
from kvgraft.app.proof.checkers import check_final_number, get_checker
from kvgraft.app.proof.solution_format import final_answer
from kvgraft.app.service import LibraryService

VOUCHED_BY = "checker:numeric"  # each stored solution's final line is checked against the computed answer
CONDITIONS = ("fresh", "graft", "prefill")


@dataclass
class Row:
    problem: FamilyProblem
    entry_id: int | None  # the solution the related search found (None: none fitted)
    family_found: bool  # it is the family's own stored solution
    attempts: dict[str, Attempt] = field(default_factory=dict)

    @property
    def logits_equal(self) -> bool | None:
        b, c = self.attempts.get("graft"), self.attempts.get("prefill")
        return None if b is None or c is None else b.logits_sha256 == c.logits_sha256

    def as_dict(self) -> dict:
        return {
            "family": self.problem.family,
            "question": self.problem.question,
            "reference": self.problem.answer,
            "entry_id": self.entry_id,
            "family_found": self.family_found,
            "logits_equal": self.logits_equal,
            **{how: a.as_dict() for how, a in self.attempts.items()},
        }


@dataclass(frozen=True)
class Recurring:
    question: str
    reference: str
    text: str
    checked: bool
    decode_tokens: int
    wall_s: float
    cpu_s: float
    exact: bool | None
    answer_ready: bool

    def as_dict(self) -> dict:
        return asdict(self)


def summary(outcomes: list[tuple[bool, bool | None, int, float, float]]) -> dict:
    """(checked, last number right, decode tokens, wall s, cpu s) per answer -> the table's columns."""
    n = len(outcomes)
    correct = sum(o[0] for o in outcomes)
    lenient = None if any(o[1] is None for o in outcomes) else sum(o[1] for o in outcomes)
    cpu = sum(o[4] for o in outcomes)
    return {
        "answers": n,
        "correct": correct,
        "accuracy": correct / n if n else None,
        "correct_last_number": lenient,
        "decode_tokens_mean": sum(o[2] for o in outcomes) / n if n else None,
        "wall_s_median": statistics.median(o[3] for o in outcomes) if n else None,
        "wall_s_total": sum(o[3] for o in outcomes),
        "cpu_s_total": cpu,
        "cpu_s_per_correct": cpu / correct if correct else None,
        "cpu_s_per_correct_last_number": cpu / lenient if lenient else None,
    }


def _last_number(d: dict, reference: str) -> bool | None:
    """The lenient reading: the last number anywhere in the answer is the reference (None: no text kept)."""
    return check_final_number(d["text"], reference) if isinstance(d.get("text"), str) else None


def table(report: dict) -> dict:
    """The rows of the side-by-side table, from a report's dict (a run's, or its saved JSON)."""
    out = {}
    for how in CONDITIONS:
        out[how] = summary(
            [
                (a["checked"], _last_number(a, r["reference"]), a["decode_tokens"], a["wall_s"], a["cpu_s"])
                for r in report["rows"]
                if (a := r.get(how)) is not None
            ]
        )
    out["recurring"] = summary(
        [
            (r["checked"], _last_number(r, r["reference"]) if "reference" in r else None, r["decode_tokens"])
            + (r["wall_s"], r["cpu_s"])
            for r in report["recurring"]
        ]
    )
    return out


def facts(report: dict) -> dict:
    """What the targets are read from."""
    t, rows = table(report), report["rows"]
    fresh, graft, prefill = t["fresh"], t["graft"], t["prefill"]

    def ratio(x, y):
        return x / y if x is not None and y else None

    n = len(rows)
    return {
        "held_out": n,
        "families": len({r["family"] for r in rows}),
        "family_found": sum(r["family_found"] for r in rows),
        "logits_equal": sum(bool(r["logits_equal"]) for r in rows),
        "accuracy_points_graft_over_fresh": (graft["correct"] - fresh["correct"]) * 100 / n if n else None,
        "accuracy_points_last_number": (
            (graft["correct_last_number"] - fresh["correct_last_number"]) * 100 / n
            if n and graft["correct_last_number"] is not None and fresh["correct_last_number"] is not None
            else None
        ),
        "fresh_without_answer_line": sum(1 for r in rows if r["fresh"]["answer"] is None),
        "fresh_cut_at_budget": sum(1 for r in rows if r["fresh"]["stop_reason"] == "max_tokens"),
        "wall_median_graft_over_prefill": ratio(graft["wall_s_median"], prefill["wall_s_median"]),
        "cpu_per_correct_fresh_over_graft": ratio(fresh["cpu_s_per_correct"], graft["cpu_s_per_correct"]),
        "cpu_per_correct_fresh_over_graft_last_number": ratio(
            fresh["cpu_s_per_correct_last_number"], graft["cpu_s_per_correct_last_number"]
        ),
    }


@dataclass
class TransferReport:
    model: str
    seed: int
    held_out_per_family: int
    budget: int
    deposits: list[dict]
    recurring: list[Recurring]
    rows: list[Row]
    wall_s: float = 0.0
    settings: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {
            "model": self.model,
            "seed": self.seed,
            "held_out_per_family": self.held_out_per_family,
            "budget": self.budget,
            "settings": self.settings,
            "wall_s": self.wall_s,
            "deposits": self.deposits,
            "recurring": [r.as_dict() for r in self.recurring],
            "rows": [r.as_dict() for r in self.rows],
        }
        return {**out, "facts": facts(out), "table": table(out)}


def _deposit(service: LibraryService, p: FamilyProblem) -> dict:
    """Store a family's worked solution, vouched by the checker only if its final line is the computed answer."""
    stated = final_answer(p.solution)
    if stated is None or not get_checker("numeric")(stated, p.answer):
        raise ValueError(f"the {p.family} solution does not end with its answer {p.answer}")
    t0, c0 = time.perf_counter(), time.process_time()
    dep = service.deposit_solution(p.question, p.solution, p.answer, vouched_by=VOUCHED_BY)
    receipt = dep.entry.receipt or {}
    return {
        "family": p.family,
        "entry_id": dep.entry.id,
        "question": p.question,
        "tokens": dep.entry.n_tokens,
        "receipt_equal": receipt.get("graft_logits_sha256") == receipt.get("fresh_logits_sha256"),
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
    }


def run_transfer(
    service: LibraryService,
    seed: int = 1,
    held_out: int = 5,
    budget: int = 320,
    families: list[str] | None = None,
    progress: Callable[[str], None] = lambda msg: None,
) -> TransferReport:
    t_start = time.perf_counter()
    stored, held = family_sets(seed, held_out)
    if families:
        unknown = set(families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown families {sorted(unknown)}; known: {', '.join(FAMILIES)}")
        stored = [p for p in stored if p.family in families]
        held = [p for p in held if p.family in families]
    cfg = service.engine.config
    deposits = []
    for p in stored:
        deposits.append(_deposit(service, p))
        progress(f"stored the {p.family} solution as #{deposits[-1]['entry_id']} ({deposits[-1]['tokens']} tokens)")
    by_family = {d["family"]: d["entry_id"] for d in deposits}
    recurring = []
    for p in stored:
        c0 = time.process_time()
        r = ask(service, p.question, budget=budget, retrieve=False)
        recurring.append(
            Recurring(
                p.question,
                p.answer,
                r.answer,
                r.answer_checked is True,
                r.tokens_decoded,
                r.wall_ms / 1e3,
                time.process_time() - c0,
                r.exact,
                bool(r.answer_ready),
            )
        )
        progress(f"recurring {p.family}: {'ok' if recurring[-1].checked else 'wrong'}, {r.source}, exact {r.exact}")
    rows = []
    for i, p in enumerate(held):
        e = related_entry(service, p.question, budget)
        row = Row(p, e.id if e else None, e is not None and e.id == by_family.get(p.family))
        row.attempts["fresh"] = attempt(service, p.question, p.answer, "fresh", budget=budget)
        if e is not None:
            row.attempts["graft"] = attempt(service, p.question, p.answer, "graft", e, budget)
            row.attempts["prefill"] = attempt(service, p.question, p.answer, "prefill", e, budget)
        rows.append(row)
        marks = " ".join(f"{how} {'ok' if a.checked else 'wrong'}" for how, a in row.attempts.items())
        progress(f"[{i + 1}/{len(held)}] {p.family}: {marks}; logits (b)=(c): {row.logits_equal}")
    return TransferReport(
        model=service.engine.model.info.name,
        seed=seed,
        held_out_per_family=held_out,
        budget=budget,
        deposits=deposits,
        recurring=recurring,
        rows=rows,
        wall_s=time.perf_counter() - t_start,
        settings={k: getattr(cfg, k) for k in ("n_ctx", "n_batch", "n_threads", "lookup", "flash_attn")},
    )


def markdown(report: dict) -> str:
    """The side-by-side table and the facts the targets are read from, from a report's dict."""
    t, f = table(report), facts(report)

    def pct(x):
        return "-" if x is None else f"{100 * x:.0f} %"

    def num(x, fmt="{:.1f}"):
        return "-" if x is None else fmt.format(x)

    lines = [
        "| answer | problems | correct ('Answer: N' line) | accuracy | correct (last number) | decode tokens (mean) "
        "| wall s (median) | CPU s per correct |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {
        "fresh": "(a) held-out, fresh",
        "graft": "(b) held-out, family's solution grafted",
        "prefill": "(c) held-out, same solution prefilled",
        "recurring": "recurring: the library's own problems",
    }
    for key in ("fresh", "graft", "prefill", "recurring"):
        s = t[key]
        lines.append(
            f"| {names[key]} | {s['answers']} | {s['correct']} | {pct(s['accuracy'])} | "
            f"{num(s['correct_last_number'], '{}')} | {num(s['decode_tokens_mean'], '{:.0f}')} | "
            f"{num(s['wall_s_median'])} | {num(s['cpu_s_per_correct'])} |"
        )
    lines += [
        "",
        f"{f['held_out']} held-out problems in {f['families']} families; the related search found the family's "
        f"solution for {f['family_found']}; logits after the question SHA-256-equal in (b) and (c): "
        f"{f['logits_equal']} of {f['held_out']}.",
        f"accuracy (b) - (a): {num(f['accuracy_points_graft_over_fresh'], '{:+.0f}')} points "
        f"({num(f['accuracy_points_last_number'], '{:+.0f}')} reading the last number instead; fresh answers "
        f"without an 'Answer:' line: {f['fresh_without_answer_line']}, cut at the budget: {f['fresh_cut_at_budget']}); "
        f"median wall (b)/(c): {num(f['wall_median_graft_over_prefill'], '{:.2f}')}; CPU s per correct answer "
        f"(a)/(b): {num(f['cpu_per_correct_fresh_over_graft'], '{:.1f}')}x "
        f"({num(f['cpu_per_correct_fresh_over_graft_last_number'], '{:.1f}')}x reading the last number).",
    ]
    return "\n".join(lines)
