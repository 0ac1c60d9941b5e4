"""A loaded GGUF model: weights, vocabulary and the facts about it the engine needs.

Load it once per process and build as many contexts (sessions) from it as needed; the weights
are read-only and shared. Closing the model frees the weights; every session made from it must
be closed first.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from .bindings import ensure_backend, llama
from .errors import EngineError, ModelLoadError

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
USE_EXTRA_BUFTS = False  # recorded in the engine fingerprint


@dataclass(frozen=True)
class ModelInfo:
    path: str
    sha256: str
    name: str
    architecture: str
    size_bytes: int
    n_layer: int
    n_ctx_train: int
    n_swa: int
    n_vocab: int
    n_gpu_layers: int


class Model:
    """Owns a `llama_model *`. Thread-safe for reads (tokenize, detokenize, info)."""

    def __init__(self, path: str | Path, sha256: str, n_gpu_layers: int = 0) -> None:
        path = Path(path)
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {path}")
        with path.open("rb") as fh:
            if fh.read(4) != GGUF_MAGIC:
                raise ModelLoadError(f"not a GGUF file (bad magic): {path}")
        ensure_backend()
        params = llama.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        # No extra CPU buffer types (AMX / runtime weight repacking). On Intel CPUs with AMX the
        # AMX path of the llama.cpp vendored by llama-cpp-python 0.3.36 segfaults on any batch of
        # more than one token (seen on this project's machines); without it the same plain CPU
        # kernels run on every x86-64 host, which also keeps the bits the same across them.
        params.use_extra_bufts = USE_EXTRA_BUFTS
        ptr = llama.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if not ptr:
            raise ModelLoadError(f"llama.cpp could not load the model: {path}")
        self._ptr = ptr
        self._vocab = llama.llama_model_get_vocab(ptr)
        self._lock = threading.Lock()
        self._sessions = 0
        self.info = ModelInfo(
            path=str(path.resolve()),
            sha256=sha256,
            name=self._meta("general.name") or path.stem,
            architecture=self._meta("general.architecture") or "unknown",
            size_bytes=path.stat().st_size,
            n_layer=llama.llama_model_n_layer(ptr),
            n_ctx_train=llama.llama_model_n_ctx_train(ptr),
            n_swa=llama.llama_model_n_swa(ptr),
            n_vocab=llama.llama_vocab_n_tokens(self._vocab),
            n_gpu_layers=n_gpu_layers,
        )
        self._eog_cache: dict[int, bool] = {}
        log.info(
            "loaded %s (%s, %d layers, n_swa %d)", path.name, self.info.architecture, self.info.n_layer, self.info.n_swa
        )

    # -- raw pointers, for engine modules only -------------------------------------------------
    @property
    def ptr(self):
        if self._ptr is None:
            raise EngineError("model is closed")
        return self._ptr

    @property
    def vocab(self):
        if self._ptr is None:
            raise EngineError("model is closed")
        return self._vocab

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = llama.llama_model_meta_val_str(self._ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    # -- text ----------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Tokens for `text`; special tokens in the text are treated as plain text unless `special`
        (a chat template's rendering, where "<|im_start|>" is meant as the control token)."""
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        while True:
            buf = (llama.llama_token * cap)()
            n = llama.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_bos, special)
            if n >= 0:
                return list(buf[:n])
            cap = -n

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """A token's bytes; a control token's are empty unless `special` (then it is written out)."""
        if not 0 <= token < self.info.n_vocab:
            raise EngineError(f"token id {token} is outside the vocabulary (0..{self.info.n_vocab - 1})")
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_text(self, token: int) -> str:
        """A token as text, control tokens written out ("<bos>"): what a chat template calls bos_token."""
        buf = ctypes.create_string_buffer(256)
        n = llama.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    @property
    def eos(self) -> int:
        return llama.llama_vocab_eos(self.vocab)

    @property
    def chat_template(self) -> str | None:
        """The GGUF's `tokenizer.chat_template` (None when it has none)."""
        if self._ptr is None:
            raise EngineError("model is closed")
        raw = llama.llama_model_chat_template(self._ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def detokenize(self, tokens) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        hit = self._eog_cache.get(token)
        if hit is None:
            hit = self._eog_cache[token] = bool(llama.llama_vocab_is_eog(self.vocab, token))
        return hit

    @property
    def bos(self) -> int:
        return llama.llama_vocab_bos(self.vocab)

    # -- lifetime ------------------------------------------------------------------------------
    def _session_opened(self) -> None:
        with self._lock:
            self._sessions += 1

    def _session_closed(self) -> None:
        with self._lock:
            self._sessions -= 1

    def close(self) -> None:
        with self._lock:
            if self._ptr is None:
                return
            if self._sessions:
                raise EngineError(f"cannot close the model: {self._sessions} session(s) still open")
            llama.llama_model_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
