#!/usr/bin/env python3
"""Pack what a GPU exactness check needs into .gpukit/ (git-ignored), small enough to travel.

    .venv/bin/python scripts/gpu_kit.py [--sdist FILE]

A device machine has no network, Python 3.12 with numpy, CMake, ninja, scikit-build-core and
nvcc, and at most 64 MiB of working tree travels to it: the llama-cpp-python 0.3.36 sdist (73
MiB) and the Gemma GGUF (253 MB) do not fit. So this writes:

  .gpukit/llama-cpp-python-0.3.36-stripped.tar.gz   the sdist without .git, llama.cpp's models,
        docs, tests, tools, examples and the backends a CUDA build does not compile (a few MiB)
  .gpukit/wheels/*.whl                             pure-Python wheels the check needs there (gguf,
        diskcache: llama_cpp imports it)
  .gpukit/wheels-build/*.whl                       the build backend (scikit-build-core, pathspec,
        packaging), installed only where the Python lacks it (here; the device image has it)

Name `.gpukit` in the device tool's `carry`: it is git-ignored, so it does not travel otherwise.

scripts/gpu_check.sh (run on the device, or here with GPU_KIT_CPU=1 as a rehearsal) builds the
stripped tree, writes the synthetic models (scripts/synthetic_gguf.py) and runs
scripts/gpu_exactness.py, which writes one receipts JSON.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KIT = REPO / ".gpukit"
VERSION = "0.3.36"
WHEELS = ("gguf==0.19.0", "diskcache==5.6.3")
BUILD_WHEELS = ("scikit-build-core==1.1.2", "pathspec==1.1.1", "packaging==26.4")
CAP = 64 * 2**20  # what the device takes of the working tree in one call, all of it
# paths under the sdist's top folder that a CUDA (or CPU rehearsal) build of the library never reads
DROP = (
    ".git",
    "docker",
    "docs",
    "examples",
    "tests",
    "vendor/llama.cpp/.devops",
    "vendor/llama.cpp/.github",
    "vendor/llama.cpp/benches",
    "vendor/llama.cpp/conversion",
    "vendor/llama.cpp/docs",
    "vendor/llama.cpp/examples",
    "vendor/llama.cpp/gguf-py",
    "vendor/llama.cpp/grammars",
    "vendor/llama.cpp/media",
    "vendor/llama.cpp/models",
    "vendor/llama.cpp/pocs",
    "vendor/llama.cpp/prompts",
    "vendor/llama.cpp/requirements",
    "vendor/llama.cpp/scripts",
    "vendor/llama.cpp/tests",
    "vendor/llama.cpp/tools",
    "vendor/llama.cpp/ggml/src/ggml-cann",
    "vendor/llama.cpp/ggml/src/ggml-et",
    "vendor/llama.cpp/ggml/src/ggml-hexagon",
    "vendor/llama.cpp/ggml/src/ggml-metal",
    "vendor/llama.cpp/ggml/src/ggml-musa",
    "vendor/llama.cpp/ggml/src/ggml-opencl",
    "vendor/llama.cpp/ggml/src/ggml-openvino",
    "vendor/llama.cpp/ggml/src/ggml-sycl",
    "vendor/llama.cpp/ggml/src/ggml-vulkan",
    "vendor/llama.cpp/ggml/src/ggml-webgpu",
    "vendor/llama.cpp/ggml/src/ggml-zdnn",
    "vendor/llama.cpp/ggml/src/ggml-zendnn",
)


def fetch_sdist(dest: Path) -> Path:
    """The llama-cpp-python sdist from the package index (pip's own download, checked by pip)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(dest)]
        + [f"llama-cpp-python=={VERSION}"],
        check=True,
    )
    return next(dest.glob(f"llama_cpp_python-{VERSION}.tar.gz"))


def strip_sdist(sdist: Path, out: Path) -> tuple[int, int]:
    """Copy the sdist to `out` without the DROP paths; returns (members kept, members dropped)."""
    kept = dropped = 0
    with tarfile.open(sdist, "r:gz") as src, tarfile.open(out, "w:gz", compresslevel=9) as dst:
        for m in src:
            top, _, rel = m.name.partition("/")
            if any(rel == d or rel.startswith(d + "/") for d in DROP):
                dropped += 1
                continue
            if m.islnk() or m.issym() or m.isdev():
                dropped += 1
                continue
            data = src.extractfile(m).read() if m.isfile() else None
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
            kept += 1
    return kept, dropped


def fetch_wheels(dest: Path, names: tuple[str, ...]) -> list[Path]:
    """Pure-Python wheels (py3-none-any: the same file serves Python 3.11 here and 3.12 there)."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest), *names],
        check=True,
    )
    return sorted(dest.glob("*.whl"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", type=Path, help="a llama_cpp_python-0.3.36.tar.gz already here (else downloaded)")
    args = ap.parse_args()
    KIT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(Path(tmp))
        out = KIT / f"llama-cpp-python-{VERSION}-stripped.tar.gz"
        kept, dropped = strip_sdist(sdist, out)
    wheels = fetch_wheels(KIT / "wheels", WHEELS) + fetch_wheels(KIT / "wheels-build", BUILD_WHEELS)
    total = out.stat().st_size + sum(w.stat().st_size for w in wheels)
    print(f"{out.relative_to(REPO)}: {out.stat().st_size / 2**20:.1f} MiB ({kept} files kept, {dropped} dropped)")
    for w in wheels:
        print(f"{w.relative_to(REPO)}: {w.stat().st_size / 2**20:.2f} MiB")
    print(f"kit: {total / 2**20:.1f} MiB (the device takes at most 64 MiB of working tree in all)")
    if total > CAP // 2:
        print("error: the kit leaves less than half the 64 MiB for the rest of the tree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
