"""The house's boundaries, checked: one installed name, the layer contracts, no old-style imports.

`make test` runs `lint-imports` on the real tree (the contracts are in pyproject.toml); these tests
show that each contract fails on a planted violation, that the installed package imports from
outside the repository, and that no file still imports the four folders as top-level packages.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts.check_imports import layout_copy, lint_imports

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("app", "engine", "library", "ui")


def _python_files():
    for top in (*FOLDERS, "tests", "scripts", "packaging"):
        yield from sorted((REPO / top).rglob("*.py"))


def test_no_top_level_imports_of_the_four_folders():
    """`python -m pytest` puts the repo root on sys.path, so `from engine...` would still pass there."""
    offenders = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in FOLDERS]
    assert not offenders, "import these as kvgraft.<folder>:\n" + "\n".join(offenders)


def _outside(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["QT_QPA_PLATFORM"] = "offscreen"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_installed_package_imports_from_outside_the_repo(tmp_path):
    """Every kvgraft module imports in a process started outside the repo; nothing else top-level is installed."""
    code = """
import importlib, importlib.util, pkgutil, sys
import kvgraft
assert sys.path[0] == "" or "kvgraft" not in sys.path[0]
names = ["kvgraft"]
for sub in ("app", "engine", "library", "ui"):
    pkg = importlib.import_module("kvgraft." + sub)
    names += ["kvgraft." + sub] + [m.name for m in pkgutil.walk_packages(pkg.__path__, "kvgraft." + sub + ".")]
names += ["kvgraft.entry"]
for n in names:
    importlib.import_module(n)
print(len(names))
for top in ("app", "engine", "library", "ui"):
    assert importlib.util.find_spec(top) is None, top + " is importable as a top-level package"
"""
    proc = _outside(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) > 60  # every module of the four folders, not just the package roots


def test_import_app_fails_outside_the_repo(tmp_path):
    proc = _outside("import app", tmp_path)
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


def test_contracts_hold_on_the_tree(tmp_path):
    layout_copy(tmp_path)
    proc = lint_imports(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 kept, 0 broken" in proc.stdout


LAYERS = "app/: cli above lab above use cases above service above proof above core"
PLANTED = [
    # (contract name, file to plant in, the import planted)
    ("only engine/ imports llama_cpp", "app/maintain/doctor.py", "import llama_cpp"),
    ("only engine/ imports llama_cpp", "library/pack.py", "import llama_cpp"),
    ("engine/ and library/ import neither Qt nor app/ nor ui/", "engine/state.py", "import PySide6.QtCore"),
    ("engine/ and library/ import neither Qt nor app/ nor ui/", "library/records.py", "import kvgraft.app.core.errors"),
    (
        "library/ does not import engine/ (no llama.cpp below the library)",
        "library/pack.py",
        "import kvgraft.engine.state",
    ),
    ("ui/ reaches llama.cpp and SQLite only through app/", "ui/library_table.py", "import sqlite3"),
    ("ui/ reaches llama.cpp and SQLite only through app/", "ui/library_table.py", "import kvgraft.library.library"),
    ("ui/ reaches llama.cpp and SQLite only through app/", "ui/worker.py", "import llama_cpp"),
    ("app/ does not import ui/", "app/answer/ask.py", "import kvgraft.ui.worker"),
    (LAYERS, "app/proof/replay.py", "import kvgraft.app.service"),  # proof below the service
    (LAYERS, "app/core/paths.py", "import kvgraft.app.proof.prompts"),  # core below everything
    (LAYERS, "app/answer/ask.py", "import kvgraft.app.lab.demo"),  # nothing but cli/ imports lab/
    (LAYERS, "app/service.py", "import kvgraft.app.answer.ask"),  # the service below the use cases
    (LAYERS, "app/packs/export.py", "import kvgraft.app.verify.items"),  # lower use cases below upper ones
]


@pytest.mark.parametrize("contract,target,line", PLANTED, ids=[f"{t}:{ln}" for _, t, ln in PLANTED])
def test_each_contract_fails_on_a_planted_violation(tmp_path, contract, target, line):
    root = layout_copy(tmp_path)
    path = root / target
    path.write_text(path.read_text() + f"\n{line}  # planted\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{contract} BROKEN" in proc.stdout  # the contract meant for it (a planted import may break others too)
    assert f"{target[:-3].replace('/', '.')} ->" in proc.stdout.split("Broken contracts", 1)[1]


SQL_OUTSIDE = re.compile(
    r"\.db\b(?!['\"])|\._db\b|\bimport sqlite3\b|\bsqlite_utils\b|\.execute\(|\.executemany\(|"
    r"\bSELECT\b.+\bFROM\b|\bINSERT\s+(OR\s+\w+\s+)?INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b|\bPRAGMA\b"
)


def test_no_sql_outside_the_library():
    """library/ owns its schema: no module outside it runs SQL or touches the index's connection
    (the import contracts keep sqlite out of ui/; this keeps app/, engine/, scripts/ and the entry
    module from reaching past the Library's methods). Tests may look inside; they are not here."""
    offenders = []
    for top in ("app", "engine", "ui", "scripts", "packaging"):
        for path in sorted((REPO / top).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if SQL_OUTSIDE.search(code):
                    offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, "SQL or the index connection outside library/:\n" + "\n".join(offenders)


def test_the_sql_check_finds_a_planted_query(tmp_path):
    planted = 'rows = lib._db.execute("SELECT id FROM entries").fetchall()'
    assert SQL_OUTSIDE.search(planted)
    assert SQL_OUTSIDE.search("cur = library.db.conn")
    assert not SQL_OUTSIDE.search('return self.library.table_rows(fingerprint, "select a document")')


def test_a_built_wheel_holds_every_module(tmp_path):
    """A normal install (and `make bundle`) ships only the packages pyproject.toml lists: the editable
    install finds subpackages that are not listed, so a wheel is built and every module imported from it."""
    wheel_dir, unpacked = tmp_path / "wheel", tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheel_dir), "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheel_dir.glob("kvgraft-*.whl")
    zipfile.ZipFile(wheel).extractall(unpacked)
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    in_repo = {f"kvgraft/{p.relative_to(REPO).as_posix()}" for top in FOLDERS for p in (REPO / top).rglob("*.py")} | {
        f"kvgraft/{p.name}" for p in (REPO / "packaging" / "kvgraft").glob("*.py")
    }
    assert in_repo - shipped == set(), "modules the wheel leaves out: list their packages in pyproject.toml"
    modules = sorted(n[:-3].replace("/", ".").removesuffix(".__init__") for n in shipped)
    modules.remove("kvgraft.__main__")  # `python -m kvgraft`: importing it runs the CLI
    code = f"""
import importlib, sys
for n in {modules!r}:
    m = importlib.import_module(n)
    assert m.__file__.startswith({str(unpacked)!r}), (n, m.__file__)
print(len({modules!r}))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(unpacked), "QT_QPA_PLATFORM": "offscreen"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) == len(modules) > 80


def test_no_file_in_app_over_400_lines():
    """Files small and named for what they hold: past ~400 lines a file is split by concern."""
    long = {
        str(p.relative_to(REPO)): n
        for p in (REPO / "app").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"split these by concern: {long}"
