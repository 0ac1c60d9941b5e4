"""One attempt at a problem, three ways: fresh, after a stored solution grafted, or after the same
solution's text prefilled in the schedule its state was computed in.

The grafted and the prefilled attempt put the same tokens in the same decode calls before the question,
so the logits after the question are bit-identical (`logits_sha256` says so for each run): the graft
changes what the attempt costs, never what it answers. `solve --related` and scripts/transfer.py use it.
An instruct model is asked through its chat template (app/proof/solution_format.py) and checked on its
final 'Answer: N' line; a base model gets the Q/A prompt and its last number is checked.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from kvgraft.app.proof.checkers import get_checker
from kvgraft.app.proof.prompts import fresh_prompt
from kvgraft.app.proof.replay import prefill_in_schedule
from kvgraft.app.proof.solution_format import final_answer, fresh_tokens, is_turns_text, question_suffix, uses_turns
from kvgraft.app.service import LibraryService
from kvgraft.engine.compare import logits_sha256
from kvgraft.library.records import Entry

HOW = ("fresh", "graft", "prefill")


@dataclass(frozen=True)
class Attempt:
    how: str  # "fresh", "graft" (the entry's state grafted) or "prefill" (the entry's text prefilled)
    entry_id: int | None
    text: str  # the answer as decoded
    answer: str | None  # what the checker read: the final 'Answer: N' (instruct), the last number (Q/A)
    checked: bool
    prompt_tokens: int  # tokens put in context before the answer: restored + prefilled
    restored_tokens: int
    prefilled_tokens: int
    decode_tokens: int
    logits_sha256: str  # of the logits after the question, before the first answer token
    wall_s: float
    cpu_s: float  # process CPU seconds (llama.cpp's threads included)
    stop_reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def turns_answer(model, entry: Entry | None) -> bool:
    """Whether an attempt's answer is an instruct model's worked answer ending in 'Answer: N': fresh on a
    model with a usable chat template, or after a template-format solution."""
    return uses_turns(model) if entry is None else is_turns_text(model, "solution", entry.text)


def question_tokens(model, question: str, entry: Entry | None) -> tuple[list[int], list[str]]:
    """The tokens that ask `question` (after `entry`, when given) and the stop strings of the answer."""
    if turns_answer(model, entry):
        return (fresh_tokens(model, question) if entry is None else question_suffix(model, entry.text, question)[1]), []
    if entry is None:
        return model.tokenize(fresh_prompt(question)), ["\nQ:"]
    return model.tokenize("\n\n" + fresh_prompt(question), add_bos=False), ["\nQ:"]


def checked_answer(text: str, reference: str, turns: bool, checker: str = "numeric") -> tuple[str | None, bool]:
    """(what the checker read, whether it passed) for a worked answer to a problem: an instruct model's
    final 'Answer: ...' line (`turns`; none: not passed), else the last number in the text."""
    if turns:
        part = final_answer(text)
        check = get_checker("numeric" if checker == "final_number" else checker)
        return part, part is not None and check(part, reference)
    check = get_checker("final_number" if checker in ("numeric", "final_number") else checker)
    return text, check(text, reference)


def attempt(
    service: LibraryService,
    question: str,
    reference: str,
    how: str = "fresh",
    entry: Entry | None = None,
    budget: int = 256,
    checker: str = "numeric",
) -> Attempt:
    """Ask `question` fresh, or after `entry` (a stored solution) grafted or prefilled; check the answer."""
    if how not in HOW:
        raise ValueError(f"unknown attempt {how!r}: one of {', '.join(HOW)}")
    if (how == "fresh") != (entry is None):
        raise ValueError("a grafted or prefilled attempt needs its entry, a fresh one none")
    model = service.engine.model
    rest, stop = question_tokens(model, question, entry)
    before = entry.n_tokens if entry is not None else 0
    if before + len(rest) + budget > service.engine.config.n_ctx:
        raise ValueError(f"{before + len(rest) + budget:,} tokens do not fit this context: raise --n-ctx")
    t0, c0 = time.perf_counter(), time.process_time()
    restored = prefilled = 0
    with service.session() as s:
        if how == "graft":
            restored = service.graft(s, entry).n_tokens
        elif how == "prefill":
            prefill_in_schedule(s, list(entry.tokens), entry.schedule)
            prefilled = entry.n_tokens
        s.prefill(rest)
        prefilled += len(rest)
        sha = logits_sha256(s.logits())
        gen = s.generate(budget, stop=stop)
    text = gen.text.strip()
    part, ok = checked_answer(text, reference, turns_answer(model, entry), checker)
    return Attempt(
        how=how,
        entry_id=entry.id if entry is not None else None,
        text=text,
        answer=part,
        checked=ok,
        prompt_tokens=restored + prefilled,
        restored_tokens=restored,
        prefilled_tokens=prefilled,
        decode_tokens=len(gen.tokens),
        logits_sha256=sha,
        wall_s=time.perf_counter() - t0,
        cpu_s=time.process_time() - c0,
        stop_reason=gen.stop_reason,
    )
