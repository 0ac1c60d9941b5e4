"""Build (once) the portable llama-cpp-python wheel the bundle ships: runtime CPU dispatch.

    python packaging/portable_llama.py [--wheel-dir build/portable-wheel]

The same pinned and patched llama-cpp-python source as the developer's .venv (packaging/llama_build.py), built with
GGML_NATIVE=OFF GGML_BACKEND_DL=ON GGML_CPU_ALL_VARIANTS=ON: the core libraries for baseline x86-64 and
one CPU backend per CPU family (x64, sse42, sandybridge, ivybridge, piledriver, haswell, skylakex,
cannonlake, cascadelake, icelake, cooperlake, zen4, alderlake, sapphirerapids), of which ggml loads the
best for the CPU it runs on (engine/cpu_backend.py). About 18 minutes on 2 cores; the wheel is kept in
--wheel-dir with BUILD.json (the options and the wheel's SHA-256) and reused while the options match.

ggml installs the per-CPU libraries into the wheel's `bin/` (its CMAKE_INSTALL_BINDIR), outside the
package; this script moves them next to libggml.so in `llama_cpp/lib/`, where kvgraft loads them from,
and rewrites the wheel's RECORD. The developer's .venv is never touched.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path


def _load_llama_build():
    """packaging/llama_build.py by path (packaging/ is not put on sys.path: its kvgraft/ folder would
    hide the installed package)."""
    path = Path(__file__).resolve().parent / "llama_build.py"
    spec = importlib.util.spec_from_file_location("kvgraft_llama_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


llama_build = _load_llama_build()  # the pinned sdist and its patches: the same source as the native build

VERSION = llama_build.VERSION
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON"
LIB = "llama_cpp/lib/"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def relocate_backends(raw: Path, out: Path) -> list[str]:
    """Copy wheel `raw` to `out` with every `bin/libggml-*.so` moved into llama_cpp/lib/; returns the
    CPU variants now in the package."""
    moved: list[str] = []
    records: list[str] = []
    with zipfile.ZipFile(raw) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if info.filename == record_name:
                continue
            data = src.read(info)
            name = info.filename
            base = name.rsplit("/", 1)[-1]
            if name.startswith("bin/") and base.startswith("libggml-") and base.endswith(".so"):
                name = LIB + base
                moved.append(base)
            zi = zipfile.ZipInfo(name, info.date_time)
            zi.external_attr = info.external_attr
            zi.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(zi, data)
            records.append(_record_line(name, data))
        records.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(records) + "\n")
    return sorted(m.removeprefix("libggml-cpu-").removesuffix(".so") for m in moved if m.startswith("libggml-cpu-"))


def _sha256(path: Path) -> str:
    return llama_build.sha256_file(path)


def patches_key() -> dict:
    """The patches the build applies, by name and SHA-256 (packaging/llama_build.py): part of the cache key."""
    return llama_build.build_key(CMAKE_ARGS)["patches"]


def cached(wheel_dir: Path) -> Path | None:
    meta = wheel_dir / "BUILD.json"
    try:
        info = json.loads(meta.read_text())
        wheel = wheel_dir / info["wheel"]
    except (OSError, ValueError, KeyError):
        return None
    if info.get("cmake_args") != CMAKE_ARGS or info.get("version") != VERSION or not wheel.is_file():
        return None
    if info.get("patches") != patches_key():  # a wheel built before a patch changed is rebuilt
        return None
    return wheel if _sha256(wheel) == info.get("sha256") else None


def build(wheel_dir: Path) -> Path:
    raw_dir = wheel_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    for old in raw_dir.glob("*.whl"):
        old.unlink()
    src = llama_build.patched_source(wheel_dir / "src", wheel_dir / "sdist")  # the .venv's source and patches
    env = dict(os.environ, CMAKE_ARGS=CMAKE_ARGS, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", str(src), "-w", str(raw_dir)]
    print(f"building llama-cpp-python {VERSION} with {CMAKE_ARGS} (about 18 min on 2 cores, once)", flush=True)
    t0 = time.time()
    subprocess.run(cmd, env=env, check=True)
    raw = next(raw_dir.glob("llama_cpp_python-*.whl"))
    out = finish(raw, wheel_dir, round(time.time() - t0))
    raw.unlink()
    return out


def finish(raw: Path, wheel_dir: Path, build_seconds: int) -> Path:
    """Move the backends of the freshly built wheel `raw` into place and record the build in BUILD.json."""
    out = wheel_dir / raw.name
    part = wheel_dir / (raw.name + ".part")
    try:
        variants = relocate_backends(raw, part)
        if "x64" not in variants:  # refused before it is where `make bundle` installs from
            raise SystemExit(f"portable build: no per-CPU backends in {raw.name} (found {variants})")
        part.replace(out)
    finally:
        part.unlink(missing_ok=True)
    info = {
        "version": VERSION,
        "cmake_args": CMAKE_ARGS,
        "patches": patches_key(),
        "wheel": out.name,
        "sha256": _sha256(out),
        "variants": variants,
        "build_seconds": build_seconds,
    }
    (wheel_dir / "BUILD.json").write_text(json.dumps(info, indent=1) + "\n")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel-dir", type=Path, default=Path("build/portable-wheel"))
    ap.add_argument(
        "--relocate", type=Path, help="a wheel built with CMAKE_ARGS by hand: only move its backends into place"
    )
    ap.add_argument("--build-seconds", type=int, default=0, help="with --relocate: how long its build took")
    ap.add_argument("--path", action="store_true", help="only print the built wheel's path (exit 1 if none)")
    args = ap.parse_args()
    if args.path:
        wheel = cached(args.wheel_dir)
        if wheel is None:
            print(f"no portable wheel in {args.wheel_dir}: run this script without --path", file=sys.stderr)
            return 1
        print(wheel)
        return 0
    args.wheel_dir.mkdir(parents=True, exist_ok=True)
    if args.relocate:
        finish(args.relocate, args.wheel_dir, args.build_seconds)
    wheel = cached(args.wheel_dir) or build(args.wheel_dir)
    info = json.loads((args.wheel_dir / "BUILD.json").read_text())
    print(f"portable wheel: {wheel} ({len(info['variants'])} CPU variants: {', '.join(info['variants'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
