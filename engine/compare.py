"""Comparing two logit vectors the way the receipts report them."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np


def logits_sha256(logits: np.ndarray) -> str:
    """SHA-256 of the logits as little-endian float32 bytes (the receipts' contract)."""
    return hashlib.sha256(np.ascontiguousarray(logits, dtype="<f4").tobytes()).hexdigest()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


@dataclass(frozen=True)
class LogitsComparison:
    sha256_a: str
    sha256_b: str
    sha256_equal: bool
    kl: float  # KL(a || b) of the softmax distributions, nats
    argmax_a: int
    argmax_b: int
    argmax_agree: bool
    max_abs_diff: float

    def as_dict(self) -> dict:
        return asdict(self)


def compare_logits(a: np.ndarray, b: np.ndarray) -> LogitsComparison:
    if a.shape != b.shape:
        raise ValueError(f"logit shapes differ: {a.shape} vs {b.shape}")
    la, lb = _log_softmax(a), _log_softmax(b)
    kl = float(np.sum(np.exp(la) * (la - lb)))
    ha, hb = logits_sha256(a), logits_sha256(b)
    am, bm = int(np.argmax(a)), int(np.argmax(b))
    return LogitsComparison(
        sha256_a=ha,
        sha256_b=hb,
        sha256_equal=ha == hb,
        kl=max(kl, 0.0) if ha != hb else 0.0,
        argmax_a=am,
        argmax_b=bm,
        argmax_agree=am == bm,
        max_abs_diff=float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))),
    )
