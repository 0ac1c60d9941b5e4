"""The peers kvgraft is benchmarked against: llama-cpp-python's own state paths (engine/ owns llama_cpp).

`Llama.save_state()` / `load_state()` restore through the plain whole-state path (inexact past
the sliding window, see docs/exact-graft.md); `LlamaDiskCache` pickles the same state to disk.
"""

from __future__ import annotations

import contextlib
import tempfile
import time

import numpy as np

from .bindings import ensure_backend, llama
from .compare import logits_sha256
from .config import EngineConfig
from .model import USE_EXTRA_BUFTS


@contextlib.contextmanager
def _no_extra_bufts():
    """Llama() takes no model-params override; load it as kvgraft does (no AMX path: it segfaults here)."""
    import llama_cpp.llama_cpp as raw

    real = raw.llama_model_default_params

    def patched():
        p = real()
        p.use_extra_bufts = USE_EXTRA_BUFTS
        return p

    raw.llama_model_default_params = patched
    try:
        yield
    finally:
        raw.llama_model_default_params = real


class LlamaCppPythonPeer:
    def __init__(self, config: EngineConfig) -> None:
        ensure_backend()
        with _no_extra_bufts():
            self.llm = llama.Llama(
                model_path=str(config.model_path),
                n_ctx=config.n_ctx,
                n_batch=config.n_batch,
                n_ubatch=config.n_ubatch,
                n_threads=config.n_threads,
                n_threads_batch=config.n_threads,
                flash_attn=config.flash_attn,
                swa_full=True,
                verbose=False,
            )
        self.n_vocab = self.llm.n_vocab()
        self._dir = tempfile.TemporaryDirectory(prefix="kvgraft-peer-cache-")
        self.disk = llama.LlamaDiskCache(cache_dir=self._dir.name, capacity_bytes=64 << 30)

    def _last_logits(self) -> np.ndarray:
        ptr = llama.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def fresh(self, tokens: list[int]) -> tuple[float, str]:
        """Time to first token for prefix + question from scratch, and the logits' SHA-256."""
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(tokens)
        logits = self._last_logits()
        return time.perf_counter() - t0, logits_sha256(logits)

    def save_prefix(self, prefix: list[int]):
        self.llm.reset()
        self.llm.eval(prefix)
        return self.llm.save_state()

    def state_ttft(self, state, question: list[int]) -> tuple[float, str]:
        """load_state() then prefill the question: time to first token, logits SHA-256."""
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.load_state(state)
        self.llm.eval(question)
        logits = self._last_logits()
        return time.perf_counter() - t0, logits_sha256(logits)

    def disk_cache_ttft(self, key: tuple, state, question: list[int]) -> tuple[float, str]:
        """LlamaDiskCache round trip: the state is stored (untimed), then fetched, loaded, and the
        question prefilled."""
        self.disk[key] = state  # __getitem__ deletes the entry it returns: store it again every run
        self.llm.reset()
        t0 = time.perf_counter()
        loaded = self.disk[key]
        self.llm.load_state(loaded)
        self.llm.eval(question)
        logits = self._last_logits()
        return time.perf_counter() - t0, logits_sha256(logits)

    def close(self) -> None:
        self.llm.close()
        self._dir.cleanup()
