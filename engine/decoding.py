"""The one decode loop: ask, chat, the window and the server all decode through it (Session.generate).

From the logits the context holds, choose a token (engine/sampling.py: greedy, or sampled with a
seed), tell `on_token`, decode it, and go on until `max_tokens`, an end-of-generation token, a stop
string (found across token boundaries: the text is searched, not the pieces), a full context, or
`on_token` raising `Cancelled` (the one cancel protocol: engine/errors.py). With `top_logprobs` set
(0..20), each chosen token's log-probability, and the `top_logprobs` most likely, are recorded from
the very logits it was chosen from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .errors import Cancelled, EngineError
from .sampling import GREEDY, MAX_TOP_LOGPROBS, Sampler, TokenLogprob, token_logprob

# on_token(token_id, text_piece), after each token chosen: a Cancelled it raises ends the generation
TokenFn = Callable[[int, str], None]


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""  # "max_tokens", "eog", "stop:<s>", "callback", "context_full"
    seconds: float = 0.0
    first_token_at: float | None = None  # time.perf_counter() when the first token was chosen
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token in `tokens`, when asked for


def generate(
    session,
    max_tokens: int,
    stop: Sequence[str] = (),
    on_token: TokenFn | None = None,
    stop_at_eog: bool = True,
    sampler: Sampler | None = None,
    top_logprobs: int | None = None,
) -> Generation:
    """Decode from `session`'s current logits (see the module doc). A `Cancelled` raised by `on_token`
    is not an error: generation stops and returns what was chosen so far (that token included, not
    decoded into the context) with stop_reason "callback". Any other exception propagates."""
    if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise EngineError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top_logprobs}")
    sampler = sampler or Sampler(GREEDY)
    stops = tuple(s for s in stop if s)
    longest_stop = max((len(s) for s in stops), default=0)
    model = session.engine.model
    gen = Generation()
    t0 = time.perf_counter()
    raw = b""
    text = ""
    while True:
        if len(gen.tokens) >= max_tokens:
            gen.stop_reason = "max_tokens"
            break
        logits = session.logits()
        tok = sampler.choose(logits)
        if gen.first_token_at is None:
            gen.first_token_at = time.perf_counter()
        if stop_at_eog and model.is_eog(tok):
            gen.stop_reason = "eog"
            break
        gen.tokens.append(tok)
        if top_logprobs is not None:
            gen.logprobs.append(token_logprob(logits, tok, top_logprobs))
        piece = model.token_bytes(tok)
        raw += piece
        before = len(text)
        text = raw.decode("utf-8", errors="replace")
        if stops:
            start = max(0, before - longest_stop)
            hits = [(i, s) for s in stops if (i := text.find(s, start)) >= 0]
            if hits:
                i, hit = min(hits)
                gen.text = text[:i]
                gen.stop_reason = f"stop:{hit}"
                gen.seconds = time.perf_counter() - t0
                return gen
        if on_token is not None:
            try:
                on_token(tok, piece.decode("utf-8", errors="replace"))
            except Cancelled:
                gen.stop_reason = "callback"
                break
        if session.n_past >= session.n_ctx:
            gen.stop_reason = "context_full"
            break
        session.decode_one(tok)
    gen.text = text
    gen.seconds = time.perf_counter() - t0
    return gen
