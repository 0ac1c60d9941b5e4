"""The server's fallback prefill schedule: aligned blocks, so that the cache never changes the bits.

On a batch-invariant engine (kvgraft's build on a CPU: `Engine.batch_invariant`) the prompt cache needs
no schedule (app/serve/prompt_cache.py). Where the probe finds the bits depend on how the tokens are
batched (another build, a GPU backend, KVGRAFT_BATCH_INVARIANT=0), a request's schedule must be a
function of its tokens alone, whatever is cached. A prompt of n tokens is decoded in calls of
`block` tokens at positions [0, B), [B, 2B), ... up to A = the last multiple of B below n, then the
rest but the last token [A, n-1), then the last token alone. Every state at a boundary of that
schedule (a multiple of B up to A, or n-1) is the same bits in every request whose tokens extend it,
so it can be grafted (or kept in the warm context) and the rest decoded in the same calls: cold,
warm and grafted runs give the same logits. n-1 leaves one token to decode, so the logits exist.
"""

from __future__ import annotations

from kvgraft.engine.errors import EngineError

# The block size B, chosen by `python scripts/serve_block.py` (prefill time per call size against the
# tokens prefilled again after a graft; docs/server.md quotes it). Recorded with every automatic state.
BLOCK = 64


def aligned_end(n: int, block: int = BLOCK) -> int:
    """A: the last multiple of `block` at or below n-1 (the aligned part of an n-token prompt)."""
    return ((n - 1) // block) * block if n > 0 else 0


def reuse_points(n: int, block: int = BLOCK) -> list[int]:
    """The states of an n-token prompt's schedule that another run may start from, shortest first:
    every multiple of `block` up to A, and n-1 (just before the last token)."""
    a = aligned_end(n, block)
    points = list(range(block, a + 1, block))
    if n - 1 > a:
        points.append(n - 1)
    return points


def calls_from(start: int, n: int, block: int = BLOCK) -> list[int]:
    """The call sizes that decode tokens [start, n) of an n-token prompt in its schedule; `start`
    must be 0 or one of its reuse points."""
    if n <= 0:
        raise EngineError("an empty prompt has no schedule")
    a = aligned_end(n, block)
    if start not in (0, n - 1) and not (start % block == 0 and 0 < start <= a):
        raise EngineError(f"{start} is not a boundary of a {n}-token prompt's schedule (block {block})")
    calls: list[int] = []
    if start < a:
        calls += [block] * ((a - start) // block)
    if n - 1 > max(start, a):
        calls.append(n - 1 - max(start, a))
    if start < n:
        calls.append(1)
    return calls


def prepare_aligned(cache, tokens: list[int], on_progress, prep) -> int:
    """The fallback for an engine whose bits depend on the batching (app/serve/prompt_cache.py):
    get `tokens` into `cache.session` in their aligned schedule, from the longest reuse point the warm
    context or the library holds; fills `prep` and returns how many tokens were reused."""
    n, s, lib, fp, block = len(tokens), cache.session, cache.library, cache.engine.fingerprint, cache.block
    points = reuse_points(n, block)
    warm = cache.warm_point(tokens, points)
    entry = lib.cache.cached_state(tokens, [p for p in points if p > warm], fp, block)
    if entry is not None:
        start = stored = cache.graft_entry(entry, prep)
    elif warm:
        s.trim(warm)
        start = warm
        below = lib.cache.cached_state(tokens, [p for p in points if p <= warm], fp, block)
        stored = below.n_tokens if below is not None else 0
        cache.count_warm(prep, warm)
    else:
        s.reset(clear_data=False)
        start = stored = 0
        cache.counters.misses += 1
    a = aligned_end(n, block)
    keep: set[int] = set()
    if cache.budget_bytes > 0 and a > stored:  # new aligned blocks: their state, and the prompt's own
        keep = {p for p in (a, n - 1) if p > stored}
    cache.held_points = []  # until the prompt is in, the context holds no reuse point to trust
    at = start
    if at in keep:  # the warm context holds it already: captured before going on
        cache.queue_capture(prep, block)
    for c in calls_from(start, n, block):
        s.prefill(tokens[at : at + c])
        at += c
        if at in keep:
            cache.queue_capture(prep, block)
        if on_progress is not None:
            on_progress(at, n)
    cache.held_points = points
    return start


def aligned_calls(n_tokens: int, block: int) -> list[int]:
    """The calls that decoded an aligned state of `n_tokens` tokens: those of a prompt one token longer,
    but for its last token alone (the `then` its library record keeps)."""
    return calls_from(0, n_tokens + 1, block)[:-1]
