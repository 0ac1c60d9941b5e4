"""The one decode loop: ask, chat, the window and the server all decode through it (Session.generate).

From the logits the context holds, choose a token (engine/sampling.py: greedy, or sampled with a
seed), tell `on_token`, decode it, and go on until `max_tokens`, an end-of-generation token, a stop
string (found across token boundaries: the text is searched, not the pieces), a full context, or
`on_token` raising `Cancelled` (the one cancel protocol: engine/errors.py). With `top_logprobs` set
(0..20), each chosen token's log-probability, and the `top_logprobs` most likely, are recorded from
the very logits it was chosen from.

With `lookup` > 0 (greedy without penalties, no logprobs, stopping at end-of-generation), a chosen token is decoded
together with up to `lookup` tokens guessed from the context (engine/lookup_decode.py: prompt-lookup
drafts) in one verify call; the guesses the model's own argmax agrees with are its next choices,
already decoded. Every choice still passes the same stop checks and `on_token` one by one, and where
generation ends with guessed tokens decoded that plain decoding would not have decoded, they are
trimmed, so the context holds exactly the tokens it would hold after plain decoding (`Generation.calls`
says in which calls they were decoded: the schedule a replay repeats).

With a `constraint` (engine/constraint.py), each choice is made from a masked copy of the logits: only
the tokens the grammar allows, end of generation only where it accepts; generation ends ("grammar") once
the grammar can take nothing more. And the answer closes within `max_tokens`: where the model's choice
would leave too few tokens to close the grammar, the closing path's next token is taken instead
(engine/closing.py), so what `max_tokens` cuts still parses. Lookup decoding is off under a
constraint (a verify call's choices are raw argmaxes the grammar never saw), and logprobs stay the
model's own (raw) distribution.
`Generation.constraint` records the grammar's SHA-256: the tokens a constrained answer leaves in the
context are ordinary tokens (a replay of the state needs only them), but choosing them again needs the
grammar.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .errors import Cancelled, EngineError
from .lookup_decode import Drafter, call_size
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
    # the calls that decoded the tokens this generation left in the context: 1 for a one-token decode,
    # {"fed": [ids], "kept": n} for a verify call (logits at every fed position, the first n kept)
    calls: list = field(default_factory=list)
    constraint: str | None = None  # the SHA-256 of the grammar the choices were constrained by

    @property
    def decoded(self) -> int:
        """How many tokens this generation decoded into the context."""
        return sum(map(call_size, self.calls))


def generate(
    session,
    max_tokens: int,
    stop: Sequence[str] = (),
    on_token: TokenFn | None = None,
    stop_at_eog: bool = True,
    sampler: Sampler | None = None,
    top_logprobs: int | None = None,
    lookup: int = 0,
    constraint=None,
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
    gen = Generation(constraint=constraint.grammar.sha256 if constraint is not None else None)
    drafter = None
    plain = sampler.params.greedy and not sampler.params.penalized  # a verify call chooses by argmax
    greedy_plain = lookup > 0 and plain and top_logprobs is None and stop_at_eog and constraint is None
    if greedy_plain and session.engine.draft_stats.worth_trying():  # unless recent generations' drafts lost time
        drafter = Drafter(session, lookup, stops)
    ahead: list[int] = []  # choices a verify call already made: ahead[0] is the next one
    n_ahead = 0  # how many of `ahead` are decoded into the context already
    t0 = time.perf_counter()
    raw = b""
    text = ""
    extra = 0  # a decoded-ahead token that ended generation before plain decoding would decode it
    while True:
        if len(gen.tokens) >= max_tokens:
            gen.stop_reason = "max_tokens"
            break
        logits = None
        if ahead:
            tok, decoded = ahead.pop(0), n_ahead > 0
            n_ahead -= decoded
        else:
            logits = session.logits()
            if constraint is None:
                tok = sampler.choose(logits)
            else:  # the grammar's choice, or the path that closes it before the budget ends
                tok = constraint.within(sampler.choose(constraint.allowed(logits)), max_tokens - len(gen.tokens))
            decoded = False
        if gen.first_token_at is None:
            gen.first_token_at = time.perf_counter()
        if stop_at_eog and model.is_eog(tok):  # drafts hold none: never a decoded-ahead one
            gen.stop_reason = "eog"
            break
        gen.tokens.append(tok)
        sampler.accept(tok)
        if constraint is not None:
            constraint.advance(tok)
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
                text = text[:i]
                gen.stop_reason = f"stop:{hit}"
                extra = decoded
                break
        if on_token is not None:
            try:
                on_token(tok, piece.decode("utf-8", errors="replace"))
            except Cancelled:
                gen.stop_reason = "callback"
                extra = decoded
                break
        if decoded:
            continue
        if constraint is not None and constraint.done:
            gen.stop_reason = "grammar"
            break
        if session.n_past >= session.n_ctx:
            gen.stop_reason = "context_full"
            break
        if drafter is not None:
            ahead, call = drafter.step(tok, room=max_tokens - len(gen.tokens))
            n_ahead = max(0, len(ahead) - 1)
            gen.calls.append(call)
        else:
            session.decode_one(tok)
            gen.calls.append(1)
    if n_ahead + extra:
        _forget(session, gen.calls, n_ahead + extra)
    if drafter is not None:
        drafter.finish()
    gen.text = text
    gen.seconds = time.perf_counter() - t0
    return gen


def _forget(session, calls: list, n: int) -> None:
    """Trim the last `n` decoded tokens, all from the last (verify) call, and record it as keeping fewer."""
    last = calls[-1]
    session.trim(session.n_past - n)
    calls[-1] = {"fed": last["fed"], "kept": last["kept"] - n}
