"""Greedy decoding with prompt-lookup drafts on the real model (engine/lookup_decode.py): a lookup-decoded
answer replays bit for bit in its recorded calls, a generation that ends inside accepted drafts leaves the
context plain decoding would, and a wrong draft is rejected. On a batch-invariant engine its tokens, its
logits and its state are plain greedy's, bit for bit; elsewhere (near-ties can differ between batch shapes)
the differences are counted."""

from __future__ import annotations

import hashlib

import pytest

from kvgraft.engine.errors import Cancelled, EngineError
from kvgraft.engine.lookup_decode import call_size, feed, replay_calls

CONTEXT = (
    "Inventory note. The spare parts shelf holds: 14 bolts, 9 washers, 31 hinges, 6 brackets.\n"
    "Question: What does the spare parts shelf hold?\nAnswer: The spare parts shelf holds:"
)


@pytest.fixture
def engine(drafting_engine):
    """The session's engine with draft statistics of its own that wall time never turns off (conftest): where
    these tests' drafts go is decided by the tokens, not by how loaded the machine is."""
    return drafting_engine


def _state_sha(session) -> str:
    data, _ = session.canonical_state()
    return hashlib.sha256(data).hexdigest()


def _replayed(engine, toks, gen) -> str:
    """The state after `toks` prefilled and the generation's calls repeated in a fresh context."""
    with engine.session() as s:
        s.prefill(toks)
        replay_calls(s, gen.calls, gen.tokens[: gen.decoded])
        return _state_sha(s)


def test_a_lookup_decoded_answer_replays_bit_for_bit_in_its_recorded_calls(engine):
    toks = engine.model.tokenize(CONTEXT, add_bos=True)
    with engine.session() as s:
        s.prefill(toks)
        gen = s.generate(24, lookup=8)
        after = _state_sha(s)
        assert s.tokens == toks + gen.tokens[: gen.decoded]
    verify = [c for c in gen.calls if isinstance(c, dict)]
    assert verify and any(c["kept"] > 1 for c in verify), "nothing was copied from the context"
    assert all(1 <= c["kept"] <= len(c["fed"]) for c in verify)
    assert gen.decoded == len(gen.tokens) and len(gen.calls) < len(gen.tokens)
    assert _replayed(engine, toks, gen) == after, "the replay of the recorded calls made other cells"
    with engine.session() as s:  # a schedule that does not describe the tokens is refused
        s.prefill(toks)
        wrong = list(gen.tokens[: gen.decoded])
        first = next(i for i, c in enumerate(gen.calls) if isinstance(c, dict))
        wrong[sum(map(call_size, gen.calls[:first]))] ^= 1
        with pytest.raises(EngineError, match="other tokens"):
            replay_calls(s, gen.calls, wrong)
    with engine.session() as s:  # plain greedy, one token per call: counted, not asserted equal
        s.prefill(toks)
        plain = s.generate(len(gen.tokens), lookup=0)
    assert plain.calls == [1] * len(plain.tokens)
    differing = sum(a != b for a, b in zip(plain.tokens, gen.tokens, strict=False))
    print(f"lookup: {len(gen.tokens)} tokens in {len(gen.calls)} calls; {differing} differ from plain greedy")


ANSWERS = [
    CONTEXT,
    "Ferry timetable. Boats leave Paquka at 06:10, 07:40, 09:15 and 11:50 every day.\n"
    "Question: When do the boats leave Paquka?\nAnswer: Boats leave Paquka at",
    "The harbor master writes each departure in a ledger. The ledger is kept in the tower.\n"
    "Repeat the text above word for word.\nThe harbor master",
    "Question: What is the capital of France?\nAnswer:",
]


@pytest.mark.parametrize("text", ANSWERS, ids=["shelf", "timetable", "repeat", "no-copy"])
def test_on_the_invariant_engine_lookup_decoding_gives_plain_greedys_bits(engine, text):
    """Accepted drafts are plain greedy's tokens, and the logits after each and the state after all are the
    same bits: a verify call's rows are computed as one-token calls would compute them."""
    if not engine.batch_invariant:
        pytest.skip("the engine's probe found its bits depend on the batching: differences are only counted")
    toks = engine.model.tokenize(text, add_bos=True)
    runs = []
    for k in (0, 8):
        with engine.session() as s:
            s.prefill(toks)
            gen = s.generate(32, lookup=k, stop_at_eog=True)
            runs.append((gen.tokens, _state_sha(s), len(gen.calls)))
    (plain, plain_state, plain_calls), (looked, looked_state, looked_calls) = runs
    assert looked == plain, "lookup decoding chose other tokens than plain greedy"
    assert looked_state == plain_state, "lookup decoding left other cells than plain greedy"
    assert looked_calls <= plain_calls


@pytest.mark.parametrize("end", ["stop", "cancel"])
def test_generation_ending_inside_accepted_drafts_leaves_what_plain_decoding_leaves(engine, end):
    """A stop string or a cancel at a token a verify call already decoded: the tokens after it (and it)
    are trimmed, the last call records fewer kept, and the replay of the calls makes the same cells."""
    toks = engine.model.tokenize(CONTEXT, add_bos=True)
    with engine.session() as s:
        s.prefill(toks)
        full = s.generate(24, lookup=8)
    big = next(c for c in full.calls if isinstance(c, dict) and c["kept"] >= 3)
    at = full.tokens.index(big["fed"][0]) + 1  # the second token of a long accepted run: decoded ahead
    seen = []

    def cancel(tok, piece):
        seen.append(tok)
        if len(seen) == at + 1:
            raise Cancelled()

    with engine.session() as s:
        s.prefill(toks)
        if end == "stop":
            text = engine.model.detokenize(full.tokens[: at + 1])  # first whole at token `at`
            gen = s.generate(24, stop=[text], lookup=8)
        else:
            gen = s.generate(24, on_token=cancel, lookup=8)
        assert gen.stop_reason == ("callback" if end == "cancel" else f"stop:{text}")
        assert len(gen.tokens) == at + 1 and isinstance(gen.calls[-1], dict)
        # the stopping token is chosen, not decoded: the context holds the ones before it
        assert s.tokens == toks + gen.tokens[:-1] and gen.decoded == len(gen.tokens) - 1
        after = _state_sha(s)
    assert _replayed(engine, toks, gen) == after


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
