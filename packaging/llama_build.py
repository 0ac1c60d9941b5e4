"""Build and install the llama-cpp-python that decides kvgraft's bits: the pinned sdist plus our patches.

    python packaging/llama_build.py --install            # build once (225 s on 2 cores here), install into this Python
    python packaging/llama_build.py --install --cuda 1   # the same with -DGGML_CUDA=on
    python packaging/llama_build.py --source DIR         # only the patched source tree, in DIR (portable_llama.py)
    python packaging/llama_build.py --stock              # the unpatched build's libraries in build/llama-default/lib
                                                          # (for the side-by-side benchmarks; never installed)

The source is llama-cpp-python 0.3.36's sdist from PyPI, checked against SDIST_SHA256 before anything
is unpacked; then every `packaging/llama-cpp-python/*.patch` is applied in name order, each hunk's
context matched exactly (a patch that does not apply stops the build, never a half-patched tree).
Each patch file says why it exists in its header. The wheel is kept in build/llama-wheel/ with
BUILD.json and reused while the sdist hash, the patches' hashes and the CMake arguments match, so a
second `make setup` costs no build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

VERSION = "0.3.36"  # the pin in pyproject.toml
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
HERE = Path(__file__).resolve().parent
PATCH_DIR = HERE / "llama-cpp-python"
CUDA_CMAKE_ARGS = "-DGGML_CUDA=on"


class PatchError(RuntimeError):
    """A patch does not apply to the pinned source exactly as written."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def patches() -> list[Path]:
    return sorted(PATCH_DIR.glob("*.patch"))


def build_key(cmake_args: str) -> dict:
    """What decides the built library: the sdist, each patch's bytes and the CMake arguments."""
    return {
        "version": VERSION,
        "sdist_sha256": SDIST_SHA256,
        "patches": {p.name: sha256_file(p) for p in patches()},
        "cmake_args": cmake_args,
    }


def fetch_sdist(cache: Path) -> Path:
    """The pinned sdist in `cache` (downloaded once with pip), refused unless its SHA-256 matches."""
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / SDIST
    if not sdist.is_file() or sha256_file(sdist) != SDIST_SHA256:
        sdist.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*cmd, "-d", str(cache), f"llama-cpp-python=={VERSION}"], check=True)
    got = sha256_file(sdist)
    if got != SDIST_SHA256:
        sdist.unlink(missing_ok=True)
        raise SystemExit(f"{SDIST}: SHA-256 {got}, expected {SDIST_SHA256}; refusing to build from it")
    return sdist


def parse_patch(text: str) -> list[tuple[str, list[tuple[int, list[str], list[str]]]]]:
    """(path, [(old_start, old_lines, new_lines)]) per file of a unified diff; header prose is skipped."""
    files: list[tuple[str, list]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("--- a/") and i + 1 < len(lines) and lines[i + 1].startswith("+++ b/"):
            files.append((lines[i + 1][6:].strip(), []))
            i += 2
            continue
        if lines[i].startswith("@@ ") and files:
            old_start = int(lines[i].split()[1].lstrip("-").split(",")[0])
            old, new = [], []
            i += 1
            while i < len(lines) and lines[i][:1] in (" ", "-", "+", ""):
                if lines[i].startswith("--- a/"):
                    break
                tag, body = (lines[i][:1] or " "), lines[i][1:]
                if tag in " -":
                    old.append(body)
                if tag in " +":
                    new.append(body)
                i += 1
            files[-1][1].append((old_start, old, new))
            continue
        i += 1
    if not files or not all(hunks for _, hunks in files):
        raise PatchError("no file with hunks in the patch")
    return files


def apply_patch(patch: Path, root: Path) -> None:
    """Apply `patch` to the tree at `root`: every hunk must match its context exactly at its line.
    Nothing is written unless every hunk of every file matches."""
    out: dict[Path, str] = {}
    for rel, hunks in parse_patch(patch.read_text(encoding="utf-8")):
        target = root / rel
        if not target.resolve().is_relative_to(root.resolve()) or not target.is_file():
            raise PatchError(f"{patch.name}: {rel} is not a file of the source tree")
        text = out.get(target) or target.read_text(encoding="utf-8")
        src = text.splitlines()
        for old_start, old, new in sorted(hunks, key=lambda h: -h[0]):
            at = old_start - 1
            if src[at : at + len(old)] != old:
                raise PatchError(f"{patch.name}: the hunk at {rel}:{old_start} does not match the pinned source")
            src[at : at + len(old)] = new
        out[target] = "\n".join(src) + ("\n" if text.endswith("\n") else "")
    for target, text in out.items():
        target.write_text(text, encoding="utf-8")


def patched_source(dest: Path, cache: Path, apply: bool = True) -> Path:
    """The pinned source with every patch applied (none with `apply=False`), unpacked under `dest`
    (replaced if present)."""
    sdist = fetch_sdist(cache)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
    root = dest / f"llama_cpp_python-{VERSION}"
    for patch in patches() if apply else ():
        apply_patch(patch, root)
        print(f"applied {patch.name}", flush=True)
    return root


def cached_wheel(wheel_dir: Path, key: dict) -> Path | None:
    try:
        info = json.loads((wheel_dir / "BUILD.json").read_text())
        wheel = wheel_dir / info["wheel"]
    except (OSError, ValueError, KeyError):
        return None
    if info.get("key") != key or not wheel.is_file():
        return None
    return wheel if sha256_file(wheel) == info.get("sha256") else None


def build_wheel(wheel_dir: Path, key: dict) -> Path:
    work = Path(tempfile.mkdtemp(prefix="llama-src-", dir=wheel_dir.parent))
    try:
        root = patched_source(work / "src", wheel_dir.parent / "sdist", apply=bool(key["patches"]))
        raw = work / "wheel"
        env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
        if key["cmake_args"]:
            env["CMAKE_ARGS"] = key["cmake_args"]
        else:
            env.pop("CMAKE_ARGS", None)
        n = len(key["patches"])
        print(f"building llama-cpp-python {VERSION} with {n} patch(es) (about 4 minutes on 2 cores, once)")
        t0 = time.time()
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(root), "-w", str(raw)], env=env, check=True
        )
        built = next(raw.glob("llama_cpp_python-*.whl"))
        for old in wheel_dir.glob("*.whl"):
            old.unlink()
        out = wheel_dir / built.name
        shutil.move(built, out)
        info = {"key": key, "wheel": out.name, "sha256": sha256_file(out), "build_seconds": round(time.time() - t0)}
        (wheel_dir / "BUILD.json").write_text(json.dumps(info, indent=1) + "\n")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def stock_libraries(key: dict, wheel_dir: Path, lib_dir: Path) -> int:
    """The same sdist built without our patches, its llama_cpp/lib unpacked to `lib_dir` (what
    scripts/bench_invariance.py and batch_invariance.py --lib load as "llama.cpp as shipped")."""
    key = {**key, "patches": {}}
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheel = cached_wheel(wheel_dir, key) or build_wheel(wheel_dir, key)
    if lib_dir.exists():
        shutil.rmtree(lib_dir)
    lib_dir.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("llama_cpp/lib/") and not name.endswith("/"):
                (lib_dir / name.rsplit("/", 1)[-1]).write_bytes(z.read(name))
    print(f"stock llama.cpp libraries: {lib_dir}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda", choices=("0", "1"), default="0", help="1: build with -DGGML_CUDA=on")
    ap.add_argument("--wheel-dir", type=Path, default=Path("build/llama-wheel"))
    ap.add_argument("--install", action="store_true", help="install the wheel into this Python (--force-reinstall)")
    ap.add_argument(
        "--stock", action="store_true", help="build the unpatched source; its libraries to build/llama-default/lib"
    )
    ap.add_argument("--source", type=Path, help="only unpack the patched source under this folder and print its path")
    args = ap.parse_args()
    if args.source:
        print(patched_source(args.source, args.source.parent / "sdist"))
        return 0
    key = build_key(CUDA_CMAKE_ARGS if args.cuda == "1" else "")
    if args.stock:
        return stock_libraries(key, Path("build/llama-stock-wheel"), Path("build/llama-default/lib"))
    args.wheel_dir.mkdir(parents=True, exist_ok=True)
    wheel = cached_wheel(args.wheel_dir, key) or build_wheel(args.wheel_dir, key)
    print(f"llama-cpp-python wheel: {wheel}")
    if args.install:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel)]
        subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
