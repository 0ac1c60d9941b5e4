"""Fuzzing pack import and snapshot validation (tests/test_fuzz.py runs it CI-sized, scripts/fuzz.py large).

Pure-Python validation (the pack reader, the manifest schema, the snapshot layout walk) runs
in-process; anything that could reach C (a graft of bytes the walk accepted) runs in one
long-lived worker subprocess (tests/graft_server.py), so a segfault is seen as a dead worker
instead of a dead test run, without paying a process start per case.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from kvgraft.app.core.watchdog import guarded_popen
from kvgraft.app.packs.imports import import_pack
from kvgraft.app.service import LibraryService
from kvgraft.engine.errors import SnapshotError
from kvgraft.engine.state import parse_state
from kvgraft.library.errors import LibraryError
from kvgraft.library.library import Library
from kvgraft.library.pack import PackReader

REPO = Path(__file__).resolve().parent.parent


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random structural or byte-level mutation, biased towards headers and directories."""
    b = bytearray(data)
    n = len(b)
    kind = rng.choice(
        ["flip", "flip", "flip-head", "flip-tail", "truncate", "insert", "delete", "splice", "int32", "zero-run"]
    )

    def pos(region: str = "any") -> int:
        if n == 0:
            return 0
        if region == "head":
            return rng.randrange(min(n, 4096))
        if region == "tail":
            return max(0, n - 1 - rng.randrange(min(n, 4096)))
        return rng.randrange(n)

    if kind.startswith("flip") and n:
        for _ in range(rng.randint(1, 4)):
            b[pos(kind[5:] or "any")] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del b[pos() :]
    elif kind == "insert":
        p = pos()
        b[p:p] = os.urandom(rng.choice([1, 4, 8, 100]))
    elif kind == "delete" and n:
        p = pos()
        del b[p : p + rng.choice([1, 4, 8, 100])]
    elif kind == "splice" and n > 8:
        p, q = sorted((pos(), pos()))
        b[p:p] = b[q : q + rng.randint(1, 64)]
    elif kind == "int32" and n >= 4:
        p = min(pos(rng.choice(["head", "tail", "any"])), n - 4)
        struct.pack_into("<I", b, p, rng.choice([0, 1, 2, 0x7FFFFFFF, 0xFFFFFFFF, n, n + 1]))
    elif kind == "zero-run" and n:
        p = pos()
        b[p : p + rng.randint(1, 512)] = bytes(min(n - p, 512))[: len(b[p : p + 512])]
    return bytes(b)


def mutate_manifest(pack: Path, dst: Path, rng: random.Random) -> Path:
    """A JSON-level mutation of the manifest, repacked (reaches the schema checks behind the zip ones)."""
    with zipfile.ZipFile(pack) as z:
        manifest = json.loads(z.read("manifest.json"))
        others = [(n, z.read(n)) for n in z.namelist() if n != "manifest.json"]
    weird = [None, True, -1, 0, 2**63, 1.5, "", "x" * 70, [], {}, "../../etc/passwd", "0" * 64]
    target = manifest if rng.random() < 0.4 else rng.choice(manifest.get("entries") or [manifest])
    if isinstance(target, dict) and target:
        key = rng.choice(sorted(target))
        op = rng.choice(["set", "del", "add"])
        if op == "set":
            target[key] = rng.choice(weird)
        elif op == "del":
            del target[key]
        else:
            target[f"extra_{rng.randrange(99)}"] = rng.choice(weird)
    with zipfile.ZipFile(dst, "w") as z:
        z.writestr("manifest.json", json.dumps(manifest))
        for n, d in others:
            z.writestr(zipfile.ZipInfo(n), d)
    return dst


@dataclass
class FuzzStats:
    cases: int = 0
    refused: int = 0
    imported: int = 0
    accepted_states: int = 0
    grafted: int = 0
    crashes: int = 0
    partial_imports: int = 0
    stray_files: int = 0
    other_errors: list = field(default_factory=list)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["other_errors"] = self.other_errors[:10]
        return d


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def fuzz_pack_import(engine, good_pack: Path, work: Path, cases: int, seed: int, stats: FuzzStats) -> None:
    """Mutated packs through the real import path: refused with a typed error, or imported whole."""
    rng = random.Random(seed)
    home = work / "home"
    lib = Library(home)
    service = LibraryService(engine, lib)
    data = good_pack.read_bytes()
    try:
        for i in range(cases):
            case = work / "case.kvpack"
            if rng.random() < 0.3:
                mutate_manifest(good_pack, case, rng)
            else:
                case.write_bytes(mutate(data, rng))
            before_entries = lib.count()
            before_tree = _tree(work)
            stats.cases += 1
            try:
                res = import_pack(service, case)
                stats.imported += 1
                n_manifest = len(PackReader(case).manifest.entries)
                if res.imported + res.skipped != n_manifest:
                    stats.partial_imports += 1
            except LibraryError:
                stats.refused += 1
                if lib.count() != before_entries:
                    stats.partial_imports += 1
            except Exception as exc:  # noqa: BLE001 (anything untyped is a finding)
                stats.other_errors.append(f"pack case {i}: {type(exc).__name__}: {exc}")
            stray = {p for p in _tree(work) - before_tree if not p.startswith("home")}
            stats.stray_files += len(stray)
            if stray:
                stats.other_errors.append(f"pack case {i}: files written outside the data dir: {sorted(stray)}")
            if lib.count() > 50:  # keep the library small: start over
                lib.close()
                import shutil

                shutil.rmtree(home)
                lib = Library(home)
                service = LibraryService(engine, lib)
    finally:
        lib.close()


class GraftServer:
    """The long-lived worker: one line of JSON per case in, one line out."""

    def __init__(self, model_path: Path, n_ctx: int = 256) -> None:
        self.proc = guarded_popen(  # a long-lived worker: it dies with the tests however they end
            [sys.executable, str(REPO / "tests" / "graft_server.py"), str(model_path), str(n_ctx)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def graft(self, path: Path, n_tokens: int) -> dict | None:
        """The worker's verdict, or None when it died (a crash)."""
        try:
            self.proc.stdin.write(json.dumps({"file": str(path), "n_tokens": n_tokens}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            return None
        return json.loads(line) if line else None

    def close(self) -> int:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        return self.proc.wait(timeout=60)


def fuzz_snapshots(
    engine,
    model_path: Path,
    snapshot: bytes,
    n_tokens: int,
    work: Path,
    cases: int,
    seed: int,
    stats: FuzzStats,
    n_ctx: int = 256,
) -> None:
    """Mutated snapshots: the Python walk refuses them, or the worker grafts them without crashing."""
    rng = random.Random(seed)
    server = GraftServer(model_path, n_ctx)
    try:
        for i in range(cases):
            data = mutate(snapshot, rng)
            stats.cases += 1
            try:
                parse_state(data, engine.layout, max_cells=n_ctx)
            except SnapshotError:
                stats.refused += 1
                continue
            except Exception as exc:  # noqa: BLE001 (anything untyped is a finding)
                stats.other_errors.append(f"snapshot case {i}: {type(exc).__name__}: {exc}")
                continue
            stats.accepted_states += 1
            case = work / "case.state"
            case.write_bytes(data)
            verdict = server.graft(case, n_tokens)
            if verdict is None:
                stats.crashes += 1
                server = GraftServer(model_path, n_ctx)
            elif verdict["ok"]:
                stats.grafted += 1
            elif verdict["error_type"] != "SnapshotError":
                stats.other_errors.append(
                    f"snapshot case {i}: worker raised {verdict['error_type']}: {verdict['message']}"
                )
    finally:
        if server.close() != 0:
            stats.crashes += 1
