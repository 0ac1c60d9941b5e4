"""`kvgraft ask`: answer from the library when it can, fresh when it cannot, and say which.

1. graft: the library holds a graftable entry for this exact (normalized) question. Its state is
   grafted, the question suffix ("Q: <question> / A:") is prefilled and the answer decoded up to
   the newline. If the suffix is the entry's receipt probe, the logits after it are compared with
   the receipt's fresh logits SHA-256: `exact` is the outcome of that comparison (true or false);
   where no comparison applies it is null ("exact restore, not compared").
2. prefix: the longest stored entry whose tokens start the prompt is grafted and only the rest of
   the prompt is prefilled.
3. fresh: the whole prompt is prefilled and the model works within a token budget.
Only proven entries (local, replayed, or signed by a trusted key) are ever grafted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from kvgraft.engine.compare import logits_sha256
from kvgraft.library.errors import BlobCorrupt, BlobMissing, BlobUnreadable
from kvgraft.library.retrieval import same_numbers
from kvgraft.library.tokens import tokens_sha256

from .chat_format import ChatFormat
from .checker import get_checker
from .library_service import LibraryService
from .prompts import QA_FORMAT, ask_suffix, fresh_prompt
from .replay import decode_in_calls

log = logging.getLogger(__name__)

GRAFT_ANSWER_TOKENS = 24  # an answer copied from a graft is a few tokens and a newline


# A document is grafted for a question only when it contains at least this share of the question's
# content words, weighted by rarity (library/retrieval.py); below it the question is answered fresh and
# says so. Tuned with scripts/library_qa.py on its tuning seed, never on the set the README reports.
RETRIEVAL_MIN_COVERAGE = 0.8
# A worked solution is grafted for a question asked in other words only when the question states the
# very same numbers as the solution's stored question (library/retrieval.same_numbers: a sibling
# problem of the same template has other numbers) and the solution holds at least this share of the
# question's other content words (`Ranked.wording`: a paraphrase uses words of its own, so the
# rarity weighting of RETRIEVAL_MIN_COVERAGE, which weighs an absent word the most, would refuse it).
# Tuned with scripts/solution_qa.py on its tuning seed, never on the set the README reports.
SOLUTION_MIN_WORDING = 0.6


def _ranked_dict(r) -> dict:
    return {
        "entry_id": r.entry.id,
        "title": r.entry.title,
        "score": round(r.score, 3),
        "coverage": round(r.coverage, 3),
        "wording": round(r.wording, 3),
    }


@dataclass
class AskResult:
    question: str
    answer: str  # what the model decoded (never the stored answer)
    verified_answer: str | None  # the stored answer, only when someone vouched for it (verified_by)
    answer_checked: bool | None  # the decoded answer passed the entry's checker against verified_answer
    source: str  # graft / prefix / fresh
    entry_id: int | None
    tokens_restored: int
    graft_ms: float | None
    tokens_prefilled: int
    tokens_decoded: int
    exact: (
        bool | None
    )  # True/False: logits after the graft were compared with a fresh run's (receipt); None: not compared
    receipt_match: bool | None
    wall_ms: float
    stop_reason: str
    proof: str | None = None  # how the grafted state is known: local / replayed / signed:<key name>
    verified: bool = False  # the stored answer for this question was vouched for
    verified_by: str | None = None  # who vouched: checker:<name>, generator:<name>, signer:<key name>, you
    stored_answer: str | None = None  # a stored answer nobody vouched for (stated by its author)
    answer_ready: bool = False  # grafted the solution's answer-ready state (text + question but its last token)
    ttft_ms: float | None = None  # from the call to the first answer token
    prompt_format: str = QA_FORMAT  # how a fresh question was put: "qa-v1" (app/prompts.py) or the model's template
    title: str | None = None  # "retrieved": the document's title
    score: float | None = None  # the best-ranked document's BM25 score (retrieved, or not grafted: below coverage)
    coverage: float | None = None  # the share of the question's content words it contains (IDF-weighted)
    runners_up: list = field(default_factory=list)  # the other ranked documents: entry_id, title, score
    section: dict | None = None  # retrieved/prefix from a deposited file: {file, section, sections, heading}
    matched_question: str | None = None  # a retrieved solution: the stored question it was worked for
    wording: float | None = None  # a retrieved solution: the share of the question's non-number words it holds
    matched_verified_by: str | None = None  # a retrieved solution: who vouched for its stored question's answer

    def as_dict(self) -> dict:
        return asdict(self)

    def provenance(self) -> str:
        """One line in plain words, for people: where the answer came from, its proof, who vouched, exact or not."""
        if self.source == "fresh":
            below = (
                f" (no stored document covers the question: best #{self.runners_up[0]['entry_id']} covers "
                f"{self.coverage:.0%} of its words, {RETRIEVAL_MIN_COVERAGE:.0%} needed)"
                if self.coverage is not None and self.runners_up
                else ""
            )
            return f"fresh{below} - {self.tokens_prefilled:,} tokens prefilled - {self.tokens_decoded} decoded"
        if self.source == "graft":
            what = f"entry #{self.entry_id}"
        elif self.source == "retrieved" and self.matched_question is not None:
            what = (
                f'solution #{self.entry_id}, worked for "{self.matched_question}" (retrieved: the same numbers, '
                f"{self.wording:.0%} of the question's other words, score {self.score:.1f})"
            )
        elif self.source == "retrieved":
            what = (
                f'document #{self.entry_id} "{self.title}"{self._where()} (retrieved: covers {self.coverage:.0%} of '
                f"the question's words, score {self.score:.1f})"
            )
        else:
            what = f"stored prefix #{self.entry_id}{self._where()}"
        origin = f"proof {self.proof}"
        if self.source == "graft":
            origin += f", answer verified by {self.verified_by}" if self.verified else ", answer not verified"
        elif self.matched_question is not None:
            origin += (
                f", its stored question's answer {self.stored_answer} verified by {self.matched_verified_by}"
                if self.matched_verified_by
                else f", its stored question's answer {self.stored_answer} not verified"
            )
        if self.exact is True:
            exact = "exact: logits equal the fresh run's in its receipt"
        elif self.exact is False:
            exact = "NOT exact: logits differ from the fresh run's in its receipt"
        else:
            exact = "exact restore, not compared"
        rest = f" - {self.tokens_prefilled:,} prefilled" if self.source in ("prefix", "retrieved") else ""
        if self.answer_ready:
            origin += ", its answer-ready state: 1 token decoded before the answer"
        return (
            f"from {what} ({origin}) - {self.tokens_restored:,} tokens restored in {self.graft_ms:.0f} ms - "
            f"{exact}{rest} - "
            f"{self.tokens_decoded} tokens decoded"
        )

    def _where(self) -> str:
        """ " in doc.md, section 3 of 12" for an entry deposited from a file, else nothing."""
        if not self.section:
            return ""
        name = Path(self.section["file"]).name
        n, of = self.section["section"], self.section["sections"]
        part = f"section {n} of {of}"
        return f" in {name}" + (f", {part}" if of > 1 and part not in (self.title or "") else "")


def _section(lib, entry_id: int | None) -> dict | None:
    ref = lib.section_of(entry_id) if entry_id is not None else None
    return ref.as_dict() if ref is not None else None


def _compare_with_receipt(session, entry, continuation) -> bool | None:
    """True/False when `continuation` is the entry's receipt probe (logits compared), None otherwise."""
    r = entry.receipt
    if not r or r.get("probe_tokens_sha256") != tokens_sha256(continuation) or not r.get("fresh_logits_sha256"):
        return None
    return logits_sha256(session.logits()) == r["fresh_logits_sha256"]


def ask(
    service: LibraryService,
    question: str,
    context: str | None = None,
    budget: int = 128,
    use_library: bool = True,
    on_token: Callable[[int, str], bool | None] | None = None,
    retrieve: bool = True,
) -> AskResult:
    """Answer `question`: by graft from a proven entry stored for it; else, unless `retrieve` is False,
    from the stored document that ranks best for it (if it covers RETRIEVAL_MIN_COVERAGE of the question); else a stored
    prefix of `context` or of the fresh prompt; else fresh."""
    engine, lib = service.engine, service.library
    fp = engine.fingerprint
    model = engine.model
    t0 = time.perf_counter()
    if not question.strip():
        raise ValueError("the question is empty")
    entry = lib.find_question(question, fp) if (use_library and context is None) else None
    words = {
        "verified": bool(entry and entry.verified),
        "verified_by": entry.vouched_by if entry and entry.verified else None,
        "stored_answer": entry.answer if entry is not None and not entry.verified else None,
    }
    verified = entry.answer if entry is not None and entry.verified else None
    checker = get_checker((entry.checker if entry is not None else None) or "numeric")

    if entry is not None and entry.graftable(fp):
        suffix = model.tokenize(ask_suffix(question), add_bos=False)
        ready = service.answer_ready(entry, suffix)  # None when asked in other words than the stored question
        with service.session() as s:
            g = None
            if ready is not None:  # graft the text and question but one token, decode that one token
                try:
                    g, ref, rest = service.graft(s, ready), ready, suffix[-1:]
                except (BlobMissing, BlobCorrupt, BlobUnreadable) as exc:  # marked damaged: the text-only state serves
                    log.warning(
                        "answer-ready state #%d unusable (%s): answering from entry #%d", ready.id, exc, entry.id
                    )
                    ready = None
            if g is None:  # graft the text, decode the question suffix (in the calls its receipt recorded)
                g, ref, rest = service.graft(s, entry), entry, suffix
            decode_in_calls(s, rest, _receipt_calls(ref, rest))
            receipt_match = _compare_with_receipt(s, ref, rest)
            gen = s.generate(GRAFT_ANSWER_TOKENS, stop=["\n"], on_token=on_token)
        answer = gen.text.strip()
        return AskResult(
            question,
            answer,
            verified,
            checker(answer, verified) if verified is not None else None,
            "graft",
            entry.id,
            g.n_tokens,
            g.total_ms,
            len(rest),
            len(gen.tokens),
            receipt_match,
            receipt_match,
            (time.perf_counter() - t0) * 1e3,
            gen.stop_reason,
            proof=ref.proof,
            answer_ready=ready is not None,
            ttft_ms=_ttft(gen, t0),
            **words,
        )

    ranked = lib.rank_documents(question, fp) if (use_library and retrieve and context is None) else []
    best = ranked[0] if ranked else None
    runners_up = [_ranked_dict(r) for r in ranked[1:]]
    suffix = model.tokenize("\n" + ask_suffix(question), add_bos=False)
    if best is not None and best.coverage >= RETRIEVAL_MIN_COVERAGE:
        doc = best.entry
        if doc.n_tokens + len(suffix) + budget <= engine.config.n_ctx:
            return _answer_retrieved(
                service, question, doc, suffix, budget, on_token, t0, best, runners_up, section=_section(lib, doc.id)
            )

    sol = _solution_for(lib, question, fp) if (use_library and retrieve and context is None) else None
    if sol is not None:
        e, sol_ranked = sol
        suffix = model.tokenize(ask_suffix(question), add_bos=False)
        if e.n_tokens + len(suffix) + GRAFT_ANSWER_TOKENS <= engine.config.n_ctx:
            # the stored answer was vouched for the stored question; this question only matched it (same
            # numbers, enough words): nobody vouched for this question's answer, so it is not "verified"
            return _answer_retrieved(
                service,
                question,
                e,
                suffix,
                GRAFT_ANSWER_TOKENS,
                on_token,
                t0,
                sol_ranked[0],
                [_ranked_dict(r) for r in sol_ranked[1:]],
                stored_answer=e.answer,
                matched_verified_by=e.vouched_by if e.verified else None,
                matched_question=e.question,
                wording=round(sol_ranked[0].wording, 3),
            )

    fmt = ChatFormat.for_model(model)
    if context is not None:
        prompt = model.tokenize(context) + model.tokenize("\n" + ask_suffix(question), add_bos=False)
        stop = ["\n"]
    elif fmt.template is not None:  # an instruct model: the question as its chat template puts a user turn
        prompt = fmt.first(model, None, question, after_state=False)
        stop = []  # it ends its turn with an end-of-generation token
        checker = get_checker("final_number") if checker is get_checker("numeric") else checker
    else:
        prompt = model.tokenize(fresh_prompt(question))
        stop = ["\nQ:"]
        checker = get_checker("final_number") if checker is get_checker("numeric") else checker
    # at least the prompt's last token is always decoded here, so logits exist to start from
    prefix = lib.longest_prefix(prompt[:-1], fp) if use_library and len(prompt) > 1 else None
    receipt_match = None
    with service.session() as s:
        if prefix is not None:
            g = service.graft(s, prefix)
            rest = prompt[prefix.n_tokens :]
            decode_in_calls(s, rest, _receipt_calls(prefix, rest))
            receipt_match = _compare_with_receipt(s, prefix, rest)
            source, restored, graft_ms, prefilled = "prefix", g.n_tokens, g.total_ms, len(rest)
        else:
            s.prefill(prompt)
            source, restored, graft_ms, prefilled = "fresh", 0, None, len(prompt)
        gen = s.generate(budget, stop=stop, on_token=on_token)
    answer = gen.text.strip()
    return AskResult(
        question,
        answer,
        verified,
        checker(answer, verified) if verified is not None else None,
        source,
        prefix.id if source == "prefix" else None,
        restored,
        graft_ms,
        prefilled,
        len(gen.tokens),
        receipt_match,
        receipt_match,
        (time.perf_counter() - t0) * 1e3,
        gen.stop_reason,
        proof=prefix.proof if source == "prefix" else None,
        ttft_ms=_ttft(gen, t0),
        prompt_format=fmt.name if (context is None and fmt.template is not None) else QA_FORMAT,
        score=round(best.score, 3) if best is not None else None,
        coverage=round(best.coverage, 3) if best is not None else None,
        runners_up=[_ranked_dict(r) for r in ranked],
        section=_section(lib, prefix.id) if source == "prefix" else None,
        **words,
    )


def _answer_retrieved(service, question, entry, suffix, budget, on_token, t0, ranked, runners_up, **extra) -> AskResult:
    """Graft the retrieved entry at its own positions (exact), prefill the question after it, answer
    up to the newline. Its stored answer is not this question's: nothing here is "verified"."""
    with service.session() as s:
        g = service.graft(s, entry)
        s.prefill(suffix)
        gen = s.generate(budget, stop=["\n"], on_token=on_token)
    return AskResult(
        question,
        gen.text.strip(),
        None,
        None,
        "retrieved",
        entry.id,
        g.n_tokens,
        g.total_ms,
        len(suffix),
        len(gen.tokens),
        None,
        None,
        (time.perf_counter() - t0) * 1e3,
        gen.stop_reason,
        proof=entry.proof,
        ttft_ms=_ttft(gen, t0),
        title=entry.title,
        score=round(ranked.score, 3),
        coverage=round(ranked.coverage, 3),
        runners_up=runners_up,
        **extra,
    )


def _solution_for(lib, question: str, fingerprint: str):
    """(the worked solution to graft for `question`, the solutions ranked with it first), or None: the
    best-ranked solution whose stored question states the same numbers, if it covers enough."""
    ranked = lib.rank_solutions(question, fingerprint)
    for k, r in enumerate(ranked):
        if same_numbers(question, r.entry.question or "") and r.wording >= SOLUTION_MIN_WORDING:
            return r.entry, [r] + ranked[:k] + ranked[k + 1 :]
    return None


def _receipt_calls(entry, continuation) -> list[int] | None:
    """The decode calls the entry's receipt used for this continuation (so the comparison is in the
    same schedule), or None (one call) when the receipt is for another continuation."""
    r = entry.receipt or {}
    calls = r.get("probe_calls")
    if r.get("probe_tokens_sha256") != tokens_sha256(continuation) or not isinstance(calls, list):
        return None
    return calls if sum(calls) == len(continuation) and all(isinstance(c, int) and c >= 1 for c in calls) else None


def _ttft(gen, t0: float) -> float | None:
    """Milliseconds from the call to the first answer token (None when none was decoded)."""
    return (gen.first_token_at - t0) * 1e3 if gen.first_token_at else None
