"""Does this engine give the same bits however the tokens are batched? The load-time check.

llama.cpp picks its CPU kernels by the number of rows in a decode call, and kernels sum in different
orders (docs/exact-graft.md, "The switches"): llamafile's sgemm refuses one-token calls (closed by
packaging/llama-cpp-python/sgemm-one-token.patch), the tiled K-quant kernel refuses calls under 8 rows
(closed by GGML_CPU_TILED_MM_FORCE=1, engine/bindings.py), flash attention has paths for one row past
512 cells (split over threads), for 64+ rows and for the rest, and the last layer runs only the rows
whose logits are read. Nothing here assumes which of them a build closes: the probe's long prompt is
decoded again as splits that each cross one switch, and the engine is invariant only when every split
gives the one-call logits and canonical state bytes. A split at another thread count says whether
n_threads decides the bits (it then enters the fingerprint).

Where the engine is not invariant (another build, flash attention's paths, a GPU backend), every exact
path keeps today's recorded schedules.
"""

from __future__ import annotations

import hashlib
from contextlib import ExitStack

from .compare import logits_sha256
from .lookup_decode import feed

# (name, calls before the tail as "chunks" of n_batch or an explicit head, tail tokens, output rows of the
# tail, which prompt: the probe's "long" one past the window or its "short" one of 16 tokens)
SPLITS = (
    ("one-token call", None, 1, 1, "long"),  # sgemm's n < 2; flash attention's one-row split-KV path past 512 cells
    ("call under 8 rows", None, 5, 1, "long"),  # the tiled K-quant kernel's floor
    ("64+ rows after a prefix", None, 70, 1, "long"),  # flash attention's tiled path (GGML_FA_TILE_Q)
    ("small calls first", (1, 7), 0, 1, "short"),  # a one-token and a 7-token call at the start of the context
    ("several output rows", None, 4, 4, "long"),  # the last layer runs every row whose logits are read
)


def chunks(n: int, n_batch: int) -> list[int]:
    out = []
    while n > 0:
        out.append(min(n_batch, n))
        n -= out[-1]
    return out


def split_calls(n: int, n_batch: int, head: tuple[int, ...] | None, tail: int) -> list[int] | None:
    """The calls of one split of `n` tokens (None when `n` is too short for it)."""
    head = tuple(head or ())
    rest = n - sum(head) - tail
    if rest < 1:
        return None
    return [*head, *chunks(rest, n_batch), *([tail] if tail else [])]


def decode_split(session, tokens: list[int], calls: list[int], rows: int) -> None:
    """Decode `tokens` as `calls`, the last one with logits at its last `rows` rows (all when rows > 1)."""
    at = 0
    for k, size in enumerate(calls):
        part = tokens[at : at + size]
        if k == len(calls) - 1 and rows > 1:
            feed(session, part, keep=len(part))  # one call, logits at every row
        else:
            session.prefill(part)
        at += size


def outcome(session) -> tuple[str, str]:
    data, _elided = session.canonical_state()
    return logits_sha256(session.logits()), hashlib.sha256(data).hexdigest()


def run_invariance(probe_engine, prompts: dict[str, tuple[list[int], tuple[str, str]]]) -> dict:
    """Decode each split's prompt (`prompts`: name -> (tokens, the one-call logits and canonical state
    SHA-256)) on `probe_engine` and compare; then the one-token split at another thread count.

    Splits that begin with the same first call share it: the context keeps it and forgets the rest
    (`trim`) before the next split's remaining calls, as kvgraft's prompt cache does (a trimmed
    context continues with a fresh one's bits: tests/test_prompt_cache.py). That halves the probe's
    cost; a trim that kept other bits would show here as "not invariant", the safe side."""
    cfg = probe_engine.config
    results = []
    with ExitStack() as stack:
        held: dict[tuple, object] = {}  # (prompt, first call's size) -> a context holding just that call
        for name, head, tail, rows, prompt in SPLITS:
            tokens, reference = prompts[prompt]
            calls = split_calls(len(tokens), cfg.n_batch, head, tail)
            if calls is None:
                continue
            got = _decode_from(stack, held, prompt, probe_engine, tokens, calls, rows)
            results.append({"name": name, "calls": calls, "rows": rows, "same": got == reference, "hashes": list(got)})
        other = 1 if cfg.n_threads != 1 else 2
        threads_engine = type(probe_engine)(probe_engine.model, cfg.replace(n_threads=other))
        tokens = prompts["long"][0]
        calls = split_calls(len(tokens), cfg.n_batch, None, 1)
        got = _decode_from(stack, {}, "long", threads_engine, tokens, calls, 1)
    one_token = next((r for r in results if r["name"] == "one-token call"), None)
    threads_decide = one_token is None or got != tuple(one_token["hashes"])
    return {
        "splits": results,
        "invariant": all(r["same"] for r in results),
        "threads_decide_bits": threads_decide,
    }


def _decode_from(stack: ExitStack, held: dict, prompt: str, engine, tokens: list[int], calls: list[int], rows: int):
    first = calls[0]
    session = held.get((prompt, first))
    if session is None:
        session = held[(prompt, first)] = stack.enter_context(engine.session())
        session.prefill(tokens[:first])
    else:
        session.trim(first)
    decode_split(session, tokens[first:], calls[1:], rows)
    return outcome(session)
