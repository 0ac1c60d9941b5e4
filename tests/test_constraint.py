"""Constrained decoding (engine/constraint.py) in the one decode loop, on the real Gemma 3 270M: the
answer matches its grammar, ends only where the grammar accepts, replays to the same tokens, and leaves
a context whose logits are bit-identical to a fresh prefill of the same tokens."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from kvgraft.engine.constraint import Grammar, GrammarError, vocabulary
from kvgraft.engine.errors import EngineError
from kvgraft.engine.sampling import Sampler, SamplingParams

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "admin": {"type": "boolean"}},
    "required": ["name", "admin"],
    "additionalProperties": False,
}
PROMPT = "User: Describe the harbor master as a JSON object.\nAssistant:"


def _answer(engine, grammar, prompt=PROMPT, **kw):
    s = engine.session()
    try:
        s.prefill(engine.model.tokenize(prompt, True))
        return s.generate(kw.pop("max_tokens", 60), constraint=grammar.matcher(), **kw)
    finally:
        s.close()


def test_a_schema_constrained_answer_parses_validates_and_replays(engine):
    grammar = Grammar.json_schema(engine.model, PERSON)
    gen = _answer(engine, grammar)
    assert gen.stop_reason in ("eog", "grammar"), gen.text
    jsonschema.validate(json.loads(gen.text), PERSON)
    assert gen.constraint == grammar.sha256
    again = _answer(engine, grammar)
    assert again.tokens == gen.tokens  # the same grammar, prompt and (greedy) sampling: the same choices
    sampled = [
        _answer(engine, grammar, sampler=Sampler(SamplingParams(temperature=1.0, seed=7))).tokens for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_a_constrained_answer_leaves_the_bits_a_fresh_computation_of_its_tokens_makes(engine):
    grammar = Grammar.json_schema(engine.model, PERSON)
    prompt = engine.model.tokenize(PROMPT, True)
    s = engine.session()
    try:
        s.prefill(prompt)
        gen = s.generate(60, constraint=grammar.matcher())
        assert gen.stop_reason in ("grammar", "eog"), gen.text
        if gen.stop_reason == "grammar":  # the last choice ended it before it was decoded
            s.decode_one(gen.tokens[-1])
        assert s.n_past == len(prompt) + len(gen.tokens)
        after = s.logits().copy()
    finally:
        s.close()
    fresh = engine.session()  # the same tokens, no grammar, in the same calls
    try:
        fresh.prefill(prompt)
        for t in gen.tokens:
            fresh.decode_one(t)
        assert np.array_equal(fresh.logits(), after)
    finally:
        fresh.close()
    if engine.batch_invariant:  # and on the invariant build, in one prefill
        one = engine.session()
        try:
            one.prefill(prompt + gen.tokens)
            assert np.array_equal(one.logits(), after)
        finally:
            one.close()


def test_the_answer_ends_only_where_the_grammar_accepts(engine):
    grammar = Grammar.lark(engine.model, 'start: "The answer is " ("yes" | "no") "."')
    gen = _answer(engine, grammar, prompt="Question: Is the sea salty?\nAnswer:", max_tokens=20)
    assert gen.text in ("The answer is yes.", "The answer is no."), gen.text
    assert gen.stop_reason in ("grammar", "eog")


def test_lookup_decoding_is_off_under_a_constraint(engine):
    grammar = Grammar.json_schema(engine.model, {"type": "array", "items": {"type": "integer", "maximum": 9}})
    text = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9]"
    gen = _answer(engine, grammar, prompt=f"{text}\n{text}\n", max_tokens=30, lookup=8)
    assert gen.calls and all(c == 1 for c in gen.calls)  # one token per call: never a verify call
    assert gen.text.startswith("[")


def test_a_schema_llguidance_cannot_compile_is_a_typed_error(engine):
    with pytest.raises(GrammarError, match="strin"):
        Grammar.json_schema(engine.model, {"type": "object", "properties": {"a": {"type": "strin"}}})
    with pytest.raises(GrammarError):
        Grammar.lark(engine.model, "start: undefined_rule")
    with pytest.raises(GrammarError):
        Grammar.json_schema(engine.model, ["not", "an", "object"])


def test_the_vocabulary_marks_control_tokens_and_is_built_once(engine):
    tok = vocabulary(engine.model)
    assert tok is vocabulary(engine.model)
    assert tok.vocab_size == engine.model.info.n_vocab
    assert tok.is_special_token(engine.model.bos) and not tok.is_special_token(
        engine.model.tokenize("harbor", False)[0]
    )
    assert all(engine.model.is_eog(t) for t in tok.eos_tokens) and tok.eos_tokens


CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "coords": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
    },
    "required": ["city", "population", "tags", "coords"],
}


def test_an_answer_closes_within_any_budget_the_shortest_fits(engine):
    """From the shortest closing the closer finds up to a roomy budget, each answer parses and validates:
    where the model's own choice would leave too little room, the grammar is closed instead."""
    grammar = Grammar.json_schema(engine.model, CITY)
    need = grammar.matcher().shortest(1000)
    assert need is not None and grammar.matcher().shortest(need - 1) is None
    for budget in (need, need + 3, need + 11, 2 * need):
        gen = _answer(engine, grammar, "User: Describe Paris as a JSON object.\nAssistant:", max_tokens=budget)
        assert len(gen.tokens) <= budget
        jsonschema.validate(json.loads(gen.text), CITY)


def test_an_integer_the_schema_leaves_open_fits_int64(engine):
    def writes(schema: dict, digits: str) -> bool:
        c = Grammar.json_schema(engine.model, schema).matcher()
        try:
            for t in engine.model.tokenize(digits, False):
                c.advance(t)
        except EngineError:
            return False
        return True

    assert writes({"type": "integer"}, "9" * 18) and not writes({"type": "integer"}, "9" * 19)  # past 2**63
    own = {"type": "integer", "minimum": 0}
    assert not writes(own, "-5") and writes(own, "9" * 18) and not writes(own, "9" * 19)  # its own bound stands
