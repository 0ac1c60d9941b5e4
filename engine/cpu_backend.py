"""Which llama.cpp CPU backend runs here: built in, or chosen at load time among per-CPU variants.

The developer's `.venv` builds llama.cpp with `-march=native`: one CPU backend (`libggml-cpu.so`)
linked into `libggml.so`, for the build machine's instruction set only. The portable build the bundle
ships (`GGML_NATIVE=OFF GGML_BACKEND_DL=ON GGML_CPU_ALL_VARIANTS=ON`, packaging/portable_llama.py)
instead holds one `libggml-cpu-<variant>.so` per CPU family (x64, sse42, sandybridge, haswell,
skylakex, icelake, zen4, sapphirerapids, ...) and links none of them: something must load them, and
llama-cpp-python 0.3.36 does not (llama-cpp-python #2069). `load_dispatched` asks ggml to scan the
package's lib folder (`ggml_backend_load_all_from_path`); ggml scores every variant against this
CPU's features and registers the best one.

Different variants make different bits (their kernels differ): the probe hashes decide whether two
builds are compatible, never the variant's name. The name is recorded (`kvgraft doctor`, the engine's
environment) so a user can see which one ran.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import ModelLoadError

VARIANT_GLOB = "libggml-cpu-*.so"
_VARIANT = re.compile(r"libggml-cpu-([A-Za-z0-9_.]+)\.so$")
_BUILT_IN = re.compile(r"libggml-cpu\.so(\.\d+)*$")


@dataclass(frozen=True)
class CpuBackend:
    """kind: "dispatched" (a variant chosen at load time) or "built-in" (compiled for one CPU family);
    variant: the chosen variant's name ("haswell"), None for built-in; library: the loaded file's name
    (never its folder: this goes into the engine's environment, which packs and pushes carry);
    variants: every variant the build holds; sha256: the loaded library's bytes."""

    kind: str
    variant: str | None
    library: str
    variants: tuple[str, ...]
    sha256: str

    def describe(self) -> str:
        if self.kind == "dispatched" and self.variant is None:  # /proc/self/maps unreadable
            return f"one of {len(self.variants)} variants (which one is not visible on this system)"
        if self.kind == "dispatched":
            return (
                f"{self.variant} (chosen at load time among {len(self.variants)} variants: {', '.join(self.variants)})"
            )
        return "built in (compiled for the build machine's CPU)"

    @classmethod
    def from_dict(cls, d: dict) -> "CpuBackend":
        return cls(d["kind"], d["variant"], d["library"], tuple(d["variants"]), d["sha256"])

    def as_dict(self) -> dict:  # variants as a list: equal to the same dict read back from JSON
        return {**asdict(self), "variants": list(self.variants)}


def variant_name(path: str | Path) -> str | None:
    m = _VARIANT.search(str(path))
    return m.group(1) if m else None


def variant_files(lib_dir: Path) -> list[Path]:
    """The per-CPU backend libraries of a portable build (empty for a native build)."""
    return sorted(p for p in lib_dir.glob(VARIANT_GLOB) if variant_name(p.name))


def load_dispatched(lib_dir: Path) -> None:
    """Register the best CPU variant in `lib_dir` (and any other backend library there) with ggml.
    A no-op for a native build. Raises ModelLoadError when no CPU backend could be registered."""
    variants = variant_files(lib_dir)
    if not variants:
        return
    # libllama.so links libggml.so.0 (its soname), already loaded by llama_cpp: the same handle here
    # (the bundle keeps only the soname file of each core library)
    ggml_file = next((p for p in (lib_dir / "libggml.so.0", lib_dir / "libggml.so") if p.exists()), None)
    if ggml_file is None:
        raise ModelLoadError(f"llama.cpp's libggml.so is missing from {lib_dir}")
    ggml = ctypes.CDLL(str(ggml_file))
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path.restype = None
    ggml.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_load_all_from_path(os.fsencode(lib_dir))
    if not ggml.ggml_backend_reg_by_name(b"CPU"):
        names = ", ".join(variant_name(p.name) or p.name for p in variants)
        raise ModelLoadError(
            f"no llama.cpp CPU backend could be loaded from {lib_dir} ({names}): this CPU lacks what even "
            "the x64 variant needs, or a library the variants link is missing (libgomp.so.1, libstdc++.so.6)"
        )


def loaded_variant() -> str | None:
    """The name of the CPU variant this process mapped (None: built in, or not visible)."""
    return next((v for v in map(variant_name, _mapped_libraries()) if v), None)


def _mapped_libraries() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return [f[5].strip() for f in (line.split(None, 5) for line in fh) if len(f) == 6]
    except OSError:
        return []


def _sha256(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def current(lib_dir: Path) -> CpuBackend:
    """The CPU backend this process loaded (Linux: read from /proc/self/maps)."""
    variants = tuple(variant_name(p.name) for p in variant_files(lib_dir))
    mapped = _mapped_libraries()
    loaded = next((m for m in mapped if variant_name(m)), None)
    if loaded is not None:
        return CpuBackend("dispatched", variant_name(loaded), Path(loaded).name, variants, _sha256(loaded))
    if variants:  # a portable build, but the maps do not show which variant is loaded
        return CpuBackend("dispatched", None, "", variants, "")
    built_in = next((m for m in mapped if _BUILT_IN.search(m)), None)
    if built_in is None:
        built_in = str(lib_dir / "libggml-cpu.so")
    return CpuBackend("built-in", None, Path(built_in).name, variants, _sha256(built_in))
