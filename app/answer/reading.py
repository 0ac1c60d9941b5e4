"""Which retrieved document explains a question, judged by the model's own reading.

A question in a person's own words shares few words with the document that answers it, so word
overlap cannot say which document that is. The model can: graft a candidate (its exact state, at its
own positions) and prefill the question after it, asking for the logits at the question's positions
(engine/scoring.py). The mean log-probability per question token given the document, minus the same
given no document (BOS and the same tokens), is the document's *gain* in nats per token: how much
reading it makes the question expected. A document about the question's subject raises it; one about
something else leaves it near zero or lowers it.

A mean can be carried by the question's other words: "Who is the harbor master of Zelgrimar?" is
well explained by a document about Belmor's harbor master, though it holds no Zelgrimar. So the
question's **names** must be in the document: a capitalized word of several tokens whose later tokens
the model cannot predict with no document (a mean log-probability below NAME_SURPRISE: an invented or
unknown name; "Middlemarch" or "Python" are known and need no document) must be among the document's
words. A candidate that lacks one is not accepted.

The best candidate is accepted when it holds the question's names and its gain reaches READ_MIN_GAIN;
where the model's best is not BM25's first, it must also lead BM25's first by READ_MIN_MARGIN (two
signals that disagree need a clear lead; documents that mention each other's names in passing read
alike). Else the question is answered fresh and the verdict says why (app/answer/thresholds.py).

Asking for those logits leaves the cache's bits as a plain prefill leaves them (tested in
tests/test_scoring.py; measured by scripts/scored_prefill_bits.py), so the winner's scoring pass is
its answer's prefill when it was the last one scored: candidates are scored in reverse rank order,
the likeliest winner (BM25's first) last.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvgraft.app.answer.thresholds import NAME_SURPRISE, READ_CANDIDATES, READ_MIN_GAIN, READ_MIN_MARGIN
from kvgraft.library.retrieval import surface_words


@dataclass(frozen=True)
class Reading:
    """One candidate as the model read it."""

    ranked: object  # library.retrieval.Ranked
    gain: float  # nats per question token, against no document
    unheld: tuple = ()  # the question's names this document does not hold (see the module doc)

    def as_dict(self) -> dict:
        r = self.ranked
        return {
            "entry_id": r.entry.id,
            "title": r.entry.title,
            "score": round(r.score, 3),
            "gain": round(self.gain, 3),
            "unheld": list(self.unheld),
        }


@dataclass(frozen=True)
class Verdict:
    readings: list  # best gain first
    graft: object | None  # the last candidate's graft result (the session holds it and the question)
    last: object | None  # the Ranked scored last: BM25's first

    @property
    def best(self) -> Reading | None:
        return self.readings[0] if self.readings else None

    @property
    def next_gain(self) -> float | None:
        return self.readings[1].gain if len(self.readings) > 1 else None

    def gains(self) -> dict:
        """The best candidate's gain and the next one's, as AskResult reports them (rounded)."""
        nxt = self.next_gain
        return {
            "gain": round(self.best.gain, 3) if self.best is not None else None,
            "next_gain": round(nxt, 3) if nxt is not None else None,
        }

    @property
    def accepted(self) -> bool:
        b = self.best
        if b is None or b.unheld or b.gain < READ_MIN_GAIN:
            return False
        return b.ranked is self.last or b.gain - self._first_gain() >= READ_MIN_MARGIN

    def _first_gain(self) -> float:
        """The gain of BM25's first candidate (the words' choice)."""
        return next((r.gain for r in self.readings if r.ranked is self.last), float("-inf"))

    def why_not(self) -> str:
        """Why no document was grafted, in words (a refused verdict)."""
        b = self.best
        if b is None:
            return "no candidate document fits the context with the question and the answer"
        head = f"best #{b.ranked.entry.id} raises the question's likelihood by {b.gain:+.2f} nats/token"
        if b.unheld:
            names = ", ".join(f'"{n}"' for n in b.unheld)
            return f"no stored document explains the question: it names {names}, which {head} but does not hold"
        if b.gain < READ_MIN_GAIN:
            return f"no stored document explains the question: {head}, {READ_MIN_GAIN:.2f} needed"
        return (
            f"no stored document clearly explains the question: {head}, the words' first choice "
            f"#{self.last.entry.id} {self._first_gain():+.2f}, a lead of {READ_MIN_MARGIN:.2f} needed"
        )


def question_span(model, suffix: list[int]) -> tuple[int, int]:
    """Where the question's own tokens are in the document suffix ("\\n\\nQ: <question>\\nA:")."""
    head = model.tokenize("\n\nQ:", add_bos=False)
    tail = model.tokenize("\nA:", add_bos=False)
    first = len(head) if suffix[: len(head)] == head else 1
    end = len(suffix) - len(tail) if suffix[-len(tail) :] == tail else len(suffix)
    return (first, end) if first < end else (1, len(suffix))


def names_in(model, tokens: list[int], base: np.ndarray) -> list[str]:
    """The question's names: capitalized words of several tokens whose later tokens the model cannot
    predict with no document (`base`: each token's log-probability, aligned with `tokens`)."""
    words, start = [], 0
    pieces = [model.detokenize([t]) for t in tokens]
    for i in range(1, len(tokens) + 1):
        if i == len(tokens) or pieces[i][:1].isspace() or not pieces[i].strip().isalnum():
            if (
                i - start > 1
                and pieces[start].strip()[:1].isupper()
                and float(np.mean(base[start + 1 : i])) < NAME_SURPRISE
            ):
                words.append("".join(pieces[start:i]).strip())
            start = i
    return words


def _unheld(names: list[str], entry) -> tuple:
    held = surface_words(entry)
    return tuple(n for n in names if n.lower() not in held)


def read_candidates(service, session, candidates: list, suffix: list[int]) -> Verdict:
    """Score `suffix`'s question after no document, then after each candidate (grafted in `session`),
    the first-ranked last; the session is left holding the last candidate and the suffix."""
    model = service.engine.model
    first, end = question_span(model, suffix)
    if not candidates:
        return Verdict([], None, None)
    session.reset(clear_data=False)  # a cleared context computes like a new one (tests/test_warm_context.py)
    base = session.prefill_scored([model.bos, *suffix], first + 1, end + 1)
    names = names_in(model, suffix[first:end], base)
    readings, g = [], None
    for r in reversed(candidates[:READ_CANDIDATES]):
        session.reset(clear_data=False)
        g = service.graft(session, r.entry)
        lp = session.prefill_scored(suffix, first, end)
        readings.append(Reading(r, float(np.mean(lp - base)), _unheld(names, r.entry)))
    readings.sort(key=lambda x: -x.gain)
    return Verdict(readings, g, candidates[0])
