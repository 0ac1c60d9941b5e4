"""A snapshot's SHA-256 is a pure function of (model, tokens, KV type, flash attention) on one CPU build."""

from __future__ import annotations

import pytest

from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.engine.compare import compare_logits

N = 700  # past the sliding window


@pytest.fixture(scope="module")
def tokens(engine):
    return prefix_tokens(engine.model, N, seed=42)


@pytest.fixture(scope="module")
def reference(engine, tokens):
    with engine.session() as s:
        s.prefill(tokens)
        return s.snapshot()


def _snapshot(engine, tokens, **changes):
    eng = engine.with_config(engine.config.replace(**changes))
    with eng.session() as s:
        s.prefill(tokens)
        snap = s.snapshot()
    assert eng.fingerprint == engine.fingerprint, "threads/batch/n_ctx must not enter the CPU fingerprint"
    return snap


@pytest.mark.parametrize(
    "changes",
    [
        {"n_threads": 1},
        {"n_threads": 2},
        {"n_batch": 128, "n_ubatch": 128},
        {"n_batch": 512, "n_ubatch": 128},
        {"n_ctx": 4096},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_snapshot_hash_is_invariant(engine, tokens, reference, changes):
    assert _snapshot(engine, tokens, **changes).sha256 == reference.sha256


def test_snapshot_from_4096_grafts_exactly_into_8192(engine, tokens, probe):
    small = engine.with_config(engine.config.replace(n_ctx=4096))
    with small.session() as s:
        s.prefill(tokens)
        snap = s.snapshot()
        s.prefill(probe)
        fresh = s.logits()
    assert engine.config.n_ctx == 8192
    with engine.session() as g:
        g.graft(snap)
        g.prefill(probe)
        assert compare_logits(fresh, g.logits()).sha256_equal


def test_flash_attention_changes_the_snapshot(engine, engine_fa, tokens, reference):
    """Flash attention decides the V layout (and the bits): it must be part of the fingerprint."""
    with engine_fa.session() as s:
        s.prefill(tokens)
        snap = s.snapshot()
    assert snap.sha256 != reference.sha256
    assert engine_fa.fingerprint != engine.fingerprint
