"""EngineConfig refuses values that would silently change results or crash llama.cpp."""

from __future__ import annotations

import pytest

from kvgraft.engine.config import EngineConfig
from kvgraft.engine.errors import ConfigError


def cfg(**kw):
    return EngineConfig(model_path="m.gguf", **kw)


def test_defaults():
    c = cfg()
    assert (c.n_ctx, c.flash_attn, c.type_k, c.type_v, c.swa_full, c.n_gpu_layers) == (
        8192,
        False,
        "f16",
        "f16",
        True,
        0,
    )
    assert c.n_threads >= 1


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"n_ctx": 8}, "n_ctx"),
        ({"n_batch": 0}, "n_batch"),
        ({"n_ubatch": 1024}, "n_ubatch"),
        ({"n_threads": 0}, "n_threads"),
        ({"flash_attn": None}, "never 'auto'"),
        ({"flash_attn": "auto"}, "never 'auto'"),
        ({"type_k": "f8"}, "type_k"),
        ({"type_v": "q8_0"}, "needs flash attention on"),
        ({"swa_full": False}, "swa_full"),
        ({"n_ctx": 4096.0}, "integer"),
        ({"n_gpu_layers": -1}, "n_gpu_layers"),
    ],
)
def test_refusals(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        cfg(**kw)


def test_frozen():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg().n_ctx = 1


def test_n_ctx_above_trained_context_refused(engine):
    with pytest.raises(ConfigError, match="trained context"):
        engine.with_config(engine.config.replace(n_ctx=engine.model.info.n_ctx_train + 1))
