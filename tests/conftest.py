"""Shared fixtures. The real model is loaded once per test session; every test gets a temp data dir."""

from __future__ import annotations

import gc
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def kvgraft_home(tmp_path, monkeypatch):
    """No test touches a real data dir: KVGRAFT_HOME points at a fresh temp dir."""
    home = tmp_path / "kvgraft-home"
    monkeypatch.setenv("KVGRAFT_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def model_path():
    from kvgraft.app.core.model_store import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def engine(model_path):
    """The real Gemma 3 270M, default config (flash attention off, f16 KV, n_ctx 8192)."""
    from kvgraft.app.core.model_store import model_sha256
    from kvgraft.engine.config import EngineConfig
    from kvgraft.engine.engine import Engine

    eng = Engine.load(EngineConfig(model_path=model_path), model_sha256(model_path))
    yield eng
    gc.collect()  # services dropped in reference cycles (exception tracebacks) free their warm contexts
    eng.close()


@pytest.fixture(scope="session")
def engine_fa(engine):
    """Same loaded model, flash attention on."""
    return engine.with_config(engine.config.replace(flash_attn=True))


@pytest.fixture(scope="session")
def probe(engine):
    return engine.model.tokenize(" Question: which word came up most often above? Answer:", add_bos=False)
