"""Choosing the next token from the logits: greedy, or sampled with a temperature, top-p and a seed.

The sampler never touches the logits llama.cpp wrote: it reads the same float32 array greedy decoding
reads (Session.logits), so a graft that gives the fresh bits gives the same choices for a given seed.
Sampling is reproducible: the same logits, parameters and seed choose the same tokens (numpy's PCG64,
one uniform draw per token, the candidates in a stable order). Without a seed, each decode draws its
own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import EngineError

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy (argmax, lowest id on ties)
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature <= 100):
            raise EngineError(f"temperature must be between 0 and 100, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


class Sampler:
    def __init__(self, params: SamplingParams = GREEDY) -> None:
        self.params = params
        self._rng = None if params.greedy else np.random.Generator(np.random.PCG64(params.seed))

    def choose(self, logits: np.ndarray) -> int:
        if self._rng is None:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / self.params.temperature
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        order = np.argsort(-p, kind="stable")  # most likely first, lowest id first on ties
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, self.params.top_p * cum[-1])) + 1]
        weights = np.cumsum(p[keep])
        i = int(np.searchsorted(weights, self._rng.random() * weights[-1], side="right"))
        return int(keep[min(i, len(keep) - 1)])


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
