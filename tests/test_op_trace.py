"""The op trace (engine/op_trace.py, scripts/op_trace.py): every computed op of a decode, token by token.

On the real Gemma 3 270M: in the engine's mode each op's bits are one call's however the tokens are cut
(flash attention off and on, f16 and q8_0 KV); with llama.cpp's own switches (a subprocess: they are
read once per process) the trace finds the ops where the bits part, and they are the products whose
kernel llama.cpp picks by the rows in the call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.engine import op_trace
from kvgraft.engine.errors import EngineError
from kvgraft.engine.switches import SWITCH, VARIABLES

REPO = Path(__file__).resolve().parent.parent
CALLS = [1, 2, 13, 17]  # 33 tokens: a one-token call, the small-row kernel, the tiled kernel


@pytest.fixture(scope="module")
def small(engine):
    return engine.with_config(engine.config.replace(n_ctx=1024))


@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(flash_attn=True),
        pytest.param(dict(flash_attn=True, type_k="q8_0", type_v="q8_0"), marks=pytest.mark.slow),
    ],
    ids=["fa-off-f16", "fa-on-f16", "fa-on-q8_0"],
)
def test_in_the_engines_mode_every_op_gives_one_calls_bits(small, changes):
    eng = small.with_config(small.config.replace(**changes))
    tokens = prefix_tokens(eng.model, sum(CALLS), seed=7)
    one, split = op_trace.trace(eng, tokens, [sum(CALLS)]), op_trace.trace(eng, tokens, CALLS)
    verdicts = {v.label: v for v in op_trace.compare(one, split)}
    weights = {v.split(" ")[1] for v in verdicts if v.startswith("MUL_MAT ")}
    assert {"q4_K", "q6_K", "q5_0", "q8_0"} <= weights, verdicts.keys()  # the 270M's weight types, each traced
    attention = "FLASH_ATTN_EXT" if eng.config.flash_attn else "SOFT_MAX"
    assert attention in verdicts and "RMS_NORM" in verdicts and "ROPE" in verdicts
    for v in verdicts.values():
        assert v.equal == v.compared, f"{v.label}: {v.compared - v.equal} rows differ, first at {v.first}"
    compared = sum(v.compared for v in verdicts.values())
    assert compared > 400 * sum(CALLS), "most ops were compared token by token"
    # every position of every node with a token dimension was seen in both traces
    for key, rows in one.items():
        if rows.shape is not None:
            assert set(rows.rows) == set(range(sum(CALLS))) == set(split[key].rows), key


def test_a_trace_refuses_calls_that_do_not_cut_the_tokens(small):
    tokens = prefix_tokens(small.model, 12, seed=1)
    with pytest.raises(EngineError, match="do not cut"):
        op_trace.trace(small, tokens, [5, 5])
    with pytest.raises(EngineError, match="n_batch"):
        op_trace.trace(small, tokens * 100, [1200])


UPSTREAM = """
import json
from kvgraft.app.core.model_store import embedded_model_path, model_sha256
from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.engine import op_trace
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
path = embedded_model_path()
eng = Engine.load(EngineConfig(model_path=path, n_ctx=1024), model_sha256(path))
tokens = prefix_tokens(eng.model, 40, seed=7)
one, split = op_trace.trace(eng, tokens, [40]), op_trace.trace(eng, tokens, [1] * 3 + [5, 32])
print(json.dumps([[v.label, v.compared, v.equal, v.origins] for v in op_trace.compare(one, split)]))
"""


def test_with_llamas_own_switches_the_trace_names_the_products_where_the_bits_part():
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env[SWITCH] = "0"
    out = subprocess.run(
        [sys.executable, "-c", UPSTREAM], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    verdicts = json.loads(out.stdout.strip().splitlines()[-1])
    origins = {label for label, _, _, n in verdicts if n}
    assert origins, "with llama.cpp's own switches some op's bits depend on the rows in the call"
    assert all(label.startswith("MUL_MAT") for label in origins), origins  # kernels picked by row count
    differ = {label for label, compared, equal, _ in verdicts if equal < compared}
    assert differ > origins, "what a product changed, the ops after it carry"
