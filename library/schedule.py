"""A recorded decode schedule, checked: what entries, packs and receipts say about how a state was made.

`{"prefill": "chunks", "n_batch", "n_ubatch"}`: one prefill from position 0 in chunks of n_batch, split
into n_ubatch micro-batches; an answer-ready state or a chat turn adds `then`, the calls after it (a
size, or a verify call of prompt-lookup decoding `{"fed", "kept"}`). What follows a schedule (a replay)
is app/proof/replay.py; this module only reads one, so the library and a pack's parser can check it
without the engine (docs/exact-graft.md).
"""

from __future__ import annotations


def parse_schedule(raw) -> dict | None:
    """A recorded schedule, checked (ValueError naming the problem); None stays None (the default)."""
    if raw is None:
        return None
    ok = isinstance(raw, dict) and all(
        isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool) and raw[k] >= 1
        for k in ("n_batch", "n_ubatch")
    )
    if not ok or raw["n_ubatch"] > raw["n_batch"]:
        raise ValueError(
            f"a schedule {str(raw)[:80]!r} is not {{n_batch, n_ubatch}}: positive integers, n_ubatch <= n_batch"
        )
    out = {"prefill": "chunks", "n_batch": raw["n_batch"], "n_ubatch": raw["n_ubatch"]}
    then = raw.get("then")
    if then is not None:
        if not isinstance(then, list) or not then:
            raise ValueError(f"a schedule's 'then' {str(then)[:80]!r} is not a list of calls")
        out["then"] = [_parse_call(c, raw["n_batch"]) for c in then]
    return out


def parse_pack_schedule(raw) -> dict | None:
    """A pack entry's schedule: a chunked prefill only (`then` calls belong to answer-ready states and
    chat turns, which packs never carry). ValueError naming the problem."""
    if isinstance(raw, dict) and "then" in raw:
        raise ValueError("an entry's schedule has 'then' calls; packs carry chunked prefills only")
    return parse_schedule(raw)


def _parse_call(c, n_batch: int):
    """One recorded call: a positive size, or a verify call {"fed": [1..n_batch token ids], "kept": 1..len(fed)}."""
    if isinstance(c, int) and not isinstance(c, bool) and c >= 1:
        return c
    if isinstance(c, dict) and set(c) == {"fed", "kept"}:
        fed, kept = c["fed"], c["kept"]
        if (
            isinstance(fed, list)
            and 1 <= len(fed) <= n_batch
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in fed)
            and isinstance(kept, int)
            and not isinstance(kept, bool)
            and 1 <= kept <= len(fed)
        ):
            return {"fed": list(fed), "kept": kept}
    raise ValueError(
        f"a schedule's call {str(c)[:80]!r} is neither a positive size nor a verify call "
        f"{{fed: 1..{n_batch} token ids, kept: 1..len(fed)}}"
    )
