"""Questions answered from the right stored document (library/retrieval.py, app/answer/ask.py), on a synthetic
model through real llama.cpp and a real SQLite index: the ranking, the coverage threshold, what is
never retrieved. Whether the answers are right is scripts/library_qa.py's job (the real model)."""

from __future__ import annotations

import pytest

import kvgraft.app.answer.ask as ask_mod
from kvgraft.app.answer.ask import ask
from kvgraft.app.core.model_store import model_sha256
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
from kvgraft.library.retrieval import content_terms
from scripts.synthetic_gguf import write_synthetic_gguf

FACTS = [
    ("Zelbelpa", "The head brewer of Zelbelpa is Mira Torquist."),
    ("Belvelthu", "The town of Belvelthu was founded in the year 1433."),
    ("Paquka", "The river that runs through Paquka is called the Osrenmi."),
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = write_synthetic_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", "llama", seed=11)
    eng = Engine.load(EngineConfig(model_path=path, n_ctx=2048), model_sha256(path))
    yield eng
    eng.close()


@pytest.fixture
def library(engine, tmp_path):
    lib = open_library(tmp_path / "home")
    service = LibraryService(engine, lib)
    ids = {}
    for k, (place, fact) in enumerate(FACTS):
        text = f"Survey notes on {place}\n\n{synthetic_text(150, k)}\n\n{fact}\n\n{synthetic_text(100, k + 10)}"
        ids[place] = service.deposit(text, kind="document", title=f"Survey notes on {place}").entry.id
    yield service, lib, ids
    service.close()
    lib.close()


def test_content_terms_drop_stopwords():
    assert content_terms("Who is the head brewer of Zelbelpa?") == ["head", "brewer", "zelbelpa"]
    assert content_terms("What is it?") == []


def test_a_question_is_answered_from_the_document_that_holds_it(library):
    service, lib, ids = library
    r = ask(service, "Who is the head brewer of Zelbelpa?", budget=4)
    assert (r.source, r.entry_id) == ("retrieved", ids["Zelbelpa"])
    assert r.coverage == 1.0 and r.title == "Survey notes on Zelbelpa"
    assert r.tokens_restored == lib.get(ids["Zelbelpa"]).n_tokens  # the whole document, grafted
    assert 'document #%d "Survey notes on Zelbelpa" (retrieved' % ids["Zelbelpa"] in r.provenance()
    other = ask(service, "In what year was Belvelthu founded?", budget=4)
    assert (other.source, other.entry_id) == ("retrieved", ids["Belvelthu"])
    # "year", "founded" and "town" are in one document only here; the runners-up are ranked below it
    assert all(x["coverage"] < other.coverage for x in other.runners_up)


def test_a_question_about_an_absent_name_is_answered_fresh_and_says_so(library):
    """The words rule (the real model's reading of such a question: tests/test_reading.py)."""
    service, _lib, _ids = library
    r = ask(service, "Who is the head brewer of Marlystor?", budget=4, rule="words")
    assert r.source == "fresh" and r.coverage is not None and r.coverage < ask_mod.RETRIEVAL_MIN_COVERAGE
    assert "no stored document covers the question" in r.provenance()
    assert ask(service, "What is the capital of France?", budget=4).source == "fresh"


def test_the_threshold_and_the_switches(library, monkeypatch):
    service, _lib, ids = library
    q = "What is the river that runs through Paquka called?"
    assert ask(service, q, budget=2).entry_id == ids["Paquka"]
    assert ask(service, q, budget=2, retrieve=False).source == "fresh"
    assert ask(service, q, budget=2, use_library=False).source == "fresh"
    monkeypatch.setattr(ask_mod, "RETRIEVAL_MIN_COVERAGE", 1.01)
    assert ask(service, q, budget=2, rule="words").source == "fresh"


def test_unproven_documents_and_solutions_are_never_retrieved(library):
    service, lib, ids = library
    fp = service.engine.fingerprint
    lib.set_proof(ids["Zelbelpa"], "unproven", fp)
    assert ask(service, "Who is the head brewer of Zelbelpa?", budget=2).source == "fresh"
    service.deposit_solution("How many pumps does Quorvane keep?", "Quorvane keeps 4 pumps and 3 spares.", "7")
    r = ask(service, "Quorvane pumps and spares in all?", budget=2)
    assert r.source == "fresh"  # a solution is found by its question, never by retrieval


def test_provenance_words_for_every_source():
    """Each source's words are built only from its own fields (a prefix answer has no coverage)."""
    from kvgraft.app.answer.ask import AskResult

    base = dict(verified_answer=None, answer_checked=None, tokens_restored=10, graft_ms=1.0, tokens_prefilled=3)
    base |= dict(tokens_decoded=2, exact=None, receipt_match=None, wall_ms=5.0, stop_reason="eog", proof="local")
    for source in ("graft", "prefix", "fresh"):
        r = AskResult("q", "a", source=source, entry_id=1, **base)
        assert r.provenance()
    r = AskResult("q", "a", source="retrieved", entry_id=1, title="T", score=1.5, coverage=0.9, **base)
    assert 'document #1 "T" (retrieved: covers 90%' in r.provenance()


def test_a_solution_is_retrieved_only_for_the_same_numbers_and_enough_words(engine, tmp_path, monkeypatch):
    from kvgraft.app.lab.starter_problems import GENERATOR, starter_problems
    from scripts.solution_qa import decoy, paraphrase

    problems = sorted(starter_problems(12, seed=5), key=lambda p: len(p.solution))[:2]
    lib = open_library(tmp_path / "sol")
    service = LibraryService(engine, lib)
    try:
        ids = [
            service.deposit_solution(p.question, p.solution, p.answer, vouched_by=GENERATOR).entry.id for p in problems
        ]
        q = paraphrase(problems[0].question, 1)
        r = ask(service, q, budget=2)
        assert (r.source, r.entry_id, r.matched_question) == ("retrieved", ids[0], problems[0].question)
        # vouched for the stored question, not for this one: reported as the stored question's, not "verified"
        assert not r.verified and r.verified_answer is None and r.answer_checked is None
        assert (r.stored_answer, r.matched_verified_by) == (problems[0].answer, GENERATOR)
        assert f"its stored question's answer {problems[0].answer} verified by {GENERATOR}" in r.provenance()
        assert f'solution #{ids[0]}, worked for "{problems[0].question}" (retrieved: the same numbers' in r.provenance()
        # the same template with other numbers is another problem: its sibling's solution is never grafted
        sibling = starter_problems(12, seed=6)[0].question
        assert ask(service, sibling, budget=2).source == "fresh"
        # the same numbers in another question: too few of its words are in the solution
        assert ask(service, decoy(problems[0].question), budget=2).source == "fresh"
        monkeypatch.setattr(ask_mod, "SOLUTION_MIN_WORDING", 1.01)
        assert ask(service, q, budget=2).source == "fresh"
    finally:
        service.close()
        lib.close()
