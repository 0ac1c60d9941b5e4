"""`kvgraft ask`: answer from the library when it can, fresh when it cannot, and say which.

1. graft: the library holds a graftable entry for this exact (normalized) question. Its state is
   grafted, the question suffix ("Q: <question> / A:") is prefilled and the answer decoded up to
   the newline. If the suffix is the entry's receipt probe, the logits after it are compared with
   the receipt's fresh logits SHA-256: `exact` is the outcome of that comparison (true or false);
   where no comparison applies it is null (the blob's digests were checked, its logits not compared).
2. retrieved: the stored document that alone covers the question's words (RETRIEVAL_MIN_COVERAGE),
   or a worked solution stated with the question's very numbers, or else the document the model's
   own reading says explains the question (app/answer/reading.py: the likelihood of the question's
   tokens given each of the first few BM25 candidates, against no document), is grafted and named.
3. prefix: the longest stored entry whose tokens start the prompt is grafted and only the rest of
   the prompt is prefilled.
4. fresh: the whole prompt is prefilled and the model works within a token budget.
One small function per source below; `ask` tries them in that order. Answers stream through
`TextStream` (app/answer/stream.py): the pieces shown add up to the answer returned.
Only proven entries (local, replayed, or signed by a trusted key) are ever grafted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kvgraft.app.answer.elsewhere import made_elsewhere
from kvgraft.app.answer.reading import Verdict, read_candidates
from kvgraft.app.answer.result import AskResult, ranked_dict
from kvgraft.app.answer.stream import TextFn, TextStream
from kvgraft.app.answer.thresholds import GRAFT_ANSWER_TOKENS, RETRIEVAL_MIN_COVERAGE, SOLUTION_MIN_WORDING
from kvgraft.app.proof.chat_format import ChatFormat
from kvgraft.app.proof.checkers import CheckerFn, UnknownChecker, checker_for
from kvgraft.app.proof.prompts import QA_FORMAT, ask_suffix, fresh_prompt
from kvgraft.app.proof.receipt import Receipt
from kvgraft.app.proof.replay import decode_in_calls
from kvgraft.app.proof.solution_format import (
    TURNS_FORMAT,
    answer_decoding,
    checked_part,
    is_turns_text,
    question_suffix,
)
from kvgraft.app.service import LibraryService
from kvgraft.engine.compare import logits_sha256
from kvgraft.library.errors import BlobCorrupt, BlobMissing, BlobUnreadable
from kvgraft.library.retrieval import same_numbers

RULES = ("reading", "words")  # how a retrieved document is accepted: by the model's reading, or words only

__all__ = ["GRAFT_ANSWER_TOKENS", "RULES", "RETRIEVAL_MIN_COVERAGE", "SOLUTION_MIN_WORDING", "AskResult", "ask"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Asked:
    """One question being answered: what every source needs."""

    service: LibraryService
    question: str
    budget: int
    on_text: TextFn | None
    t0: float

    def decode(self, session, budget: int, stop: list[str]):
        """Greedy decoding, streamed through one TextStream: (the generation, its answer as returned)."""
        stream = TextStream(self.service.engine.model, self.on_text, stop)
        gen = session.generate(budget, stop=stop, on_token=stream.on_token)
        answer = gen.text.strip()
        stream.finish(answer)
        return gen, answer

    def result(self, gen, answer: str, **fields) -> AskResult:
        return AskResult(
            question=self.question,
            answer=answer,
            tokens_decoded=len(gen.tokens),
            wall_ms=(time.perf_counter() - self.t0) * 1e3,
            stop_reason=gen.stop_reason,
            ttft_ms=(gen.first_token_at - self.t0) * 1e3 if gen.first_token_at else None,
            decode_calls=len(gen.calls),
            **fields,
        )


@dataclass(frozen=True)
class _Stored:
    """What the library holds for this very question (if anything): its answer and who vouched for it."""

    verified_answer: str | None
    checker: CheckerFn | None  # None: the entry names a checker this version does not know (not checked)
    words: dict

    @classmethod
    def of(cls, entry) -> "_Stored":
        verified = entry is not None and entry.verified
        try:
            checker = checker_for(entry.checker if entry is not None else None)
        except UnknownChecker as exc:
            log.warning("entry #%d: %s; its answer is not checked", entry.id, exc)
            checker = None
        return cls(
            verified_answer=entry.answer if verified else None,
            checker=checker,
            words={
                "verified": verified,
                "verified_by": entry.vouched_by if verified else None,
                "stored_answer": entry.answer if entry is not None and not verified else None,
            },
        )

    def checked(self, answer: str | None, checker: CheckerFn | None = None) -> dict:
        """`answer` None: the answer states nothing a checker can read (no 'Answer: N' line): it fails."""
        check = checker or self.checker
        ok = None
        if self.verified_answer is not None and check is not None:
            ok = answer is not None and check(answer, self.verified_answer)
        return {"verified_answer": self.verified_answer, "answer_checked": ok, **self.words}


def ask(
    service: LibraryService,
    question: str,
    context: str | None = None,
    budget: int = 128,
    use_library: bool = True,
    on_text: TextFn | None = None,
    retrieve: bool = True,
    rule: str = "reading",
) -> AskResult:
    """Answer `question`: by graft from a proven entry stored for it; else, unless `retrieve` is False,
    from the stored document that alone covers it, a solution stated with its numbers, or the
    document the model's reading accepts (app/answer/reading.py); else a stored
    prefix of `context` or of the fresh prompt; else fresh. `on_text` receives the answer as it is
    decoded, in pieces that add up to `AskResult.answer`; raising Cancelled stops it (a cancelled answer).
    `rule="words"` accepts a document by its words alone (the rule before the model's reading; kept
    for comparison, scripts/library_qa.py)."""
    if not question.strip():
        raise ValueError("the question is empty")
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}: one of {', '.join(RULES)}")
    asked = _Asked(service, question, budget, on_text, time.perf_counter())
    lib, fp = service.library, service.engine.fingerprint
    searching = use_library and context is None
    entry = lib.find_question(question, fp) if searching else None
    stored = _Stored.of(entry)
    if entry is not None and entry.graftable(fp):
        return _from_graft(asked, entry, stored)
    ranked = lib.rank_documents(question, fp) if searching and retrieve else []
    not_grafted = None
    covering = [r for r in ranked if r.coverage >= RETRIEVAL_MIN_COVERAGE]
    if covering and covering[0] is ranked[0] and (len(covering) == 1 or rule == "words"):
        answered, not_grafted = _from_document(asked, ranked)  # its words alone decide it
        if answered is not None:
            return answered
    if searching and retrieve:
        answered = _from_solution(asked)
        if answered is not None:
            return answered
    read = None
    if ranked and rule == "reading" and not_grafted is None:
        answered, read = _from_reading(asked, ranked)
        if answered is not None:
            return answered
        not_grafted = read.why_not()
    return _from_prefix_or_fresh(asked, context, use_library, stored, ranked, not_grafted, read)


def _from_graft(asked: _Asked, entry, stored: _Stored) -> AskResult:
    """The library holds this question: graft its answer-ready state (decode one token) or its solution
    (decode the question suffix), compare with the receipt, and copy the answer to the newline (Q/A), or let
    an instruct model work it out after its verified example, up to the budget (template format)."""
    service, model = asked.service, asked.service.engine.model
    suffix = question_suffix(model, entry.text, asked.question)[1]  # Q/A, or an instruct model's next turn
    budget, stop = answer_decoding(model, entry.text, GRAFT_ANSWER_TOKENS, asked.budget)
    ready = service.answer_ready(entry, suffix)  # None when asked in other words than the stored question
    with service.session() as s:
        g = None
        if ready is not None:  # graft the text and question but one token, decode that one token
            try:
                g, ref, rest = service.graft(s, ready), ready, suffix[-1:]
            except (BlobMissing, BlobCorrupt, BlobUnreadable) as exc:  # marked damaged: the text-only state serves
                log.warning("answer-ready state #%d unusable (%s): answering from entry #%d", ready.id, exc, entry.id)
                ready = None
        if g is None:  # graft the text, decode the question suffix (in the calls its receipt recorded)
            g, ref, rest = service.graft(s, entry), entry, suffix
        receipt = Receipt.read(ref.receipt)
        decode_in_calls(s, rest, receipt.calls_for(rest) if receipt else None)
        match = receipt.matches(rest, logits_sha256(s.logits())) if receipt else None
        gen, answer = asked.decode(s, budget, stop)
    part = checked_part(model, entry.text, answer)
    return asked.result(
        gen,
        answer,
        source="graft",
        entry_id=entry.id,
        tokens_restored=g.n_tokens,
        graft_ms=g.total_ms,
        tokens_prefilled=len(rest),
        exact=match,
        receipt_match=match,
        proof=ref.proof,
        answer_ready=ready is not None,
        prompt_format=TURNS_FORMAT if is_turns_text(model, "solution", entry.text) else QA_FORMAT,
        **stored.checked(part),
    )


def _from_document(asked: _Asked, ranked: list) -> tuple[AskResult | None, str | None]:
    """The best-ranked document covers the question: graft it. (None, why) when it does not fit the context."""
    service, best = asked.service, ranked[0]
    doc = best.entry
    suffix = service.engine.model.tokenize("\n" + ask_suffix(asked.question), add_bos=False)
    n_ctx = service.engine.config.n_ctx
    if doc.n_tokens + len(suffix) + asked.budget > n_ctx:
        return None, (
            f"document #{doc.id} covers {best.coverage:.0%} of the question's words but does not fit this context "
            f"with the question and the answer: {doc.n_tokens:,} + {len(suffix)} + {asked.budget} tokens > {n_ctx:,}"
        )
    return _retrieved(asked, doc, suffix, asked.budget, best, [ranked_dict(r) for r in ranked[1:]]), None


def _from_solution(asked: _Asked) -> AskResult | None:
    """A worked solution whose stored question states the very same numbers and enough of the words.
    Its answer was vouched for the stored question, not this one: nothing here is "verified"."""
    service = asked.service
    ranked = service.library.rank_solutions(asked.question, service.engine.fingerprint)
    k = next(
        (
            i
            for i, r in enumerate(ranked)
            if same_numbers(asked.question, r.entry.question or "") and r.wording >= SOLUTION_MIN_WORDING
        ),
        None,
    )
    if k is None:
        return None
    best, e = ranked[k], ranked[k].entry
    model = service.engine.model
    suffix = question_suffix(model, e.text, asked.question)[1]  # the stored solution's own format
    budget, stop = answer_decoding(model, e.text, GRAFT_ANSWER_TOKENS, asked.budget)
    if e.n_tokens + len(suffix) + budget > service.engine.config.n_ctx:
        return None
    others = [ranked_dict(r) for i, r in enumerate(ranked) if i != k]
    return _retrieved(
        asked,
        e,
        suffix,
        budget,
        best,
        others,
        stop=stop,
        stored_answer=e.answer,
        matched_verified_by=e.vouched_by if e.verified else None,
        matched_question=e.question,
        wording=round(best.wording, 3),
    )


def _from_reading(asked: _Asked, ranked: list) -> tuple[AskResult | None, Verdict]:
    """The model reads the first few candidates (app/answer/reading.py); the one that explains the
    question is grafted, reusing its scoring pass as the answer's prefill when it was scored last.
    (None, the verdict) when none does, or none fits the context."""
    service = asked.service
    suffix = service.engine.model.tokenize("\n" + ask_suffix(asked.question), add_bos=False)
    room = service.engine.config.n_ctx - len(suffix) - asked.budget
    with service.session() as s:
        verdict = read_candidates(service, s, [r for r in ranked if r.entry.n_tokens <= room], suffix)
        if not verdict.accepted:
            return None, verdict
        best = verdict.best.ranked
        g = verdict.graft
        if best is not verdict.last:  # the session holds another candidate: graft the winner, prefill again
            s.reset(clear_data=False)
            g = service.graft(s, best.entry)
            s.prefill(suffix)
        gen, answer = asked.decode(s, asked.budget, ["\n"])
    return _retrieved_result(
        asked,
        gen,
        answer,
        best.entry,
        g,
        suffix,
        best,
        [r.as_dict() for r in verdict.readings[1:]],
        **verdict.gains(),
    ), verdict


def _retrieved(asked: _Asked, entry, suffix, budget, best, runners_up, stop=("\n",), **extra) -> AskResult:
    """Graft the retrieved entry at its own positions (exact), prefill the question after it, answer
    up to the newline (or `stop`)."""
    with asked.service.session() as s:
        g = asked.service.graft(s, entry)
        s.prefill(suffix)
        gen, answer = asked.decode(s, budget, list(stop))
    return _retrieved_result(asked, gen, answer, entry, g, suffix, best, runners_up, **extra)


def _retrieved_result(asked: _Asked, gen, answer, entry, g, suffix, best, runners_up, **extra) -> AskResult:
    """The result of a retrieved entry, named by its file and section where it came from one."""
    section = asked.service.library.sources.section_of(entry.id)
    return asked.result(
        gen,
        answer,
        verified_answer=None,
        answer_checked=None,
        source="retrieved",
        entry_id=entry.id,
        tokens_restored=g.n_tokens,
        graft_ms=g.total_ms,
        tokens_prefilled=len(suffix),
        exact=None,
        receipt_match=None,
        proof=entry.proof,
        title=entry.title,
        score=round(best.score, 3),
        coverage=round(best.coverage, 3),
        runners_up=runners_up,
        section=section.as_dict() if section is not None else None,
        **extra,
    )


def _from_prefix_or_fresh(
    asked: _Asked, context, use_library, stored: _Stored, ranked, not_grafted, read: Verdict | None = None
) -> AskResult:
    """The prompt (a context and the question, the model's template, or the fresh Q/A prompt): its
    longest stored prefix is grafted and the rest prefilled, else all of it is prefilled. `read`: the
    model's reading of the candidates that refused them (their gains are reported)."""
    service = asked.service
    model, lib, fp = service.engine.model, service.library, service.engine.fingerprint
    fmt = ChatFormat.for_model(model)
    checker = stored.checker
    if context is not None:
        prompt = model.tokenize(context) + model.tokenize("\n" + ask_suffix(asked.question), add_bos=False)
        stop = ["\n"]
    elif fmt.template is not None:  # an instruct model: the question as its chat template puts a user turn
        prompt = fmt.first(model, None, asked.question, after_state=False)
        stop = []  # it ends its turn with an end-of-generation token
        checker = checker_for("final_number") if checker is checker_for("numeric") else checker
    else:
        prompt = model.tokenize(fresh_prompt(asked.question))
        stop = ["\nQ:"]
        checker = checker_for("final_number") if checker is checker_for("numeric") else checker
    # at least the prompt's last token is always decoded here, so logits exist to start from
    prefix = lib.longest_prefix(prompt[:-1], fp) if use_library and len(prompt) > 1 else None
    match = None
    with service.session() as s:
        if prefix is not None:
            g = service.graft(s, prefix)
            rest = prompt[prefix.n_tokens :]
            receipt = Receipt.read(prefix.receipt)
            decode_in_calls(s, rest, receipt.calls_for(rest) if receipt else None)
            match = receipt.matches(rest, logits_sha256(s.logits())) if receipt else None
            grafted = {"tokens_restored": g.n_tokens, "graft_ms": g.total_ms, "tokens_prefilled": len(rest)}
        else:
            s.prefill(prompt)
            grafted = {"tokens_restored": 0, "graft_ms": None, "tokens_prefilled": len(prompt)}
        gen, answer = asked.decode(s, asked.budget, stop)
    best = ranked[0] if ranked else None
    section = lib.sources.section_of(prefix.id) if prefix is not None else None
    return asked.result(
        gen,
        answer,
        source="prefix" if prefix is not None else "fresh",
        entry_id=prefix.id if prefix is not None else None,
        exact=match,
        receipt_match=match,
        proof=prefix.proof if prefix is not None else None,
        prompt_format=fmt.name if (context is None and fmt.template is not None) else QA_FORMAT,
        score=round(best.score, 3) if best is not None else None,
        coverage=round(best.coverage, 3) if best is not None else None,
        runners_up=[x.as_dict() for x in read.readings] if read is not None else [ranked_dict(r) for r in ranked],
        **(read.gains() if read is not None else {}),
        section=section.as_dict() if section is not None else None,
        not_grafted=not_grafted,
        made_elsewhere=[x.as_dict() for x in made_elsewhere(lib, asked.question, service.engine)]
        if use_library and context is None
        else [],
        **grafted,
        **stored.checked(answer, checker),
    )
