"""Slow cases, skipped by CI (`make test-slow` runs them): long prefixes and the full selftest."""

from __future__ import annotations

import pytest

from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.app.maintain.selftest import run_selftest
from kvgraft.engine.exactness import graft_vs_fresh

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
@pytest.mark.parametrize("n", [4096, 8192])
def test_graft_is_byte_exact_at_long_prefixes(engine, probe, n, flash_attn):
    eng = engine.with_config(engine.config.replace(n_ctx=16384, flash_attn=flash_attn))
    rec = graft_vs_fresh(eng, prefix_tokens(eng.model, n, seed=n), probe, n_gen=16)
    assert rec.sha256_equal and rec.tokens_equal, f"max |diff| {rec.max_abs_diff}"


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
@pytest.mark.parametrize("n", [4096, 8192])
def test_compacted_graft_is_exact_at_long_prefixes(engine, n, flash_attn):
    from tests.test_compaction import check_compacted_graft

    check_compacted_graft(engine.with_config(engine.config.replace(n_ctx=16384, flash_attn=flash_attn)), n)


def test_selftest_fifty_samples(engine):
    out = run_selftest(engine, 50, seed=0)
    assert out.sha256_equal == 50 and out.tokens_equal == 50 and out.past_sliding_window >= 10
