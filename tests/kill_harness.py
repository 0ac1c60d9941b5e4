"""SIGKILL trials against the library (used by tests/test_library_robustness.py and scripts/kill_trials.py)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvgraft.library.library import Library
from kvgraft.library.maintenance import fsck

WORKER = str(Path(__file__).resolve().parent / "library_worker.py")
BLOB_BYTES = 3_000_000
START_UP_S = 0.4  # about the interpreter start, imports and library open before "ready"


def run_and_kill(home: Path, mode: str, seed: int, delay: float, after_ready: bool = True) -> list[str]:
    """Start a worker; `delay` seconds after it has opened the library (or after spawn), SIGKILL it."""
    p = subprocess.Popen(
        [sys.executable, WORKER, str(home), mode, "1000", str(seed), str(BLOB_BYTES)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = []
    if after_ready:
        line = p.stdout.readline()
        if line.strip() != "ready":
            first.append(line)
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    out, _ = p.communicate(timeout=60)
    return [x.rstrip("\n") for x in first] + out.splitlines()


def time_one_deposit(home: Path) -> float:
    """Median seconds per deposit of a BLOB_BYTES blob on this machine (the kill window's unit)."""
    lines = run_and_kill(home, "deposit", 0, 1.0)
    times = sorted(float(line.split()[3]) for line in lines if line.startswith("committed"))
    if not times:
        raise RuntimeError("the worker committed nothing in 1.5 s")
    return times[len(times) // 2]


def kill_trials(home: Path, trials: int, seed: int = 7, log=lambda msg: None) -> dict:
    """Kill deposit/rm/gc workers at random points; after each, fsck must be clean and nothing committed lost."""
    Library(home).close()
    op = time_one_deposit(home)
    rng = random.Random(seed)
    with Library(home) as lib:
        committed = {e.id: e.blob_sha256 for e in lib.entries()}
    removed: set[int] = set()
    lost = 0
    for trial in range(trials):
        # most kills land among the operations (after "ready"); every 10th during start-up and migrations
        during_start = trial % 10 == 9
        delay = rng.uniform(0, START_UP_S) if during_start else rng.uniform(0, 6 * op)
        for line in run_and_kill(
            home, "mixed" if trial % 2 else "deposit", 1000 + trial, delay, after_ready=not during_start
        ):
            parts = line.split()
            if parts and parts[0] == "committed":
                committed[int(parts[1])] = parts[2]
            elif parts and parts[0] == "removed":
                removed.add(int(parts[1]))
        with Library(home) as lib:
            report = fsck(lib)
            if not report["ok"]:
                raise AssertionError(f"trial {trial}: fsck found problems: {report['problems']}")
            present = {e.id: e.blob_sha256 for e in lib.entries()}
            for eid, sha in committed.items():
                if eid in removed:
                    continue
                if present.get(eid) != sha or lib.blobs.verify(sha) is not None:
                    lost += 1
                    raise AssertionError(f"trial {trial}: committed entry #{eid} lost or damaged")
            # killed after its commit, before it printed: committed all the same (at most one per kill)
            unreported = set(present) - set(committed)
            if len(unreported) > 1:
                raise AssertionError(f"trial {trial}: {len(unreported)} entries appeared unannounced")
            for eid in unreported:
                committed[eid] = present[eid]
        where = "after spawn" if during_start else "after ready"
        log(f"trial {trial + 1}/{trials}: killed {delay:.3f} s {where}, fsck ok, {len(present)} entries intact")
    return {"trials": trials, "deposit_s": op, "entries_committed": len(committed), "entries_lost": lost}


def import_kill_trials(home: Path, trials: int, seed: int = 11, log=lambda msg: None) -> dict:
    """Kill importing workers at random points: every pack is in the library whole, or not at all."""
    Library(home).close()
    rng = random.Random(seed)
    partial = lost = 0
    committed: dict[str, int] = {}
    for trial in range(trials):
        during_start = trial % 10 == 9
        delay = rng.uniform(0, START_UP_S) if during_start else rng.uniform(0, 0.6)
        for line in run_and_kill(home, "import", 2000 + trial, delay, after_ready=not during_start):
            parts = line.split()
            if parts and parts[0] == "imported":
                committed[parts[1]] = int(parts[2])
        with Library(home) as lib:
            report = fsck(lib)
            if not report["ok"]:
                raise AssertionError(f"trial {trial}: fsck found problems: {report['problems']}")
            packs = {r["sha256"]: (r["id"], r["n_entries"]) for r in lib._db.query("SELECT * FROM packs")}
            for pid, n in packs.values():
                have = lib._db.execute("SELECT count(*) FROM entries WHERE pack_id = ?", [pid]).fetchone()[0]
                if have != n:
                    partial += 1
            orphans = lib._db.execute(
                "SELECT count(*) FROM entries WHERE pack_id IS NOT NULL AND pack_id NOT IN (SELECT id FROM packs)"
            ).fetchone()[0]
            partial += orphans
            lost += sum(1 for sha in committed if sha not in packs)
        if partial or lost:
            raise AssertionError(f"trial {trial}: {partial} partial imports, {lost} committed packs lost")
        log(f"import trial {trial + 1}/{trials}: killed {delay:.3f} s in, {len(packs)} packs whole, fsck ok")
    return {"trials": trials, "packs_committed": len(committed), "partial_imports": partial, "entries_lost": lost}
