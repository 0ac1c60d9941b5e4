"""Questions in a person's own words (app/answer/reading.py): the model's reading decides which document
is grafted. The real Gemma 3 270M, real llama.cpp, a real SQLite index; invented names, so the model
cannot know the facts without the documents, and the questions repeat no sentence of them."""

from __future__ import annotations

import pytest

from kvgraft.app.answer.ask import ask
from kvgraft.app.answer.reading import Reading, Verdict
from kvgraft.app.answer.thresholds import READ_MIN_GAIN, READ_MIN_MARGIN
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.service import LibraryService, open_library

PLACES = {  # each names other places in passing, as real texts mention each other
    "Belmor": "The harbor master of Belmor is Velka Dorian.",
    "Ashdunash": "The town of Ashdunash was first recorded in the year 1762.",
    "Quistan": "The river that runs through Quistan is called the Lysora.",
    "Torvenmi": "The head brewer of Torvenmi is Salka Ostrun.",
}
NEAR = {  # one place, two years, another person in the same role
    1788: "In the year 1788 the bridge warden of Kolysfe was Ren Adpamar.",
    1852: "In the year 1852 the bridge warden of Kolysfe was Mika Thuvelos.",
}


def _text(title: str, fact: str, k: int, mention: str = "") -> str:
    return f"{title}\n\n{synthetic_text(140, k)}\n\n{fact} {mention}\n\n{synthetic_text(100, k + 50)}"


@pytest.fixture(scope="module")
def library(engine, tmp_path_factory):
    lib = open_library(tmp_path_factory.mktemp("reading") / "home")
    service = LibraryService(engine, lib)
    ids, names = {}, list(PLACES)
    for k, (place, fact) in enumerate(PLACES.items()):
        others = [p for p in names if p != place][:3]
        mention = f"Traders from {others[0]}, {others[1]} and {others[2]} come to the market here every spring."
        title = f"Survey notes on {place}"
        ids[place] = service.deposit(_text(title, fact, k, mention), kind="document", title=title).entry.id
    for k, (year, fact) in enumerate(NEAR.items()):
        title = f"Survey notes on Kolysfe, {year}"
        ids[year] = service.deposit(_text(title, fact, 20 + k), kind="document", title=title).entry.id
    yield service, ids
    service.close()
    lib.close()


def test_a_paraphrase_is_answered_from_the_document_the_model_reads_it_in(library):
    service, ids = library
    q = "Who is in charge of the port at Belmor?"  # the document says "harbor master"
    words = ask(service, q, budget=8, rule="words")
    assert words.source == "fresh"  # its words cover too little of the question: the rule before refused it
    r = ask(service, q, budget=8)
    assert (r.source, r.entry_id) == ("retrieved", ids["Belmor"])
    assert r.gain >= READ_MIN_GAIN and r.gain > r.next_gain
    assert r.tokens_restored == service.library.get(ids["Belmor"]).n_tokens  # the whole document, grafted
    assert f"raises the question's likelihood by {r.gain:+.2f} nats/token, next best {r.next_gain:+.2f}" in (
        r.provenance()
    )
    assert r.runners_up and r.runners_up[0]["gain"] == r.next_gain


def test_a_question_about_an_absent_name_is_refused_and_says_why(library):
    service, _ids = library
    r = ask(service, "Who is the harbor master of Zelgrimar?", budget=4)
    assert r.source == "fresh" and r.entry_id is None
    assert r.runners_up, "the harbor master's document shares words with it: the model read a candidate"
    # the Belmor document explains "harbor master" well; it does not hold the name the question asks about
    assert r.not_grafted.startswith('no stored document explains the question: it names "Zelgrimar"')
    assert f"raises the question's likelihood by {r.gain:+.2f} nats/token" in r.not_grafted
    assert r.not_grafted in r.provenance()
    assert r.runners_up[0]["unheld"] == ["Zelgrimar"]


@pytest.mark.parametrize("year", sorted(NEAR))
def test_a_near_duplicate_is_resolved_by_the_year_asked(library, year):
    service, ids = library
    r = ask(service, f"Who guarded the crossing over the water at Kolysfe in {year}?", budget=4)
    assert (r.source, r.entry_id) == ("retrieved", ids[year])
    assert r.gain is not None  # the model's reading decided, not the words


def test_the_rule_is_one_of_the_known_ones(library):
    service, _ids = library
    with pytest.raises(ValueError, match="unknown rule"):
        ask(service, "Who is in charge of the port at Belmor?", rule="vibes")


class _Entry:
    def __init__(self, i):
        self.id, self.title = i, f"doc {i}"


class _Ranked:
    def __init__(self, i):
        self.entry, self.score = _Entry(i), 1.0


def _verdict(*gains, first: int = 0):
    """Readings of candidates #1, #2, ... with these gains; BM25 ranked candidate #first+1 first."""
    ranked = [_Ranked(i + 1) for i in range(len(gains))]
    readings = sorted((Reading(r, g) for r, g in zip(ranked, gains, strict=True)), key=lambda x: -x.gain)
    return Verdict(readings, None, ranked[first] if ranked else None)


def test_the_verdict_needs_a_gain_and_agreement_or_a_lead():
    assert _verdict(READ_MIN_GAIN + 0.5, READ_MIN_GAIN - 0.5).accepted
    assert _verdict(READ_MIN_GAIN + 0.01).accepted  # one candidate: its gain alone decides
    low = _verdict(READ_MIN_GAIN - 0.01, -1.0)
    assert not low.accepted and low.why_not().startswith("no stored document explains the question: best #1")
    # the model's best is BM25's first: the words and the reading agree, no lead is needed
    assert _verdict(1.5, 1.49).accepted
    # they disagree: the model's best must lead BM25's first clearly
    assert _verdict(1.5, 1.5 + READ_MIN_MARGIN + 0.01).accepted
    close = _verdict(1.5, 1.5 + READ_MIN_MARGIN / 2)
    assert not close.accepted
    assert close.why_not().startswith("no stored document clearly explains the question: best #2")
    assert "the words' first choice #1 +1.50" in close.why_not()
    assert not _verdict().accepted and "fits the context" in _verdict().why_not()
    unheld = Verdict([Reading(_Ranked(1), 3.0, ("Zelgrimar",))], None, None)
    assert not unheld.accepted and 'it names "Zelgrimar", which best #1' in unheld.why_not()
