"""The server's side of named cache pins (library/cache_pins.py holds them): pin a request's prefixes."""

from __future__ import annotations


def pin_prefixes(cache, tokens: list[int], pins, prep) -> set[int]:
    """Pin each (name, length, ttl_s) prefix of `tokens` for `cache` (app/serve/prompt_cache.py), noting
    each in `prep.pins`; returns the lengths whose state is not stored yet, to capture on the way (on a
    batch-invariant engine that stores states at all)."""
    force = set()
    for name, length, ttl in pins:
        if not 0 < length <= len(tokens):
            continue
        pin = cache.library.cache.pin_prefix(name, tokens[:length], cache.engine.fingerprint, ttl)
        if pin.entry_id is None and cache.budget_bytes > 0 and cache.invariant:
            force.add(length)
        prep.pins.append({"name": name, "n_tokens": length, "state": pin.state})
    return force
