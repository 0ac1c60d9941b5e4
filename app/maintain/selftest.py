"""`kvgraft selftest`: the paper's exactness experiment on the loaded model."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.engine.engine import Engine
from kvgraft.engine.exactness import ExactnessRecord, graft_vs_fresh

PROBE_TEXT = " Question: which word in the text above came up most often, and why? Answer:"
MAX_PREFIX = 3000


def sample_lengths(n: int, seed: int, max_len: int = MAX_PREFIX) -> list[int]:
    """n prefix lengths spread over 1..max_len: one drawn from each of n equal strata, so at
    least four fifths of them lie past the 512-token sliding window when max_len is 3000."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lo = 1 + (max_len - 1) * i // n
        hi = max(lo, (max_len - 1) * (i + 1) // n)
        out.append(rng.randint(lo, hi))
    return out


def count_past_window(lengths: list[int], n_swa: int) -> int | None:
    """How many prefix lengths exceed the model's sliding window (n_swa tokens); None for a model
    without one (n_swa 0, e.g. llama): "past the window" means nothing there."""
    if n_swa <= 0:
        return None
    return sum(1 for n in lengths if n > n_swa)


@dataclass(frozen=True)
class SelftestResult:
    """Graft vs fresh on `samples` random prefixes: how many were byte-equal, and each sample's record."""

    samples: int
    seed: int
    n_swa: int
    past_sliding_window: int | None  # None: the model has no sliding window
    sha256_equal: int
    argmax_agree: int
    tokens_equal: int
    kl_max: float
    max_abs_diff: float
    fingerprint: str
    fingerprint_info: dict
    details: tuple[ExactnessRecord, ...]

    @property
    def exact(self) -> bool:
        """Every sample's logits SHA-256-equal and its greedy tokens equal (what exit 0 claims)."""
        return self.sha256_equal == self.samples and self.tokens_equal == self.samples

    def as_dict(self) -> dict:
        """`kvgraft selftest --json`."""
        return {
            "samples": self.samples,
            "seed": self.seed,
            "n_swa": self.n_swa,
            "past_sliding_window": self.past_sliding_window,
            "sha256_equal": self.sha256_equal,
            "argmax_agree": self.argmax_agree,
            "tokens_equal": self.tokens_equal,
            "kl_max": self.kl_max,
            "max_abs_diff": self.max_abs_diff,
            "fingerprint": self.fingerprint,
            "fingerprint_info": self.fingerprint_info,
            "details": [d.as_dict() for d in self.details],
        }


def summary_line(result: SelftestResult) -> str:
    """The one-line human summary `kvgraft selftest` prints."""
    n = result.samples
    window = (
        "the model has no sliding window"
        if result.past_sliding_window is None
        else f"{result.past_sliding_window} prefixes past the {result.n_swa}-token window"
    )
    return (
        f"{result.sha256_equal}/{n} byte-equal logits, {result.tokens_equal}/{n} equal greedy tokens, "
        f"{result.argmax_agree}/{n} argmax agree; max KL {result.kl_max:.3g}, "
        f"max |diff| {result.max_abs_diff:.3g} ({window})"
    )


def run_selftest(
    engine: Engine,
    samples: int,
    seed: int = 0,
    n_gen: int = 16,
    on_sample: Callable[[int, int, ExactnessRecord], None] | None = None,
) -> SelftestResult:
    if samples < 1:
        raise ValueError("samples must be at least 1")
    max_len = min(MAX_PREFIX, engine.config.n_ctx - 64 - n_gen)
    lengths = sample_lengths(samples, seed, max_len)
    probe = engine.model.tokenize(PROBE_TEXT, add_bos=False)
    details = []
    for i, n in enumerate(lengths):
        rec = graft_vs_fresh(engine, prefix_tokens(engine.model, n, seed=seed * 100_003 + i), probe, n_gen)
        details.append(rec)
        if on_sample:
            on_sample(i + 1, samples, rec)
    n_swa = int(engine.model.info.n_swa)
    return SelftestResult(
        samples=samples,
        seed=seed,
        n_swa=n_swa,
        past_sliding_window=count_past_window(lengths, n_swa),
        sha256_equal=sum(d.sha256_equal for d in details),
        argmax_agree=sum(d.argmax_agree for d in details),
        tokens_equal=sum(d.tokens_equal for d in details),
        kl_max=max(d.kl for d in details),
        max_abs_diff=max(d.max_abs_diff for d in details),
        fingerprint=engine.fingerprint,
        fingerprint_info=engine.fingerprint_info,
        details=tuple(details),
    )
