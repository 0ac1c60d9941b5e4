"""Synthetic GGUF models (scripts/synthetic_gguf.py) through real llama.cpp, via kvgraft's engine.

The files are deterministic (same seed, same bytes), load as the architecture they claim (gemma3 with
llama.cpp's own window pattern: one global layer in six, a 32-token window; llama with none), graft
byte-exactly past the window with flash attention off and on, compact only where there is a window,
and carry the chat template they were written with. Each model is ~2 MB and written once per module.
"""

from __future__ import annotations

import hashlib

import gguf
import pytest

from kvgraft.app.core.model_store import model_sha256
from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
from kvgraft.engine.exactness import graft_vs_fresh
from scripts.synthetic_gguf import CHAT_TEMPLATE, N_CTX_TRAIN, N_SWA, N_VOCAB, SHAPES, main, write_synthetic_gguf

N_CTX = 1024  # the tests' contexts: small, fast to allocate
PREFIX = 200  # tokens: 168 past the gemma3 window
PROBE = " Question: which word in the text above came up most often, and why? Answer:"


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{"gemma3": path, "llama": path}: seed 0, gemma3 with the chat template, llama without."""
    root = tmp_path_factory.mktemp("synthetic-gguf")
    return {
        "gemma3": write_synthetic_gguf(root / "gemma3.gguf", "gemma3", seed=0, chat_template=True),
        "llama": write_synthetic_gguf(root / "llama.gguf", "llama", seed=0),
    }


@pytest.fixture(scope="module")
def engines(models):
    """One loaded Engine per architecture (flash attention off, n_ctx N_CTX)."""
    loaded = {
        arch: Engine.load(EngineConfig(model_path=path, n_ctx=N_CTX), model_sha256(path))
        for arch, path in models.items()
    }
    yield loaded
    for eng in loaded.values():
        eng.close()


# -- the file ----------------------------------------------------------------------------------
def test_same_seed_same_bytes_other_seed_other_bytes(models, tmp_path):
    again = write_synthetic_gguf(tmp_path / "again.gguf", "gemma3", seed=0, chat_template=True)
    other = write_synthetic_gguf(tmp_path / "other.gguf", "gemma3", seed=1, chat_template=True)
    assert again.read_bytes() == models["gemma3"].read_bytes()
    assert _sha(other) != _sha(models["gemma3"])
    assert other.stat().st_size == models["gemma3"].stat().st_size  # only the weights differ


def test_models_are_small(models):
    for path in models.values():
        assert path.stat().st_size < 4_000_000


def test_cli_writes_the_same_file(models, tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert main(["--arch", "llama", "-o", str(out), "--seed", "0"]) == 0
    assert out.read_bytes() == models["llama"].read_bytes()
    assert "llama, seed 0" in capsys.readouterr().out


def test_unknown_arch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="arch must be one of"):
        write_synthetic_gguf(tmp_path / "x.gguf", "mistral")


def test_chat_template_reads_back(models):
    fields = gguf.GGUFReader(models["gemma3"]).fields
    assert fields["tokenizer.chat_template"].contents() == CHAT_TEMPLATE
    assert "tokenizer.chat_template" not in gguf.GGUFReader(models["llama"]).fields


def test_chat_template_renders_role_markers():
    jinja2 = pytest.importorskip("jinja2")
    text = jinja2.Template(CHAT_TEMPLATE).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# -- llama.cpp reads it as what it claims ------------------------------------------------------
@pytest.mark.parametrize(
    "arch, n_swa, caches",
    [("gemma3", N_SWA, [1, 5]), ("llama", 0, [4])],  # gemma3: layer 5 global, layers 0-4 windowed
)
def test_loads_as_its_architecture(engines, arch, n_swa, caches):
    eng = engines[arch]
    info = eng.model.info
    assert (info.architecture, info.n_swa, info.n_layer) == (arch, n_swa, SHAPES[arch].n_layer)
    assert (info.n_vocab, info.n_ctx_train) == (N_VOCAB, N_CTX_TRAIN)
    # a snapshot holds one KV cache per kind of layer: global first, then the window's
    assert [len(cache.k_rows) for cache in eng.layout.caches] == caches


def test_tokenizer_merges_word_pieces(engines):
    model = engines["gemma3"].model
    toks = model.tokenize(" which word", add_bos=True)
    assert toks[0] == model.bos
    assert [model.token_bytes(t) for t in toks[1:]] == [b" which", b" word"]
    assert model.detokenize(model.tokenize(PROBE, add_bos=False)) == PROBE


def test_compaction_active_only_with_a_window(engines):
    assert engines["gemma3"].window.as_dict() == {"n_swa": N_SWA, "swa_caches": [1]}
    assert engines["gemma3"].window.active
    assert not engines["llama"].window.active


# -- exactness past the window -----------------------------------------------------------------
@pytest.mark.parametrize("arch", ["gemma3", "llama"])
@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_graft_is_exact_past_the_window(engines, arch, flash_attn):
    eng = engines[arch].with_config(engines[arch].config.replace(flash_attn=flash_attn))
    probe = eng.model.tokenize(PROBE, add_bos=False)
    rec = graft_vs_fresh(eng, prefix_tokens(eng.model, PREFIX, seed=7), probe, n_gen=8)
    assert rec.prefix_tokens == PREFIX > N_SWA
    assert rec.sha256_equal, rec.as_dict()
    assert rec.tokens_equal and rec.max_abs_diff == 0.0


def test_snapshot_is_compacted_only_with_a_window(engines):
    """gemma3's canonical snapshot zeroes the dead window cells (bytes llama.cpp wrote non-zero), and
    the graft above is exact from that canonical form; llama's snapshot is llama.cpp's bytes."""
    for arch, compacts in (("gemma3", True), ("llama", False)):
        with engines[arch].session() as s:
            s.prefill(prefix_tokens(s.engine.model, PREFIX, seed=7))
            raw = s.state_bytes()
            snap = s.snapshot()
        assert (len(snap.elided) > 0) is compacts
        assert (bytes(snap.data) != raw) is compacts


def test_logits_depend_on_tokens_behind_the_window(engines):
    """The exactness check can fail: change only the first text token of a prefix (far behind the
    window) and the global layer carries it to different logits."""
    eng = engines["gemma3"]
    probe = eng.model.tokenize(PROBE, add_bos=False)
    prefix = prefix_tokens(eng.model, PREFIX, seed=7)
    changed = [prefix[0], prefix[1] + 1 if prefix[1] + 1 < N_VOCAB else prefix[1] - 1, *prefix[2:]]
    logits = []
    for tokens in (prefix, changed):
        with eng.session() as s:
            s.prefill(tokens + probe)
            logits.append(s.logits().tobytes())
    assert logits[0] != logits[1]


def test_the_bits_are_a_function_of_the_schedule(engines):
    """What kvgraft relies on, on whatever CPU runs it: one decode schedule (batch and micro-batch
    sizes) gives one set of bits, run after run, flash attention off and on. Whether two schedules
    agree is the kernels' business and differs between builds (measured on one CPU build: with flash
    attention on, 64-token micro-batches gave other bits than one micro-batch of 300; with it off,
    the same), which is why every entry records its schedule and a replay follows it
    (app/proof/replay.py), and why `kvgraft doctor` names the batch shape of a check."""
    eng = engines["gemma3"]
    tokens = prefix_tokens(eng.model, 300, seed=5)
    for flash_attn in (False, True):
        for n_ubatch in (512, 64):
            cfg = eng.config.replace(flash_attn=flash_attn, n_batch=512, n_ubatch=n_ubatch)
            runs = set()
            for _ in range(2):
                with eng.with_config(cfg).session() as s:
                    s.prefill(tokens)
                    runs.add((s.logits().tobytes(), s.snapshot().sha256))
            assert len(runs) == 1, f"flash_attn={flash_attn}, n_ubatch={n_ubatch}: two runs of one schedule differ"
