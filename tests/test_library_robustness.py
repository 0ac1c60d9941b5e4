"""Two processes writing at once lose nothing; SIGKILL at any point leaves a consistent library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvgraft.library.library import Library
from kvgraft.library.maintenance import fsck
from tests.kill_harness import kill_trials

REPO = Path(__file__).resolve().parent.parent
WORKER = str(REPO / "tests" / "library_worker.py")


def test_two_writers_no_lock_errors_no_lost_rows(tmp_path):
    home = tmp_path / "lib"
    Library(home).close()
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(home), "deposit", "200", str(seed), "2048"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (11, 12)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "locked" not in err
    committed = [int(line.split()[1]) for out, _ in outs for line in out.splitlines() if line.startswith("committed")]
    assert len(committed) == 400 and len(set(committed)) == 400
    with Library(home) as lib:
        assert lib.count() == 400
        assert {e.id for e in lib.entries()} == set(committed)
        assert fsck(lib, check_hashes=False)["ok"]


@pytest.mark.parametrize("trials", [10, pytest.param(20, marks=pytest.mark.slow)])
def test_sigkill_at_random_points(tmp_path, trials):
    """Kill a depositing (and rm + gc-ing) process at `trials` times spread over its operations' real duration
    (10 in `make test`, 20 in `make test-slow`; every 10th lands during start-up and migrations)."""
    result = kill_trials(tmp_path / "lib", trials=trials)
    assert result["trials"] == trials and result["entries_lost"] == 0
    assert result["entries_committed"] >= trials
