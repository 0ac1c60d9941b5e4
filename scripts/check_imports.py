#!/usr/bin/env python3
"""Run import-linter's contracts (pyproject.toml) on the installed layout of the tree.

The repository keeps the product card's folders at the top (app/, engine/, library/, ui/) and
installs them as kvgraft.app, kvgraft.engine, ...; import-linter walks a package's directory, so
the check copies the tree into that layout in a temp dir and lints the copy. `make lint` runs it;
tests/test_boundaries.py plants violations in such copies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("app", "engine", "library", "ui")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def layout_copy(dest: Path) -> Path:
    """kvgraft/{__init__,entry}.py and kvgraft/{app,engine,library,ui} under `dest`; returns kvgraft/."""
    skip = shutil.ignore_patterns("__pycache__")
    root = dest / "kvgraft"
    shutil.copytree(REPO / "packaging" / "kvgraft", root, ignore=skip)
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, root / folder, ignore=skip)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return root


def lint_imports(dest: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(dest)}
    cmd = [str(LINT_IMPORTS), "pyproject.toml", "--no-cache"]
    return subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True, timeout=300)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kvgraft-imports-") as tmp:
        layout_copy(Path(tmp))
        proc = lint_imports(Path(tmp))
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
