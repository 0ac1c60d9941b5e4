"""`kvgraft doctor` says whether the graft has been shown exact on this device and under which settings.

The record comes from `kvgraft selftest` (a logits comparison), kept per fingerprint and device in
the model cache (here a temp dir). Runs on a synthetic gemma3 model (scripts/synthetic_gguf.py),
through the real CLI and real llama.cpp; a few seconds.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvgraft.app.core.model_store import model_sha256
from kvgraft.app.maintain.graft_checks import check_words, graft_check_report, graft_check_store, record_selftest
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
from kvgraft.entry import cli
from scripts.synthetic_gguf import write_synthetic_gguf


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_synthetic_gguf(tmp_path_factory.mktemp("gguf") / "gemma3.gguf", "gemma3", seed=3)


@pytest.fixture
def model_cache(tmp_path, monkeypatch):
    cache = tmp_path / "models"
    monkeypatch.setenv("KVGRAFT_MODEL_DIR", str(cache))
    return cache


def _run(*args):
    return CliRunner().invoke(cli, list(args))


def _doctor(model, *extra) -> dict:
    result = _run("doctor", "--json", "--model", str(model), "--n-ctx", "1024", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["graft_check"]


def test_doctor_reports_selftest_under_its_settings(synthetic, model_cache):
    assert _doctor(synthetic)["status"] == "not checked"
    text = _run("doctor", "--model", str(synthetic), "--n-ctx", "1024")
    assert "not shown on this device under these settings: run `kvgraft selftest`" in text.stdout

    st = _run("selftest", "--model", str(synthetic), "--n-ctx", "1024", "--samples", "3", "--seed", "2")
    assert st.exit_code == 0, st.output
    assert (model_cache / "graft-checks.json").is_file()

    report = _doctor(synthetic)
    assert report["status"] == "exact"
    here = report["this_config"]
    assert (here["samples"], here["sha256_equal"], here["tokens_equal"]) == (3, 3, 3)
    assert here["past_sliding_window"] >= 1 and here["n_swa"] == 32
    assert here["settings"]["flash_attn"] is False and here["settings"]["backend"] == "CPU"
    text = _run("doctor", "--model", str(synthetic), "--n-ctx", "1024").stdout
    assert "graft check       shown exact here: 3/3 byte-equal logits" in text
    assert "under CPU, flash attention off, KV f16/f16, batch 512/512" in text

    # flash attention decides the bits: the check above does not cover it, and is listed as another setting
    fa = _doctor(synthetic, "--flash-attn")
    assert fa["status"] == "not checked"
    assert [o["settings"]["flash_attn"] for o in fa["other_settings"]] == [False]
    text = _run("doctor", "--model", str(synthetic), "--n-ctx", "1024", "--flash-attn").stdout
    assert "also checked here: exact under CPU, flash attention off" in text

    # the batch shape is part of the decode schedule: a check at 512/512 is not one at 64/32
    small = _doctor(synthetic, "--batch-size", "64", "--ubatch-size", "32")
    assert small["status"] == "not checked"
    assert [(o["settings"]["n_batch"], o["settings"]["n_ubatch"]) for o in small["other_settings"]] == [(512, 512)]
    st = _run("selftest", "--model", str(synthetic), "--n-ctx", "1024", "--samples", "2", "--flash-attn")
    assert st.exit_code == 0, st.output
    assert _doctor(synthetic, "--flash-attn")["status"] == "exact"
    assert len(_doctor(synthetic, "--flash-attn", "--batch-size", "64")["other_settings"]) == 2


def test_a_failed_check_is_reported_as_not_exact(synthetic, tmp_path):
    engine = Engine.load(EngineConfig(model_path=synthetic, n_ctx=512), model_sha256(synthetic))
    try:
        store = graft_check_store(tmp_path / "checks.json")
        result = {"samples": 2, "sha256_equal": 1, "tokens_equal": 2, "past_sliding_window": 1, "n_swa": 32}
        entry = record_selftest(engine, result, store)
        assert entry["exact"] is False
        report = graft_check_report(engine, store)
        assert report["status"] == "not exact"
        assert check_words(report)[0].startswith("NOT exact here: 1/2 byte-equal logits, 2/2 equal greedy tokens")
        # another model's record on this device is not this model's
        other = write_synthetic_gguf(tmp_path / "other.gguf", "gemma3", seed=4)
        eng2 = Engine.load(EngineConfig(model_path=other, n_ctx=512), model_sha256(other))
        try:
            assert graft_check_report(eng2, store) == {
                "status": "not checked",
                "this_config": None,
                "other_settings": [],
            }
        finally:
            eng2.close()
    finally:
        engine.close()


def test_batch_options_are_validated(synthetic, model_cache):
    result = _run("doctor", "--model", str(synthetic), "--n-ctx", "1024", "--batch-size", "64", "--ubatch-size", "128")
    assert result.exit_code == 3
    assert "n_ubatch must be in 1..n_batch (64), got 128" in result.output


def test_batch_shape_is_in_the_fingerprint_only_on_a_gpu_backend(synthetic, monkeypatch):
    """The rule itself (engine/engine.py); whether a GPU needs it is what the GPU kit measures."""
    engine = Engine.load(EngineConfig(model_path=synthetic, n_ctx=512), model_sha256(synthetic))
    try:
        small = engine.with_config(engine.config.replace(n_batch=64, n_ubatch=64))
        assert "n_batch" not in engine._config_bits()
        assert engine._config_bits() == small._config_bits()
        monkeypatch.setattr(Engine, "backend", property(lambda self: "GPU"))
        assert engine._config_bits()["n_batch"] == 512 and small._config_bits()["n_ubatch"] == 64
        assert engine._config_bits() != small._config_bits()
    finally:
        engine.close()
