"""One data dir, one engine configuration (app/core/settings_store.py): what the window saved is what
the CLI and `kvgraft serve` run with, options given on the command line win for that run, and
`kvgraft settings --save` writes them."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kvgraft.app.cli.serve_cmd import serve_cmd
from kvgraft.app.core.runtime import Settings
from kvgraft.app.core.settings_store import save_settings, saved_settings
from kvgraft.entry import cli


def _settings(*args) -> dict:
    r = CliRunner().invoke(cli, ["settings", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_the_cli_runs_with_what_the_data_dir_saved_and_options_win(kvgraft_home):
    out = _settings()
    assert out["saved"] is False and out["settings"] == Settings().to_dict()
    kvgraft_home.mkdir(parents=True, exist_ok=True)
    save_settings(kvgraft_home, Settings(n_ctx=2048, flash_attn=True, type_v="q8_0", n_batch=64, n_ubatch=32))
    out = _settings()
    assert out["saved"] is True
    s = out["settings"]
    assert (s["n_ctx"], s["flash_attn"], s["type_v"], s["n_batch"], s["n_ubatch"]) == (2048, True, "q8_0", 64, 32)
    s = _settings("--no-flash-attn", "--type-v", "f16", "--n-ctx", "1024")["settings"]
    assert (s["n_ctx"], s["flash_attn"], s["type_v"], s["n_batch"]) == (1024, False, "f16", 64)
    assert saved_settings(kvgraft_home).flash_attn is True  # an option is for this run only


def test_settings_save_and_the_embedded_model_by_name(kvgraft_home, tmp_path):
    model = tmp_path / "other.gguf"
    r = CliRunner().invoke(cli, ["settings", "--save", "--model", str(model), "--flash-attn"])
    assert r.exit_code == 0, r.output
    assert saved_settings(kvgraft_home) == Settings(model=model, flash_attn=True)
    assert _settings()["settings"]["model"] == str(model)
    assert _settings("--model", "embedded")["settings"]["model"] is None


def test_doctor_loads_the_engine_with_the_saved_settings(kvgraft_home):
    kvgraft_home.mkdir(parents=True, exist_ok=True)
    save_settings(kvgraft_home, Settings(n_ctx=1024, flash_attn=True))
    r = CliRunner().invoke(cli, ["doctor", "--json"])
    assert r.exit_code == 0, r.output
    cfg = json.loads(r.output[r.output.index("{") :])["config"]
    assert cfg["n_ctx"] == 1024 and cfg["flash_attn"] is True


def test_serve_takes_the_same_options_over_the_same_file():
    names = {p.name for p in serve_cmd.params}
    assert {"model", "n_ctx", "flash_attn", "type_k", "type_v", "n_batch"} <= names
    assert all(p.default is None for p in serve_cmd.params if p.name in ("n_ctx", "flash_attn", "type_k", "model"))
