"""Greedy decoding with prompt-lookup drafts on the real model (engine/lookup_decode.py): a lookup-decoded
answer replays bit for bit in its recorded calls, and a wrong draft is rejected. Whether its tokens equal
plain greedy's is not asserted (argmax near-ties can differ between batch shapes): it is counted."""

from __future__ import annotations

import hashlib

from kvgraft.engine.lookup import NgramIndex
from kvgraft.engine.lookup_decode import feed, generate_lookup, replay_calls

CONTEXT = (
    "Inventory note. The spare parts shelf holds: 14 bolts, 9 washers, 31 hinges, 6 brackets.\n"
    "Question: What does the spare parts shelf hold?\nAnswer: The spare parts shelf holds:"
)


def _state_sha(session) -> str:
    data, _ = session.canonical_state()
    return hashlib.sha256(data).hexdigest()


def test_a_lookup_decoded_answer_replays_bit_for_bit_in_its_recorded_calls(engine):
    toks = engine.model.tokenize(CONTEXT, add_bos=True)
    with engine.session() as s:
        s.prefill(toks)
        gen = generate_lookup(s, NgramIndex(toks), max_tokens=24, k=8)
        after = _state_sha(s)
        n_past = s.n_past
    assert gen.tokens and gen.calls
    assert sum(c["kept"] for c in gen.calls) == len(gen.tokens)
    assert all(1 <= c["kept"] <= len(c["fed"]) for c in gen.calls)
    assert n_past == len(toks) + len(gen.tokens)
    with engine.session() as s:
        s.prefill(toks)
        kept = replay_calls(s, gen.calls)
        assert kept == gen.tokens
        assert _state_sha(s) == after, "the replay of the recorded calls made other cells"
        last = gen.calls[-1]
    with engine.session() as s:  # and the choice after the last kept token, from the replayed logits
        s.prefill(toks)
        replay_calls(s, gen.calls[:-1])
        argmax, _ = feed(s, last["fed"], keep=last["kept"])
        assert argmax[last["kept"] - 1] == gen.next_token
    with engine.session() as s:  # plain greedy, one token per call: counted, not asserted equal
        s.prefill(toks)
        plain = s.generate(len(gen.tokens)).tokens
    differing = sum(a != b for a, b in zip(plain, gen.tokens, strict=False))
    print(f"lookup: {len(gen.tokens)} tokens in {len(gen.calls)} calls; {differing} differ from plain greedy")


def test_a_wrong_draft_is_rejected_and_leaves_only_the_chosen_token(engine):
    toks = engine.model.tokenize(CONTEXT, add_bos=True)
    n_vocab = engine.model.info.n_vocab
    with engine.session() as s:
        s.prefill(toks)
        chosen = int(s.logits().argmax())
        with engine.session() as probe:  # what the model picks after `chosen`, so the draft surely disagrees
            probe.prefill(toks + [chosen])
            wrong = (int(probe.logits().argmax()) + 1) % n_vocab
        argmax, kept = feed(s, [chosen, wrong, wrong])
        assert argmax[0] != wrong
        assert kept == 1
        assert s.n_past == len(toks) + 1 and s.tokens[-1] == chosen
