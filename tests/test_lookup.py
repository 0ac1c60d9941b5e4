"""Prompt-lookup drafts (engine/lookup.py): the n-gram index over the context and the accepted output,
and which drafted tokens a verify call keeps; a schedule with verify calls, parsed and split. Pure Python:
the same on every CPU."""

from __future__ import annotations

import random

import pytest

from kvgraft.app.answer.chat import ChatError, reply_calls_start
from kvgraft.app.proof.replay import parse_schedule
from kvgraft.engine.lookup import NgramIndex, accepted_prefix


def naive_draft(seq: list[int], k: int, max_n: int) -> list[int]:
    """The definition, by scanning: the longest suffix (max_n..1) found ending earlier, latest occurrence."""
    end = len(seq)
    for n in range(min(max_n, end), 0, -1):
        suffix = seq[end - n :]
        for at in range(end - 1, n - 1, -1):  # occurrence ending at `at` (exclusive), before the suffix itself
            if seq[at - n : at] == suffix:
                return seq[at : at + k]
    return []


def test_the_tokens_after_an_earlier_occurrence_are_drafted():
    idx = NgramIndex([10, 11, 12, 13, 14, 15])
    idx.extend([11, 12])
    assert idx.draft(3) == [13, 14, 15]
    assert idx.draft(1) == [13]
    assert idx.draft(0) == []


def test_the_longest_suffix_wins_over_a_more_recent_shorter_one():
    # "7 8 9" is followed by 1 early on; "8 9" alone by 2 more recently: the 3-gram decides
    idx = NgramIndex([7, 8, 9, 1, 5, 8, 9, 2, 6, 7, 8, 9], max_n=3)
    assert idx.draft(1) == [1]
    assert NgramIndex([7, 8, 9, 1, 5, 8, 9, 2, 6, 7, 8, 9], max_n=2).draft(1) == [2]


def test_nothing_to_copy_drafts_nothing_and_the_suffix_never_matches_itself():
    assert NgramIndex([1, 2, 3, 4]).draft(4) == []
    assert NgramIndex([]).draft(4) == []
    assert NgramIndex([5]).draft(4) == []
    assert NgramIndex([5, 5]).draft(4) == [5]  # the earlier 5 was followed by a 5
    idx = NgramIndex([1, 2, 3, 4, 2, 3])
    assert idx.draft(4, min_n=3) == []  # "4 2 3" never occurred before
    assert idx.draft(4, min_n=2) == [4, 2, 3]


def test_the_index_agrees_with_the_definition_built_at_once_or_token_by_token():
    rng = random.Random(7)
    for trial in range(200):
        seq = [rng.randrange(6) for _ in range(rng.randrange(1, 60))]
        k, max_n = rng.randrange(1, 6), rng.randrange(1, 5)
        whole = NgramIndex(seq, max_n=max_n)
        grown = NgramIndex(max_n=max_n)
        for i, t in enumerate(seq):
            grown.extend([t])
            assert grown.draft(k) == naive_draft(seq[: i + 1], k, max_n), (trial, seq[: i + 1])
        assert whole.draft(k) == naive_draft(seq, k, max_n) == grown.draft(k)


def test_a_wrong_draft_is_rejected_where_it_first_disagrees():
    assert accepted_prefix([4, 5, 6], [4, 5, 6]) == 3
    assert accepted_prefix([4, 5, 6], [4, 9, 6]) == 1  # 6 after a rejected 5 is not looked at
    assert accepted_prefix([4, 5, 6], [7, 5, 6]) == 0
    assert accepted_prefix([], [3]) == 0


def test_max_n_must_be_positive():
    with pytest.raises(ValueError):
        NgramIndex([1, 2], max_n=0)


def test_a_schedule_records_verify_calls_and_refuses_malformed_ones():
    """`then` holds plain call sizes and verify calls {"fed", "kept"}; anything else is a clear ValueError
    before a replay feeds a token, and a turn's reply calls are found by the tokens they decoded."""
    base = {"n_batch": 8, "n_ubatch": 8}
    ok = parse_schedule({**base, "then": [3, {"fed": [5, 6, 7], "kept": 2}, 1]})
    assert ok["then"] == [3, {"fed": [5, 6, 7], "kept": 2}, 1]
    bad_calls = [
        {"fed": [5, 6], "kept": 0},  # keeps nothing
        {"fed": [5, 6], "kept": 3},  # keeps more than it fed
        {"fed": [], "kept": 1},
        {"fed": list(range(9)), "kept": 1},  # more than n_batch in one call
        {"fed": [5, -1], "kept": 1},
        {"fed": [5, True], "kept": 1},
        {"fed": [5, 6], "kept": 1, "logits": "last"},  # an unknown field
        0,
        True,
        "1",
    ]
    for call in bad_calls:
        with pytest.raises(ValueError, match="call"):
            parse_schedule({**base, "then": [call]})
    calls = [700, 1, {"fed": [4, 5, 6], "kept": 3}, 1, {"fed": [9, 9], "kept": 1}]
    assert reply_calls_start(calls, 6) == 1 and reply_calls_start(calls, 2) == 3
    with pytest.raises(ChatError, match="do not end with"):
        reply_calls_start(calls, 3)  # 3 tokens would split a verify call


def test_drafting_turns_itself_off_while_drafts_lose_time_and_tries_again_now_and_then():
    from kvgraft.engine.lookup_decode import RETRY, DraftStats

    stats = DraftStats()
    assert stats.worth_trying()  # nothing known: try
    stats.note_generation(0.010)
    assert stats.worth_trying()
    for _ in range(6):  # generations whose verify calls lost time pull the running gain below zero
        stats.note_generation(-0.020)
    assert stats.gain < 0
    tries = [stats.worth_trying() for _ in range(3 * RETRY)]
    assert sum(tries) == 3 and tries[RETRY - 1] and not any(tries[: RETRY - 1])
    stats.note_call(0.016)
    stats.note_call(0.026)
    assert 0.016 < stats.decode_cost < 0.026
