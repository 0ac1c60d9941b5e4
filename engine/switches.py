"""llama.cpp's row-count switches and the settings that close them (docs/exact-graft.md, "The switches").

No llama import here: engine/bindings.py applies a mode before llama_cpp loads (llama.cpp reads these
variables once per process), and the measuring scripts (scripts/batch_invariance.py,
scripts/bench_invariance.py) set them for the processes they start.

Each invariant mode sends every row count of a call through the same kernels:
  tiled-small  the tiled K-quant kernel's bits for every row count: more than 16 rows through the tiled
            kernel, 1-16 through the small-row kernel of our patch (GGML_CPU_TILED_SMALL=1,
            packaging/llama-cpp-python/tiled-small-rows.patch); sgemm for every n for float weights
            (GGML_CPU_SGEMM=float), upstream's sgemm switch for Q8_0/Q5_0, whose two kernels sum alike
  tiled     the tiled K-quant kernel for every row count (GGML_CPU_TILED_MM_FORCE=1: its narrow path
            for 1-16 rows, slow), sgemm for every n
  per-row   the per-row K-quant dot products for every row count (GGML_CPU_TILED_MM=0), sgemm for every n
  per-row-no-sgemm   per-row K-quant, and ggml's per-row dot products instead of sgemm for every n
Flash attention takes its one_chunk path for every call in each (GGML_CPU_FA_ONE_PATH=1, our patch).
`upstream` leaves llama.cpp's own switches: not invariant (the fallback).
"""

from __future__ import annotations

SWITCH = "KVGRAFT_BATCH_INVARIANT"  # "0": upstream; a mode name: that mode; unset: MODE
VARIABLES = (
    "GGML_CPU_TILED_MM",
    "GGML_CPU_TILED_MM_FORCE",
    "GGML_CPU_TILED_SMALL",
    "GGML_CPU_SGEMM",
    "GGML_CPU_FA_ONE_PATH",
)

MODES = {
    "tiled-small": {"GGML_CPU_TILED_SMALL": "1", "GGML_CPU_SGEMM": "float", "GGML_CPU_FA_ONE_PATH": "1"},
    "tiled": {"GGML_CPU_TILED_MM_FORCE": "1", "GGML_CPU_SGEMM": "all", "GGML_CPU_FA_ONE_PATH": "1"},
    "per-row": {"GGML_CPU_TILED_MM": "0", "GGML_CPU_SGEMM": "all", "GGML_CPU_FA_ONE_PATH": "1"},
    "per-row-no-sgemm": {"GGML_CPU_TILED_MM": "0", "GGML_CPU_SGEMM": "off", "GGML_CPU_FA_ONE_PATH": "1"},
    "upstream": {},
}
MODE = "tiled-small"  # chosen by measurement: docs/exact-graft.md, "What it costs"


# CPU variants of the portable build (AVX without AVX2) where tinyBLAS and ggml's per-row dot products sum
# Q8_0 and F16 products in other orders, so `tiled-small`'s sgemm settings leave a row-count switch open
# (scripts/op_trace.py --variants: MUL_MAT q8_0 and f16 are where the bits part). There the mode sends
# every n to the per-row dot products instead (GGML_CPU_SGEMM=off); the probe checks it as everywhere.
SGEMM_OFF_VARIANTS = frozenset({"sandybridge", "ivybridge", "piledriver"})


def for_variant(environ, mode: str, variant: str | None) -> None:
    """Adjust `mode`'s variables to the CPU variant ggml loaded (a portable build), before the first
    decode: llama.cpp reads GGML_CPU_SGEMM at its first sgemm call, not when the library loads."""
    if mode == "tiled-small" and variant in SGEMM_OFF_VARIANTS:
        environ["GGML_CPU_SGEMM"] = "off"


def mode_from(environ) -> str:
    """The mode a process asks for through KVGRAFT_BATCH_INVARIANT (unknown names: the default)."""
    value = environ.get(SWITCH, "")
    if value == "0":
        return "upstream"
    return value if value in MODES else MODE


def apply(environ) -> str:
    """Set the chosen mode's variables in `environ` (os.environ before llama_cpp loads); returns the mode.
    Variables of other modes the user set are left alone only in `upstream`."""
    mode = mode_from(environ)
    if mode != "upstream":
        for name in VARIABLES:
            environ.pop(name, None)
        environ.update(MODES[mode])
    return mode
