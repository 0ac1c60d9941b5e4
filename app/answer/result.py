"""What `ask` returns: the answer, where it came from, and the words that say so (CLI, window, JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvgraft.app.answer.thresholds import RETRIEVAL_MIN_COVERAGE
from kvgraft.app.proof.prompts import QA_FORMAT


def ranked_dict(r) -> dict:
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
    # True/False: the logits after the graft were compared with a fresh run's (its receipt); None: not compared
    exact: bool | None
    receipt_match: bool | None
    wall_ms: float
    stop_reason: str
    proof: str | None = None  # how the grafted state is known: local / replayed / signed:<key name>
    verified: bool = False  # the stored answer for this question was vouched for
    verified_by: str | None = None  # who vouched: checker:<name>, generator:<name>, signer:<key name>, you
    stored_answer: str | None = None  # a stored answer nobody vouched for (stated by its author)
    answer_ready: bool = False  # grafted the solution's answer-ready state (text + question but its last token)
    ttft_ms: float | None = None  # from the call to the first answer token
    decode_calls: int | None = None  # llama_decode calls the answer took (fewer than tokens: prompt lookup)
    # how a fresh question was put: "qa-v1" (app/proof/prompts.py) or the model's template
    prompt_format: str = QA_FORMAT
    title: str | None = None  # "retrieved": the document's title
    score: float | None = None  # the best-ranked document's BM25 score (retrieved, or not grafted: below coverage)
    coverage: float | None = None  # the share of the question's content words it contains (IDF-weighted)
    runners_up: list = field(default_factory=list)  # the other ranked documents: entry_id, title, score
    # the model's reading (app/answer/reading.py): how much the best candidate (retrieved: the grafted
    # document) raises the likelihood of the question's tokens over no document, nats per token; and
    # the next candidate's. Set where the reading ran (also when it refused the candidates)
    gain: float | None = None
    next_gain: float | None = None
    section: dict | None = None  # retrieved/prefix from a deposited file: {file, section, sections, heading}
    matched_question: str | None = None  # a retrieved solution: the stored question it was worked for
    wording: float | None = None  # a retrieved solution: the share of the question's non-number words it holds
    matched_verified_by: str | None = None  # a retrieved solution: who vouched for its stored question's answer
    # fresh although the library holds candidates: why none was grafted (the model's reading found
    # none that explains the question, or the covering one does not fit the context)
    not_grafted: str | None = None
    # fresh or prefix although entries made under other settings hold the question (app/answer/elsewhere.py):
    # each {entry_id, kind, title, why}; a rebuild for these settings makes them graftable
    made_elsewhere: list = field(default_factory=list)
    # stopped by the caller (Stop in the window, Ctrl-C): the answer is what was decoded until then
    cancelled: bool = field(init=False)
    # a fresh or prefix answer that ended by itself (end of text, a stop string): one a person may vouch
    # for and deposit; never a cancelled one, nor one cut at the token budget (a loop, or unfinished)
    depositable: bool = field(init=False)

    def __post_init__(self) -> None:
        self.cancelled = self.stop_reason == "callback"
        ended = self.stop_reason == "eog" or self.stop_reason.startswith("stop:")
        self.depositable = self.source in ("fresh", "prefix") and ended and bool(self.answer.strip())

    def as_dict(self) -> dict:
        return asdict(self)

    def provenance(self) -> str:
        """One line in plain words, for people: where the answer came from, its proof, who vouched, exact or not."""
        if self.source == "fresh":
            if self.not_grafted:
                below = f" ({self.not_grafted})"
            elif self.coverage is not None and self.runners_up:
                below = (
                    f" (no stored document covers the question: best #{self.runners_up[0]['entry_id']} covers "
                    f"{self.coverage:.0%} of its words, {RETRIEVAL_MIN_COVERAGE:.0%} needed)"
                )
            else:
                below = ""
            stopped = " - stopped" if self.cancelled else ""
            return (
                f"fresh{below} - {self.tokens_prefilled:,} tokens prefilled - {self.tokens_decoded} decoded{stopped}"
                + self.elsewhere_words()
            )
        if self.source == "graft":
            what = f"entry #{self.entry_id}"
        elif self.source == "retrieved" and self.matched_question is not None:
            what = (
                f'solution #{self.entry_id}, worked for "{self.matched_question}" (retrieved: the same numbers, '
                f"{self.wording:.0%} of the question's other words, score {self.score:.1f})"
            )
        elif self.source == "retrieved" and self.gain is not None:
            nxt = f", next best {self.next_gain:+.2f}" if self.next_gain is not None else ""
            what = (
                f'document #{self.entry_id} "{self.title}"{self._where()} (retrieved: the document raises the '
                f"question's likelihood by {self.gain:+.2f} nats/token{nxt})"
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
            exact = "blob hashes checked, logits not compared"
        rest = f" - {self.tokens_prefilled:,} prefilled" if self.source in ("prefix", "retrieved") else ""
        if self.answer_ready:
            origin += ", its answer-ready state: 1 token decoded before the answer"
        return (
            f"from {what} ({origin}) - {self.tokens_restored:,} tokens restored in {self.graft_ms:.0f} ms - "
            f"{exact}{rest} - "
            f"{self.tokens_decoded} tokens decoded" + (" - stopped" if self.cancelled else "") + self.elsewhere_words()
        )

    def elsewhere_words(self) -> str:
        """ " - document #8 holds this but was made with flash attention off: rebuilt ...", else nothing."""
        if not self.made_elsewhere:
            return ""
        said = "; ".join(f"{m['kind']} #{m['entry_id']} holds this but was {m['why']}" for m in self.made_elsewhere[:3])
        more = f" and {len(self.made_elsewhere) - 3} more" if len(self.made_elsewhere) > 3 else ""
        return f" - {said}{more}: rebuilt for these settings, it can be grafted"

    def _where(self) -> str:
        """ " in doc.md, section 3 of 12" for an entry deposited from a file, else nothing."""
        if not self.section:
            return ""
        name = Path(self.section["file"]).name
        n, of = self.section["section"], self.section["sections"]
        part = f"section {n} of {of}"
        return f" in {name}" + (f", {part}" if of > 1 and part not in (self.title or "") else "")
