"""The CLI: every command has help and is documented; doctor and selftest report what they claim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import kvgraft.app.cli.common as common
from kvgraft.entry import cli
from scripts.gen_cli_docs import render

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def shared_engine(engine, monkeypatch):
    """CLI commands reuse the session's loaded model instead of loading it again."""
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    return engine


def test_every_command_has_help_and_is_documented():
    runner = CliRunner()
    ctx = cli.make_context("kvgraft", [], resilient_parsing=True)
    docs = (REPO / "docs" / "cli.md").read_text()
    names = cli.list_commands(ctx)
    assert {"doctor", "selftest", "demo"} <= set(names)
    for name in names:
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0, name
        assert cli.get_command(ctx, name).help, f"{name} has no help text"
        assert f"## kvgraft {name}" in docs, f"{name} is not in docs/cli.md"
    assert docs == render(), "docs/cli.md is stale: run scripts/gen_cli_docs.py"


def test_selftest_json(shared_engine):
    result = CliRunner().invoke(cli, ["selftest", "--samples", "2", "--seed", "3", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["samples"] == 2
    for key in ("sha256_equal", "argmax_agree", "tokens_equal"):
        assert out[key] == 2 and isinstance(out[key], int)
    assert out["kl_max"] == 0.0 and out["max_abs_diff"] == 0.0
    assert len(out["details"]) == 2
    assert all(d["fresh_logits_sha256"] == d["graft_logits_sha256"] for d in out["details"])


def test_selftest_lengths_cover_the_window():
    from kvgraft.app.maintain.selftest import sample_lengths

    lengths = sample_lengths(50, seed=0)
    assert len(lengths) == 50 and min(lengths) >= 1 and max(lengths) <= 3000
    assert sum(n > 512 for n in lengths) >= 10
    assert sum(n <= 512 for n in lengths) >= 5


def test_doctor_json_subprocess(model_path, tmp_path):
    """The installed entry point, end to end, in its own process."""
    env = {**os.environ, "KVGRAFT_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-m", "kvgraft", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["model"]["sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert report["model"]["architecture"] == "gemma3"
    assert report["model"]["n_swa"] == 512
    assert report["backend"] in ("CPU", "GPU")
    assert report["data_dir"] == str(tmp_path / "home")
    assert len(report["fingerprint"]) == 64
    assert report["config"]["flash_attn"] is False and report["config"]["n_ctx"] == 8192


def test_missing_model_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(cli, ["doctor", "--model", str(tmp_path / "nope.gguf")])
    assert result.exit_code == 3
    assert "model file not found" in result.stderr


def test_not_a_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(100))
    result = CliRunner().invoke(cli, ["doctor", "--model", str(bad)])
    assert result.exit_code == 3
    assert "not a GGUF file" in result.stderr


def test_home_option_is_the_data_dir(tmp_path, monkeypatch):
    """`kvgraft --home DIR` works in DIR, over $KVGRAFT_HOME; without it the environment decides."""
    monkeypatch.setenv("KVGRAFT_HOME", str(tmp_path / "from-env"))
    runner = CliRunner()
    res = runner.invoke(cli, ["--home", str(tmp_path / "chosen"), "keys", "generate", "me"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "chosen" / "keys" / "me.key").is_file()
    assert not (tmp_path / "from-env" / "keys").exists()
    res = runner.invoke(cli, ["--home", str(tmp_path / "chosen"), "stats", "--json"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "chosen" / "index.db").is_file()
    res = runner.invoke(cli, ["stats", "--json"])
    assert res.exit_code == 0 and (tmp_path / "from-env" / "index.db").is_file()
