"""Greedy decoding with prompt-lookup drafts, and the replay of its schedule (groundwork, issue 31).

Each step feeds the chosen token and the tokens `NgramIndex.draft` guessed after it in ONE llama_decode
call that reads the logits at every fed position, keeps the chosen token and the longest drafted prefix
the model's own argmax agrees with, and removes the rest from the cache (`Session.trim`). The call's
shape is part of the bits (a token's cells can differ with the batch it was decoded in), so every call
is recorded as `{"fed": [...], "kept": n}`: `replay_calls` repeats them in a fresh context and must give
the same cells and logits (tests/test_lookup_decode.py). Greedy only, lowest id on ties (as
engine/decoding.py); drafts never hold an end-of-generation token, so one is never decoded into the
context. Not yet used by ask, chat or the server: that, the receipts and `--check` are the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .errors import EngineError
from .lookup import NgramIndex, accepted_prefix
from .scoring import logits_row


@dataclass
class LookupGeneration:
    tokens: list[int] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)  # {"fed": [chosen, *draft], "kept": 1 + accepted}
    stop_reason: str = ""
    next_token: int | None = None  # the model's choice after the last kept token (not decoded)

    @property
    def tokens_per_call(self) -> float:
        return len(self.tokens) / len(self.calls) if self.calls else 0.0


def feed(session, fed: Sequence[int], keep: int | None = None) -> tuple[list[int], int]:
    """One verify call: decode `fed` after the context in one call with logits at every position; keep
    fed[0] and the drafted tokens the argmax agrees with (or exactly `keep` tokens, for a replay), trim
    the rest. Returns (argmax at each fed position, how many were kept)."""
    fed = session._fitting(fed)
    if not fed or len(fed) > session.engine.config.n_batch:
        raise EngineError(f"a verify call feeds 1 to n_batch tokens (got {len(fed)})")
    before = session.n_past
    session._decode(fed, want_last_logits=True, logit_rows=slice(0, len(fed)))
    argmax = [int(np.argmax(logits_row(session, i))) for i in range(len(fed))]  # first max: lowest id on ties
    kept = 1 + accepted_prefix(fed[1:], argmax[:-1]) if keep is None else keep
    if not 1 <= kept <= len(fed):
        raise EngineError(f"a verify call keeps 1 to {len(fed)} tokens (got {kept})")
    if kept < len(fed):
        session.trim(before + kept)
    return argmax, kept


def generate_lookup(session, index: NgramIndex, max_tokens: int, k: int = 8) -> LookupGeneration:
    """Greedy decoding from the session's current logits with up to `k` drafted tokens per call; `index`
    holds the context's tokens and receives each kept one. Stops at `max_tokens` or an end-of-generation
    token (not decoded), like `Session.generate` with its defaults."""
    model = session.engine.model
    gen = LookupGeneration()
    tok = int(np.argmax(session.logits()))
    while True:
        if len(gen.tokens) >= max_tokens:
            gen.stop_reason = "max_tokens"
            break
        if model.is_eog(tok):
            gen.stop_reason = "eog"
            break
        if session.n_past >= session.n_ctx:
            gen.stop_reason = "context_full"
            break
        gen.tokens.append(tok)
        index.extend([tok])
        room = min(k, max_tokens - len(gen.tokens), session.n_ctx - session.n_past - 1)
        draft = index.draft(room) if room > 0 else []
        eog_at = next((i for i, d in enumerate(draft) if model.is_eog(d)), len(draft))
        draft = draft[:eog_at]
        argmax, kept = feed(session, [tok, *draft])
        gen.calls.append({"fed": [tok, *draft], "kept": kept})
        gen.tokens.extend(draft[: kept - 1])
        index.extend(draft[: kept - 1])
        tok = argmax[kept - 1]
    gen.next_token = tok
    return gen


def replay_calls(session, calls: Sequence[dict]) -> list[int]:
    """Repeat recorded verify calls in `session` (after the same context); returns the tokens kept."""
    kept_tokens: list[int] = []
    for call in calls:
        _, kept = feed(session, call["fed"], keep=call["kept"])
        kept_tokens.extend(call["fed"][:kept])
    return kept_tokens
