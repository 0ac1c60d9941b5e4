"""The sampler's fields (engine/sampling.py) against llama.cpp's own samplers, on the real model's logits.

top-k, top-p, min-p and the repeat penalties keep the same candidates and give the same penalized logits
as llama.cpp's `llama_sampler_init_*` applied to the same logits after the same tokens (engine/peers.py);
a penalty changes a greedy answer that repeats itself; a penalized answer is the same with prompt lookup
asked for (it decodes one token per call) and the same seeded answer comes back on a second run.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvgraft.engine.errors import EngineError
from kvgraft.engine.peers import llama_cpp_candidates
from kvgraft.engine.sampling import Sampler, SamplingParams

TEXT = "The tide comes in. The tide goes out. The tide comes in. The tide goes out. The tide"
PARAMS = [
    SamplingParams(temperature=1.0, top_k=40),
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=0.7, top_k=50, top_p=0.95, min_p=0.02),
    SamplingParams(temperature=1.0, repeat_penalty=1.3, top_k=20),
    SamplingParams(
        temperature=1.0, repeat_penalty=0.8, frequency_penalty=0.5, presence_penalty=-0.3, repeat_last_n=8, min_p=0.1
    ),
    SamplingParams(temperature=1.0, repeat_penalty=1.1, repeat_last_n=-1, top_p=0.5),
]


@pytest.fixture(scope="module")
def steps(engine):
    """Real logits at a few positions of a repetitive text, and the tokens before each."""
    toks = engine.model.tokenize(TEXT)
    out = []
    with engine.session() as s:
        s.prefill(toks[:-4])
        for i in range(len(toks) - 4, len(toks)):
            out.append((s.logits().copy(), toks[1:i]))  # what came before (without the BOS)
            s.decode_one(toks[i])
    return out


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"k{p.top_k}-p{p.top_p}-m{p.min_p}-r{p.repeat_penalty}")
def test_the_candidates_and_penalties_are_llama_cpps(steps, params):
    for logits, before in steps:
        sampler = Sampler(params)
        for t in before:
            sampler.accept(t)
        ids, _ = sampler.candidates(logits)
        ref_ids, ref_penalized = llama_cpp_candidates(logits, params, before)
        assert sorted(ids.tolist()) == sorted(ref_ids)
        assert 0 < len(ids) < len(logits)
        np.testing.assert_allclose(sampler.penalized(logits), ref_penalized, rtol=1e-6, atol=1e-6)
        if params.penalized:
            assert not np.array_equal(sampler.penalized(logits), logits), "the penalties changed nothing"
            greedy = Sampler(replace(params, temperature=0.0))
            for t in before:
                greedy.accept(t)
            assert greedy.choose(logits) == int(np.argmax(ref_penalized))


def test_a_penalty_changes_a_greedy_answer_that_repeats_and_lookup_does_not_change_it(engine):
    toks = engine.model.tokenize(TEXT)

    def answer(params: SamplingParams, lookup: int) -> list[int]:
        with engine.session() as s:
            s.prefill(toks)
            return s.generate(24, sampler=Sampler(params), lookup=lookup, stop_at_eog=False).tokens

    plain = answer(SamplingParams(), 0)
    penalized = SamplingParams(repeat_penalty=1.5, frequency_penalty=0.3)
    once = answer(penalized, 0)
    assert once != plain
    assert answer(penalized, 4) == once  # lookup asked for: one token per call, the same choices
    # the penalty pushed every repeated token down: fewer distinct-token repeats than greedy's
    assert len(set(once)) > len(set(plain))
    seeded = SamplingParams(temperature=0.8, top_k=30, min_p=0.05, repeat_penalty=1.2, seed=11)
    assert answer(seeded, 0) == answer(seeded, 0)
    top1 = SamplingParams(temperature=1.0, top_k=1, seed=3)  # one candidate: the argmax, whatever the draw
    assert answer(top1, 0) == plain


def test_bad_sampler_fields_are_refused():
    for bad in ({"top_k": -1}, {"min_p": 1.5}, {"repeat_penalty": 0}, {"frequency_penalty": 3}, {"repeat_last_n": -2}):
        with pytest.raises(EngineError):
            SamplingParams(**bad)
