"""Faults: tampered blobs, a full disk, kills mid-import, two processes importing and depositing at once."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.packs.export import export_pack
from kvgraft.app.packs.imports import import_pack
from kvgraft.app.service import LibraryService, open_library
from kvgraft.library.errors import BlobCorrupt, StorageFull
from kvgraft.library.library import Library
from kvgraft.library.maintenance import fsck
from tests.kill_harness import import_kill_trials

REPO = Path(__file__).resolve().parent.parent
WORKER = str(REPO / "tests" / "library_worker.py")


def test_thousand_random_flips_never_reach_llama(engine, monkeypatch):
    """Flip one random byte of a stored blob, 1,000 times: each is caught before any byte reaches C."""
    import kvgraft.engine.session as session_mod

    with open_library() as lib:
        service = LibraryService(engine, lib)
        entry = service.deposit("A short note about seven orange windows and a quiet harbor.").entry
        path = lib.blobs.path(entry.blob_sha256)
        original = path.read_bytes()
        reached = []
        real = session_mod.llama.llama_state_seq_set_data
        monkeypatch.setattr(session_mod.llama, "llama_state_seq_set_data", lambda *a: reached.append(1) or real(*a))
        rng = random.Random(3)
        with engine.session() as s:
            for _ in range(1000):
                i = rng.randrange(len(original))
                flipped = bytearray(original)
                flipped[i] ^= 1 << rng.randrange(8)
                path.write_bytes(flipped)
                with pytest.raises(BlobCorrupt):
                    service.graft(s, entry)
                assert s.n_past == 0
            assert reached == []
            path.write_bytes(original)
            service.graft(s, lib.get(entry.id))  # intact again: grafts
            assert reached == [1]


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MB file system (tmpfs). Needs root, as in CI; elsewhere the test is skipped, saying so."""
    mnt = tmp_path / "small-disk"
    if not _tmpfs(mnt, "6m"):
        pytest.skip("cannot mount a tmpfs here (needs root): disk-full tests not run")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_during_deposit(engine, small_disk, monkeypatch):
    monkeypatch.setenv("KVGRAFT_HOME", str(small_disk / "home"))
    with open_library() as lib:
        service = LibraryService(engine, lib)
        ok = service.deposit("A short note that fits.").entry  # ~0.4 MB
        with pytest.raises(StorageFull, match="disk full"):
            service.deposit(synthetic_text(400, seed=5))  # ~520 tokens: a ~9.6 MB blob, more than the disk
        assert lib.count() == 1 and lib.get(ok.id)
        assert list(lib.blobs.iter_temp()) == []
        report = fsck(lib)
        assert report["ok"] and report["reclaimable"] == [], report


def test_disk_full_during_import(engine, small_disk, tmp_path, monkeypatch):
    src = tmp_path / "src"
    with Library(src) as lib:
        service = LibraryService(engine, lib)
        entries = [service.deposit(synthetic_text(n, seed=n)).entry for n in (100, 110, 120)]  # ~3 MB each: 9 > 6
        pack = export_pack(lib, entries, tmp_path / "big.kvpack").file
    monkeypatch.setenv("KVGRAFT_HOME", str(small_disk / "home"))
    with open_library() as lib:
        service = LibraryService(engine, lib)
        keep = service.deposit("A short note that fits.").entry
        # the free-space check refuses before writing...
        with pytest.raises(StorageFull, match="free"):
            import_pack(service, Path(pack))
        # ...and when the disk fills during the copy anyway (the check is fooled), nothing is committed
        monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 40, 0, 1 << 40))
        with pytest.raises(StorageFull, match="disk full"):
            import_pack(service, Path(pack))
        assert [e.id for e in lib.entries()] == [keep.id]
        assert list(lib.blobs.iter_temp()) == []
        assert fsck(lib)["ok"]


def test_sigkill_during_imports(tmp_path):
    result = import_kill_trials(tmp_path / "lib", trials=12)
    assert result["trials"] == 12 and result["partial_imports"] == 0 and result["entries_lost"] == 0
    assert result["packs_committed"] >= 1


def test_importer_and_depositor_at_once(tmp_path):
    """The GUI importing while the CLI deposits: both finish, no lock errors, nothing lost."""
    home = tmp_path / "lib"
    Library(home).close()
    imp = subprocess.Popen(
        [sys.executable, WORKER, str(home), "import", "40", "21", "4096"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    dep = subprocess.Popen(
        [sys.executable, WORKER, str(home), "deposit", "150", "22", "4096"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    (iout, ierr), (dout, derr) = imp.communicate(timeout=300), dep.communicate(timeout=300)
    assert imp.returncode == 0, ierr
    assert dep.returncode == 0, derr
    imported = sum(int(line.split()[2]) for line in iout.splitlines() if line.startswith("imported"))
    deposited = sum(1 for line in dout.splitlines() if line.startswith("committed"))
    assert deposited == 150 and imported == 40 * 5
    with Library(home) as lib:
        assert lib.count() == 350
        assert fsck(lib, check_hashes=False)["ok"]
