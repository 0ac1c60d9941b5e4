"""What a request's prompt took and what the prompt cache counted (app/serve/prompt_cache.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kvgraft.engine.errors import DecodeError


class ContextLengthExceeded(DecodeError):
    """The prompt does not fit the context (with room for one token of reply)."""

    code = "context_length_exceeded"  # what app/core/jobs.py reports it as (a 400, not a 500)


@dataclass
class Prepared:
    """What getting a prompt into the context took: the `kvgraft` object of a response."""

    prompt_tokens: int
    cached_tokens: int  # not computed for this request: grafted, or still in the warm context
    source: str  # "cold", "warm" (the context held them), "library" (a cache state grafted) or "remote:<name>"
    entry_id: int | None = None
    proof: str | None = None
    tokens_restored: int = 0
    graft_ms: float = 0.0
    prefill_ms: float = 0.0
    tokens_prefilled: int = 0
    stores_queued: list[int] = field(default_factory=list)  # the lengths captured for storing
    pins: list[dict] = field(default_factory=list)  # the request's named pins: {name, n_tokens, state}
    remote_fetch_ms: float | None = None  # a state fetched from the fleet's remote: how long the fetch took

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class CacheCounters:
    hits_library: int = 0
    hits_warm: int = 0
    misses: int = 0
    tokens_prefilled: int = 0
    tokens_restored: int = 0
    tokens_warm: int = 0
    stored: int = 0
    dropped: int = 0
    evicted: int = 0
    graft_s: float = 0.0
    prefill_s: float = 0.0
