"""The peers kvgraft is benchmarked against: llama-cpp-python's own state paths (engine/ owns llama_cpp).

`Llama.save_state()` / `load_state()` restore through the plain whole-state path (inexact past
the sliding window, see docs/exact-graft.md); `LlamaDiskCache` pickles the same state to disk.
"""

from __future__ import annotations

import contextlib
import ctypes
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


def llama_cpp_candidates(logits: np.ndarray, params, chosen: list[int]) -> tuple[list[int], np.ndarray]:
    """llama.cpp's own samplers on `logits` (a peer for engine/sampling.py): its penalties having accepted
    `chosen`, then its top-k, top-p and min-p, as llama-server's default chain runs them before the
    temperature. Returns (the surviving token ids, the logits after the penalties, indexed by id)."""
    ensure_backend()
    n = len(logits)
    data = (llama.llama_token_data * n)()
    for i, v in enumerate(np.asarray(logits, dtype=np.float32).tolist()):
        data[i].id, data[i].logit, data[i].p = i, v, 0.0
    arr = llama.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
    samplers = [
        llama.llama_sampler_init_penalties(
            n,
            len(chosen) if params.repeat_last_n < 0 else params.repeat_last_n,  # llama.cpp's -1 is n_ctx
            params.repeat_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        )
    ]
    for tok in chosen:
        llama.llama_sampler_accept(samplers[0], tok)
    llama.llama_sampler_apply(samplers[0], ctypes.byref(arr))
    penalized = np.empty(n, dtype=np.float32)
    for i in range(arr.size):
        penalized[arr.data[i].id] = arr.data[i].logit
    if params.top_k:
        samplers.append(llama.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1:
        samplers.append(llama.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0:
        samplers.append(llama.llama_sampler_init_min_p(params.min_p, 1))
    try:
        for s in samplers[1:]:
            llama.llama_sampler_apply(s, ctypes.byref(arr))
        return [arr.data[i].id for i in range(arr.size)], penalized
    finally:
        for s in samplers:
            llama.llama_sampler_free(s)
