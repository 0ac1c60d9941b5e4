"""What `kvgraft bench` and `kvgraft selftest` claim: "exact" only from a logits comparison, stored
bytes named as stored, and sliding-window counts only for a model that has a window.

Real model (the session's Gemma 3 270M, n_swa 512), small sizes: the bench's internal functions
are called directly with a few dozen tokens (600 where compaction must actually elide cells)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from click.testing import CliRunner

from kvgraft.app.cli import common
from kvgraft.app.lab import bench, bench_report
from kvgraft.app.maintain import selftest
from kvgraft.engine.compaction import dead_cells
from kvgraft.entry import cli
from kvgraft.library.library import Library


def _quiet(_msg: str) -> None:
    pass


def _rows(results: list[dict]) -> dict[str, dict]:
    return {r["method"]: r for r in results}


# -- 1. fresh's "exact" is a comparison of fresh runs; every "exact" is a comparison or None ---------


def test_fresh_exact_compares_two_fresh_runs(engine, tmp_path):
    with Library(tmp_path / "lib") as lib, Library(tmp_path / "plain") as plain:
        results, extra = bench.prefix_methods(engine, lib, 40, 2, _quiet, plain=plain)
    rows = _rows(results)
    fresh = rows["fresh"]
    assert fresh["deterministic"] is True and fresh["exact"] is True
    assert fresh["distinct_logits_sha256"] == 1
    assert extra["fresh_deterministic"] is True
    assert rows["kvgraft"]["exact"] is True and extra["uncompacted_exact"] is True
    assert extra["graft_logits_sha256"] == extra["fresh_logits_sha256"]
    assert rows["floor"]["exact"] is None


def test_exact_is_false_when_fresh_runs_differ(engine, tmp_path, monkeypatch):
    """Make every logits hash unique: two fresh runs then disagree, so neither fresh nor any graft may say exact."""
    real, counter = bench.logits_sha256, itertools.count()
    monkeypatch.setattr(bench, "logits_sha256", lambda logits: f"{real(logits)}-{next(counter)}")
    with Library(tmp_path / "lib") as lib, Library(tmp_path / "plain") as plain:
        results, extra = bench.prefix_methods(engine, lib, 40, 2, _quiet, plain=plain)
    rows = _rows(results)
    assert rows["fresh"]["exact"] is False and rows["fresh"]["deterministic"] is False
    assert rows["fresh"]["distinct_logits_sha256"] == 2
    assert rows["kvgraft"]["exact"] is False and extra["uncompacted_exact"] is False


def test_one_fresh_run_claims_no_determinism(engine, tmp_path):
    with Library(tmp_path / "lib") as lib:
        results, _ = bench.prefix_methods(engine, lib, 24, 1, _quiet)
    rows = _rows(results)
    assert rows["fresh"]["exact"] is None and rows["fresh"]["deterministic"] is None
    assert rows["kvgraft"]["exact"] is True  # still compared against the one fresh run


def test_markdown_says_what_fresh_exact_means(engine, tmp_path):
    with Library(tmp_path / "lib") as lib:
        results, _ = bench.prefix_methods(engine, lib, 24, 2, _quiet)
    res = {"results": results}
    text = bench_report.method_table(res)
    assert "| fresh |" in text and "exact" in text
    assert "SHA-256-equal to each other" in text


# -- 2. the KV-type table: state bytes and stored (compacted) bytes, each named ----------------------


def test_kv_types_reports_stored_and_state_bytes(engine):
    n = 600  # past the 512-token window: 88 dead cells in the window layers are elided
    (row,) = bench.kv_types(engine, _quiet, n=n, kinds=(("f16", "f16", False),))
    assert row["prefix_tokens"] == n and row["graft_exact"] is True
    # the whole state: K and V of every cell, plus a header and per-cell metadata (position, sequence ids)
    assert n * engine.layout.bytes_per_token() < row["state_bytes"] < n * (engine.layout.bytes_per_token() + 64)
    assert row["state_bytes_per_token"] == row["state_bytes"] / n
    w = engine.window
    elided = dead_cells(n, w.n_swa) * sum(engine.layout.caches[c].bytes_per_cell() for c in w.swa_caches)
    assert elided > 0 and row["elided_bytes"] == elided
    # stored = container header (fixed part + 16 bytes per elided range) + the live bytes. A window layer
    # elides at most one K range and one V range per element row (V transposed without flash attention).
    max_ranges = sum(
        1 + (v[2] if engine.layout.caches[c].v_trans else 1)
        for c in w.swa_caches
        for v in engine.layout.caches[c].v_rows
    )
    header = row["stored_bytes"] - (row["state_bytes"] - elided)
    assert 0 < header <= 64 + 16 * max_ranges
    assert row["stored_bytes_per_token"] == row["stored_bytes"] / n < row["state_bytes_per_token"]
    assert row["graft_logits_sha256"] == row["fresh_logits_sha256"]  # the stored blob, read back and grafted
    assert "bytes_per_token" not in row  # the old ambiguous name is gone


# -- 3. the selftest counts "past the sliding window" only for a model with one ---------------------


class _NoWindowModel:
    """The real model, reporting n_swa 0 (as a llama-architecture model does)."""

    def __init__(self, model) -> None:
        self._model = model
        self.info = dataclasses.replace(model.info, n_swa=0)

    def __getattr__(self, name):
        return getattr(self._model, name)


class _NoWindowEngine:
    def __init__(self, engine) -> None:
        self._engine = engine
        self.model = _NoWindowModel(engine.model)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_past_window_count_needs_a_window():
    lengths = [1, 100, 512, 513, 3000]
    assert selftest.count_past_window(lengths, 512) == 2
    assert selftest.count_past_window(lengths, 1024) == 1
    assert selftest.count_past_window(lengths, 0) is None


def test_selftest_without_window_counts_none(engine, monkeypatch):
    monkeypatch.setattr(selftest, "MAX_PREFIX", 40)
    res = selftest.run_selftest(_NoWindowEngine(engine), 2, seed=1, n_gen=2)
    assert res.n_swa == 0 and res.past_sliding_window is None
    assert res.sha256_equal == 2


def test_selftest_real_window_still_counts(engine, monkeypatch):
    monkeypatch.setattr(selftest, "MAX_PREFIX", 40)
    res = selftest.run_selftest(engine, 2, seed=1, n_gen=2)
    assert res.n_swa == 512 and res.past_sliding_window == 0


@pytest.mark.parametrize("no_window", [True, False])
def test_selftest_cli_text_names_the_window(engine, monkeypatch, no_window):
    monkeypatch.setattr(selftest, "MAX_PREFIX", 40)
    e = _NoWindowEngine(engine) if no_window else engine
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: e)
    result = CliRunner().invoke(cli, ["selftest", "--samples", "2", "--seed", "1"])
    assert result.exit_code == 0, result.output
    if no_window:
        assert "the model has no sliding window" in result.stdout
        assert "past the" not in result.stdout
    else:
        assert "0 prefixes past the 512-token window" in result.stdout
