"""The one module that imports llama_cpp: backend start-up and llama.cpp log routing.

llama.cpp writes its logs to stderr by default; kvgraft routes them to the `kvgraft.llama`
logger instead (DEBUG for info lines, WARNING/ERROR as they are), so the CLI and the app decide
what the user sees.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from pathlib import Path

from . import switches as _switches

# The same bits however the tokens are batched (docs/exact-graft.md, "The switches"): llama.cpp picks
# kernels by the rows in a call, and they sum in other orders. engine/switches.py names the settings
# that send every row count through one kernel; llama.cpp reads them once per process, so the mode is
# applied here, before llama_cpp loads. KVGRAFT_BATCH_INVARIANT=0 leaves llama.cpp's own switches (the
# probe then finds the engine not invariant and today's schedules stay: the fallback, tested in a
# subprocess); a mode's name picks that mode.
SWITCH_MODE = _switches.apply(os.environ)

import llama_cpp as llama  # noqa: E402, F401  (re-exported for the engine modules)

from . import cpu_backend as _cpu  # noqa: E402

log = logging.getLogger("kvgraft.llama")

# ggml_log_level (ggml.h): 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line.
# llama.cpp's info lines are chatty model-loading detail: kvgraft logs them at DEBUG.
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR, 5: logging.DEBUG}
# Lines llama.cpp logs as warnings that are expected with kvgraft's settings: logged at DEBUG.
_EXPECTED_WARNINGS = (
    "using full-size SWA cache",  # swa_full=True is deliberate (exact own-position grafts)
    "control-looking token",  # a known quirk of the Gemma 3 vocabulary, harmless
)
_started = False
_lock = threading.Lock()
_pending = [""]


@llama.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    try:
        piece = text.decode("utf-8", errors="replace") if text else ""
        _pending[0] += piece
        if not _pending[0].endswith("\n"):
            return
        line, _pending[0] = _pending[0].rstrip("\n"), ""
        if line:
            lvl = _LEVELS.get(level, logging.DEBUG)
            if lvl == logging.WARNING and any(w in line for w in _EXPECTED_WARNINGS):
                lvl = logging.DEBUG
            log.log(lvl, "%s", line)
    except Exception:  # noqa: BLE001 (never let an exception cross into C)
        pass


def ensure_backend() -> None:
    """Initialise the llama.cpp backend once per process and route its logs."""
    global _started
    with _lock:
        if _started:
            return
        llama.llama_log_set(_log_callback, ctypes.c_void_p(0))
        _cpu.load_dispatched(lib_dir())  # a portable build: register the best CPU variant (no-op when built in)
        _switches.for_variant(os.environ, SWITCH_MODE, _cpu.loaded_variant())
        llama.llama_backend_init()
        _started = True


def lib_dir() -> Path:
    """llama-cpp-python's shared libraries: llama_cpp/lib (in the bundle too), or the folder
    LLAMA_CPP_LIB_PATH names, where llama_cpp then loaded them from (the measuring scripts' other builds)."""
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        return Path(os.environ["LLAMA_CPP_LIB_PATH"]).resolve()
    return Path(llama.__file__).resolve().parent / "lib"


@functools.cache
def cpu_backend() -> _cpu.CpuBackend:
    """The CPU backend this process runs (engine/cpu_backend.py); starts the backend first. Found once
    per process (it reads /proc/self/maps and hashes the library), not once per Engine."""
    ensure_backend()
    return _cpu.current(lib_dir())


def system_info() -> str:
    raw = llama.llama_print_system_info()
    return raw.decode("utf-8", errors="replace").strip() if raw else ""


def supports_gpu_offload() -> bool:
    return bool(llama.llama_supports_gpu_offload())


def package_version() -> str:
    return getattr(llama, "__version__", "unknown")
