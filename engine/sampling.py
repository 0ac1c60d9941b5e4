"""Choosing the next token from the logits: greedy, or sampled with a temperature and a seed, the
candidates cut by top-k, top-p and min-p, the logits first penalized for repeats.

The sampler never touches the logits llama.cpp wrote: it reads the same float32 array greedy decoding
reads (Session.logits) and works on a copy, so a graft that gives the fresh bits gives the same choices
for a given seed. Sampling is reproducible: the same logits, parameters, seed and tokens chosen so far
choose the same tokens (numpy's PCG64, one uniform draw per token, the candidates in a stable order).
Without a seed, each decode draws its own.

Each step follows llama.cpp's samplers, in llama-server's default order:
  1. penalties (llama_sampler_penalties), over the last `repeat_last_n` tokens this generation chose:
     a token seen `c` times has its logit divided by `repeat_penalty` when positive (multiplied when not),
     then lowered by `c * frequency_penalty + presence_penalty`; in float32, as llama.cpp does;
  2. greedy when the temperature is 0: the argmax of the penalized logits (lowest id on ties);
  3. otherwise top-k (the k most likely; 0: all), top-p (the smallest set, most likely first, whose
     probability reaches top_p), min-p (those at least min_p times as likely as the most likely), each
     computed on the untempered probabilities, then the temperature, then one draw.
A penalty reads the tokens chosen before, so a penalized generation decodes one token per call (no
prompt-lookup drafts, whose verify call chooses by argmax: engine/decoding.py).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from .errors import EngineError

MAX_TOP_LOGPROBS = 20
DEFAULT_LAST_N = 64  # llama.cpp's repeat_last_n


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy (argmax, lowest id on ties)
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0  # 0: every token
    min_p: float = 0.0
    repeat_penalty: float = 1.0  # 1: none
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = DEFAULT_LAST_N  # how many of the last chosen tokens the penalties read; -1: all

    def __post_init__(self) -> None:
        def check(ok: bool, what: str, v) -> None:
            if not ok:
                raise EngineError(f"{what}, got {v!r}")

        def number(v) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        t, k, n = self.temperature, self.top_k, self.repeat_last_n
        check(number(t) and 0 <= t <= 100, "temperature must be between 0 and 100", t)
        check(number(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]", self.top_p)
        check(isinstance(k, int) and not isinstance(k, bool) and k >= 0, "top_k must be an integer of at least 0", k)
        check(number(self.min_p) and 0 <= self.min_p <= 1, "min_p must be between 0 and 1", self.min_p)
        rp = self.repeat_penalty
        check(number(rp) and 0 < rp <= 10, "repeat_penalty must be in (0, 10]", rp)
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            check(number(v) and -2 <= v <= 2, f"{name} must be between -2 and 2", v)
        check(isinstance(n, int) and not isinstance(n, bool) and n >= -1, "repeat_last_n must be -1 or more", n)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """The choice depends on the tokens chosen before it."""
        on = self.repeat_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0
        return on and self.repeat_last_n != 0


GREEDY = SamplingParams()


class Sampler:
    """Chooses each token of one generation; `accept` tells it a token chosen (the decode loop calls it
    for every token it keeps, so the penalties read what was generated)."""

    def __init__(self, params: SamplingParams = GREEDY) -> None:
        self.params = params
        self._rng = None if params.greedy else np.random.Generator(np.random.PCG64(params.seed))
        n = params.repeat_last_n
        self._recent: deque[int] = deque(maxlen=None if n < 0 else n)

    def accept(self, token: int) -> None:
        if self.params.penalized:
            self._recent.append(int(token))

    def penalized(self, logits: np.ndarray) -> np.ndarray:
        """The logits after the repeat penalties (the same array when none applies)."""
        p = self.params
        if not p.penalized or not self._recent:
            return logits
        counts = Counter(self._recent)
        ids = np.fromiter(counts, dtype=np.int64, count=len(counts))
        c = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        out = np.array(logits, dtype=np.float32, copy=True)
        z = out[ids]
        z = np.where(z <= 0, z * np.float32(p.repeat_penalty), z / np.float32(p.repeat_penalty)).astype(np.float32)
        z -= c * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
        out[ids] = z
        return out

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the token ids a draw chooses among, most likely first; the penalized logits, float64)."""
        p = self.params
        z = self.penalized(logits).astype(np.float64)
        order = np.argsort(-z, kind="stable")  # most likely first, lowest id first on ties
        if p.top_k:
            order = order[: p.top_k]
        if p.top_p < 1 or p.min_p > 0:
            q = np.exp(z[order] - z[order[0]])
            if p.top_p < 1:
                cum = np.cumsum(q / q.sum())
                order = order[: int(np.searchsorted(cum, p.top_p)) + 1]
            if p.min_p > 0:
                order = order[: int(np.count_nonzero(q[: len(order)] >= p.min_p))]  # q[0] = 1: never empty
        return order, z

    def choose(self, logits: np.ndarray) -> int:
        if self._rng is None:
            return int(np.argmax(self.penalized(logits)))
        order, z = self.candidates(logits)
        w = np.exp((z[order] - z[order[0]]) / self.params.temperature)
        weights = np.cumsum(w)
        i = int(np.searchsorted(weights, self._rng.random() * weights[-1], side="right"))
        return int(order[min(i, len(order) - 1)])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log probabilities of every token (float64, from the float32 logits as they are)."""
    z = logits.astype(np.float64)
    m = z.max()
    return z - (m + math.log(float(np.exp(z - m).sum())))


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the `n` most likely tokens at this step (id, logprob), best first


def token_logprob(logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    lp = log_softmax(logits)
    top: tuple[tuple[int, float], ...] = ()
    if n_top:
        best = np.argsort(-lp, kind="stable")[:n_top]
        top = tuple((int(t), float(lp[t])) for t in best)
    return TokenLogprob(int(token), float(lp[token]), top)
