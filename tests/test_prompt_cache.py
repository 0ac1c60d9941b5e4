"""The server's prompt cache keeps the bits: aligned-block schedules, trim, graft (real llama.cpp, real Gemma).

A request decoded cold, from a trimmed warm context, or from a grafted state at a boundary of its
schedule (app/serve/schedule.py) must give the same logits, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kvgraft.app.serve.schedule import BLOCK, calls_from, reuse_points
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.errors import EngineError
from kvgraft.engine.sampling import Sampler, SamplingParams, log_softmax

TEXT = (
    "The harbor of Paquka opens at dawn. Fishing boats leave in a fixed order: the red ones first, then the "
    "blue ones, and the small white skiffs last. The harbor master writes each departure in a ledger. "
)


def prompt(engine, n_words: int, tail: str) -> list[int]:
    return engine.model.tokenize((TEXT * 12)[: n_words * 6] + tail)


def decode_calls(session, tokens, start, calls):
    at = start
    for c in calls:
        session.prefill(tokens[at : at + c])
        at += c
    assert at == len(tokens)


def cold(engine, tokens) -> str:
    with engine.session() as s:
        decode_calls(s, tokens, 0, calls_from(0, len(tokens)))
        return logits_sha256(s.logits())


def test_the_schedule_is_blocks_then_the_rest_then_the_last_token():
    assert calls_from(0, 3 * BLOCK + 8) == [BLOCK, BLOCK, BLOCK, 7, 1]
    assert calls_from(2 * BLOCK, 3 * BLOCK + 8) == [BLOCK, 7, 1]
    assert calls_from(3 * BLOCK + 7, 3 * BLOCK + 8) == [1]
    assert reuse_points(3 * BLOCK + 8) == [BLOCK, 2 * BLOCK, 3 * BLOCK, 3 * BLOCK + 7]
    assert calls_from(0, BLOCK + 1) == [BLOCK, 1] and reuse_points(BLOCK + 1) == [BLOCK]
    with pytest.raises(EngineError, match="not a boundary"):
        calls_from(BLOCK + 3, 3 * BLOCK)


def test_trim_then_continue_gives_the_cold_bits(engine):
    """The warm context held request 1 (its prompt and a reply); trimmed back to an aligned boundary
    request 2 shares, request 2's rest in its own schedule gives the logits a new context gives."""
    p1 = prompt(engine, 120, " Question: which boats leave first? Answer:")
    p2 = prompt(engine, 120, " Question: who writes the ledger? Answer:")
    shared = next(i for i, (a, b) in enumerate(zip(p1, p2, strict=False)) if a != b)
    point = max(p for p in reuse_points(len(p2)) if p <= shared and p % BLOCK == 0)
    assert point >= 2 * BLOCK
    with engine.session() as s:
        decode_calls(s, p1, 0, calls_from(0, len(p1)))
        s.generate(8)  # the reply's tokens are in the context too
        s.trim(point)
        assert s.tokens == p2[:point] and s.n_past == point
        with pytest.raises(EngineError, match="no logits"):
            s.logits()
        decode_calls(s, p2, point, calls_from(point, len(p2)))
        warm = logits_sha256(s.logits())
        again = s.generate(6).tokens
    assert warm == cold(engine, p2)
    with engine.session() as s:
        decode_calls(s, p2, 0, calls_from(0, len(p2)))
        assert s.generate(6).tokens == again


def test_a_graft_at_every_reuse_point_gives_the_cold_bits(engine):
    p = prompt(engine, 90, " Question: what colour are the skiffs? Answer:")
    snaps = {}
    with engine.session() as s:
        at = 0
        for c in calls_from(0, len(p)):
            s.prefill(p[at : at + c])
            at += c
            if at in reuse_points(len(p)):
                snaps[at] = s.snapshot()
        want = logits_sha256(s.logits())
    assert sorted(snaps) == reuse_points(len(p))
    for point, snap in snaps.items():
        with engine.session() as s:
            s.graft(snap)
            decode_calls(s, p, point, calls_from(point, len(p)))
            assert logits_sha256(s.logits()) == want, f"graft at {point}"


def test_trim_refuses_what_the_context_does_not_hold(engine):
    with engine.session() as s:
        s.prefill(engine.model.tokenize("a few tokens"))
        with pytest.raises(EngineError, match="cannot trim"):
            s.trim(s.n_past + 1)


def test_sampling_is_reproducible_for_a_seed_and_reads_the_greedy_logits(engine):
    p = prompt(engine, 40, " The harbor master")
    runs = []
    for seed in (7, 7, 8):
        with engine.session() as s:
            s.prefill(p)
            g = s.generate(12, sampler=Sampler(SamplingParams(temperature=1.5, top_p=0.95, seed=seed)), top_logprobs=3)
            runs.append((g.tokens, [lp.logprob for lp in g.logprobs]))
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[2][0]
    with engine.session() as s:
        s.prefill(p)
        logits = s.logits()
        greedy = s.generate(1, top_logprobs=5)
    first = greedy.logprobs[0]
    assert first.token == int(np.argmax(logits)) == first.top[0][0]
    assert first.logprob == pytest.approx(float(log_softmax(logits)[first.token]))
    assert [t for t, _ in first.top] == sorted(range(len(logits)), key=lambda t: (-logits[t], t))[:5]


def test_a_stop_string_split_over_tokens_is_found(engine):
    p = engine.model.tokenize("Count: one, two, three, four, five, six, seven,")
    with engine.session() as s:
        s.prefill(p)
        free = s.generate(20, stop_at_eog=False).text
    cut = free.find(",", 3)
    stop = free[cut - 2 : cut + 2]  # spans the end of one token and the start of the next (most often)
    with engine.session() as s:
        s.prefill(p)
        g = s.generate(20, stop=[stop], stop_at_eog=False)
    assert g.stop_reason == f"stop:{stop}" and g.text == free[: free.find(stop)]


# -- the cache's rules, in process (app/serve/prompt_cache.py) -----------------------------------------
@pytest.fixture
def cache_service(engine, tmp_path):
    from kvgraft.app.service import LibraryService
    from kvgraft.library.library import Library

    lib = Library(tmp_path / "lib")
    service = LibraryService(engine, lib)
    yield service
    service.close()
    lib.close()


@pytest.fixture
def make_cache(cache_service):
    from kvgraft.app.serve.prompt_cache import PromptCache

    made = []

    def make(budget=10**10):
        made.append(PromptCache(cache_service, budget))
        return made[-1]

    yield make
    for c in made:
        c.close_session()


def plain_cold(engine, tokens) -> str:
    """A fresh context, the tokens prefilled in n_batch chunks: the reference a cache run must equal."""
    with engine.session() as s:
        s.prefill(tokens)
        return logits_sha256(s.logits())


def test_questions_after_one_long_system_prompt_store_its_last_block_once(engine, make_cache):
    cache = make_cache()
    system = prompt(engine, 100, "")
    for q in ("Which boats leave first?", "Who writes the ledger?", "When does the harbor open?", "What colour?"):
        cache.prepare(system + engine.model.tokenize(" Question: " + q, add_bos=False))
        cache.flush()
    n, _ = cache.library.cache.cache_bytes()
    assert n == 1, f"{n} automatic states for four short questions after one system prompt"
    again = system + engine.model.tokenize(" Question: Which boats leave first?", add_bos=False)
    first = cache.prepare(again)
    assert first.source == "warm" and first.cached_tokens > len(system)
    assert logits_sha256(cache.session.logits()) == plain_cold(engine, again)


def test_the_warm_context_reuses_every_token_it_shares_with_the_cold_bits(engine, make_cache):
    """On the invariant engine a warm request decodes only what is new, wherever the prompts part."""
    if not engine.batch_invariant:
        pytest.skip("the engine's probe found its bits depend on the batching: the aligned path serves it")
    cache = make_cache(budget=0)
    base = prompt(engine, 70, "")
    for tail in (" Question: who writes the ledger?", " Question: who writes the", " Q", " Question: which boats?"):
        p = base + engine.model.tokenize(tail, add_bos=False)
        before = list(cache.session.tokens)
        prep = cache.prepare(p)
        shared = min(
            len(p) - 1, next((i for i, (a, b) in enumerate(zip(before, p, strict=False)) if a != b), len(before))
        )
        assert prep.tokens_prefilled == len(p) - shared, (tail, prep)
        assert logits_sha256(cache.session.logits()) == plain_cold(engine, p), tail
        cache.session.generate(3, lookup=0)  # the reply's tokens stay in the context for the next request


def test_a_conversation_stores_the_state_after_each_reply_and_resumes_from_it_after_a_restart(engine, make_cache):
    if not engine.batch_invariant:
        pytest.skip("the engine's probe found its bits depend on the batching: the aligned path serves it")
    cache = make_cache()
    text = engine.model.detokenize(prompt(engine, 40, ""))
    turns, replies = [" Who writes the ledger?", " Which boats leave first?", " When does it open?"], []

    def conversation(k):
        out = text
        for i in range(k):
            out += f"\nUser:{turns[i]}\nAssistant:" + (replies[i] if i < len(replies) else "")
        return engine.model.tokenize(out)

    for k in (1, 2):
        asked = len(conversation(k))
        cache.prepare(conversation(k))
        replies.append(cache.session.generate(6, lookup=0).text)
        held = cache.session.n_past
        cache.after_reply()
        cache.flush()
    ends = sorted(e.n_tokens for e in cache.library.entries(kind="cache"))
    assert held > asked and held in ends, (asked, held, ends)  # turn 2 continued turn 1: its reply's state
    cache.close_session()  # a restart: nothing warm
    p = conversation(3)
    prep = cache.prepare(p)
    assert prep.source == "library" and prep.cached_tokens >= held - 1
    assert prep.tokens_prefilled <= len(p) - held + 1, prep
    assert logits_sha256(cache.session.logits()) == plain_cold(engine, p)


def test_a_short_stored_state_is_trimmed_to_the_shared_prefix_with_the_cold_bits(engine, make_cache):
    """A state no longer than the sliding window serves any prefix of itself (its graft trimmed back)."""
    if not engine.batch_invariant:
        pytest.skip("the engine's probe found its bits depend on the batching: the aligned path serves it")
    cache = make_cache()
    short = engine.model.tokenize("User: Who writes the ledger in the harbor?\nAssistant:")
    assert len(short) < cache.block
    cache.prepare(short)
    assert cache.flush() == 1  # a prompt shorter than one block is stored whole
    cache.close_session()
    other = short[:-4] + engine.model.tokenize(" boats?\nAssistant:", add_bos=False)
    prep = cache.prepare(other)
    shared = next(i for i, (a, b) in enumerate(zip(short, other, strict=False)) if a != b)
    assert prep.source == "library" and prep.cached_tokens == shared and prep.tokens_restored == len(short)
    assert logits_sha256(cache.session.logits()) == plain_cold(engine, other)


def test_chat_message_boundaries_are_token_prefixes(engine):
    from kvgraft.app.proof.chat_format import ChatFormat

    messages = [
        {"role": "system", "content": "You answer questions about the harbor of Paquka."},
        {"role": "user", "content": "Who writes the ledger?"},
        {"role": "assistant", "content": "The harbor master."},
        {"role": "user", "content": "Which boats leave first?"},
    ]
    fmt = ChatFormat.for_model(engine.model)
    tokens, ends = fmt.conversation_with_boundaries(engine.model, messages)
    assert tokens == fmt.conversation(engine.model, messages)
    assert ends == sorted(ends) and 2 <= len(ends) <= 3 and ends[-1] < len(tokens)
    text = engine.model.detokenize(tokens)
    assert engine.model.detokenize(tokens[: ends[0]]).strip() in text and "Who writes" not in engine.model.detokenize(
        tokens[: ends[0]]
    )


def test_a_stored_state_grafts_to_the_cold_bits_and_knowledge_is_never_evicted(engine, cache_service, make_cache):
    lib = cache_service.library
    knowledge = cache_service.deposit("The harbor master writes each departure in a ledger.").entry
    p = prompt(engine, 60, " Question: who writes the ledger? Answer:")
    cache = make_cache()
    cold_run = cache.prepare(p)
    want = logits_sha256(cache.session.logits())
    assert cold_run.source == "cold" and cold_run.stores_queued
    assert cache.flush() == len(cold_run.stores_queued)
    cache.close_session()  # as after a restart: nothing warm
    hit = cache.prepare(p)
    assert hit.source == "library" and hit.cached_tokens == max(cold_run.stores_queued) and hit.proof == "local"
    assert logits_sha256(cache.session.logits()) == want
    assert lib.search("ledger") and all(e.kind != "cache" for e in lib.search("ledger"))
    assert lib.cache.cache_bytes()[0] == len(cold_run.stores_queued)
    make_cache(budget=1)  # a restart with a budget past which every cache state goes; the deposit stays
    assert lib.cache.cache_bytes() == (0, 0)
    assert lib.get(knowledge.id).id == knowledge.id
    from kvgraft.library.maintenance import fsck, gc

    gc(lib, grace_s=0)
    assert not fsck(lib)["problems"]


def test_one_budget_keeps_a_threads_pinned_states_and_evicts_its_older_ones_with_the_cache(
    engine, cache_service, make_cache
):
    from kvgraft.app.answer.chat import ChatService

    lib = cache_service.library
    chats = ChatService(cache_service)
    t = chats.new_thread(system="Be brief.")
    for q in ("Who writes the ledger?", "Which boats leave first?", "When does the harbor open?"):
        chats.say(t.id, q, max_tokens=4)
    states = [turn.entry_id for turn in lib.threads.turns(t.id)]
    cache = make_cache()
    cache.prepare(prompt(engine, 20, " Question: who writes the ledger?"))
    cache.flush()
    n, size = lib.cache.cache_bytes()
    assert n == 1 + 2 and size > 0  # the automatic state and the thread's two older states; its newest is pinned
    make_cache(budget=1)  # a restart with a budget every unpinned state is past
    assert lib.cache.cache_bytes() == (0, 0)
    kept = lib.threads.existing_entries(states)
    assert list(kept) == [states[-1]]  # the newest state stays while the thread exists
    again = chats.say(t.id, "And the blue ones?", max_tokens=4, check=True)
    assert again.tokens_restored == lib.get(states[-1]).n_tokens and again.exact is True
