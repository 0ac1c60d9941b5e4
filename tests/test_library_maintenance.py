"""fsck finds damage and leftovers and repairs what is safe; gc never takes a blob being written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvgraft.library.library import Library
from kvgraft.library.maintenance import fsck, gc

FP = "a" * 64
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def lib(tmp_path):
    with Library(tmp_path / "lib") as library:
        yield library


def add(lib, n, blob=None):
    return lib.add_entry(
        kind="document", text=f"doc {n}", tokens=list(range(1, n + 1)), blob=blob or os.urandom(512), fingerprint=FP
    )[0]


def kinds(items):
    return sorted(i["kind"] for i in items)


def test_clean_library_is_ok(lib):
    add(lib, 10)
    add(lib, 20)
    r = fsck(lib)
    assert r["ok"] and r["problems"] == [] and r["reclaimable"] == []


def test_damage_is_a_problem(lib):
    a, b, c = add(lib, 10), add(lib, 20), add(lib, 30)
    lib.blobs.path(a.blob_sha256).unlink()
    p = lib.blobs.path(b.blob_sha256)
    data = bytearray(p.read_bytes())
    data[0] ^= 1
    p.write_bytes(data)
    r = fsck(lib)
    assert not r["ok"]
    assert kinds(r["problems"]) == ["blob_hash_mismatch", "blob_missing"]
    assert fsck(lib, check_hashes=False)["problems"][0]["kind"] == "blob_missing"
    r = fsck(lib, repair=True)
    assert not r["ok"]  # damage stays a problem: the bytes are gone
    assert lib.get(a.id).damaged == "blob missing" and lib.get(b.id).damaged == "blob hash mismatch"
    assert lib.get(c.id).damaged is None
    # the blob comes back intact: repair clears the mark
    p.write_bytes(bytes(data[:1]) and bytes([data[0] ^ 1]) + bytes(data[1:]))
    lib.blobs.path(a.blob_sha256).parent.mkdir(exist_ok=True)
    lib.remove(a.id)
    r = fsck(lib, repair=True)
    assert r["ok"], r["problems"]
    assert lib.get(b.id).damaged is None


def test_leftovers_are_reclaimable_not_problems(lib):
    e = add(lib, 10)
    orphan_sha = lib.blobs.put(os.urandom(100)).sha256
    tmp = lib.blobs.root / orphan_sha[:2] / f".tmp-{'c' * 64}-999999999-abcd"
    tmp.write_bytes(b"partial")
    lib._db.execute(
        "INSERT INTO pending_blobs (sha256, pid, host, created_at) VALUES (?, ?, ?, ?)",
        ["d" * 64, 999999999, os.uname().nodename, "2020-01-01T00:00:00+00:00"],
    )
    lib._db.conn.commit()
    r = fsck(lib)
    assert r["ok"] and r["problems"] == []
    assert kinds(r["reclaimable"]) == ["orphan_blob", "stale_pending", "temp_file"]
    r = fsck(lib, repair=True)
    assert r["ok"] and r["reclaimable"] == [] and r["repaired"]
    assert fsck(lib)["reclaimable"] == []
    assert not tmp.exists() and not lib.blobs.contains(orphan_sha) and lib.blobs.contains(e.blob_sha256)


def test_dangling_index_rows(lib):
    e = add(lib, 100)
    lib._db.execute("PRAGMA foreign_keys=OFF")
    lib._db.execute("INSERT INTO prefix_keys (key, length, entry_id, full) VALUES (?, 64, 4242, 0)", [b"k" * 16])
    lib._db.conn.commit()
    r = fsck(lib)
    assert [p["kind"] for p in r["problems"]] == ["dangling_prefix_keys"]
    assert fsck(lib, repair=True)["repaired"]
    assert fsck(lib)["ok"]
    assert lib.get(e.id)


def test_gc_keeps_live_pending_blob(lib):
    sha = lib.blobs.put(os.urandom(100)).sha256
    lib._db.execute(
        "INSERT INTO pending_blobs (sha256, pid, host, created_at) VALUES (?, ?, ?, datetime('now'))",
        [sha, os.getpid(), os.uname().nodename],
    )
    lib._db.conn.commit()
    assert gc(lib, grace_s=0)["removed_blobs"] == 0 and lib.blobs.contains(sha)
    lib._db.execute("DELETE FROM pending_blobs")
    lib._db.conn.commit()
    assert gc(lib, grace_s=0)["removed_blobs"] == 1 and not lib.blobs.contains(sha)


def test_gc_against_concurrent_deposits(tmp_path):
    """A depositing process and a gc loop at once: no committed entry ever loses its blob."""
    home = tmp_path / "lib"
    Library(home).close()
    dep = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "library_worker.py"), str(home), "mixed", "60", "1", "200000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    gcp = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "library_worker.py"), str(home), "gc", "1000000", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = dep.communicate(timeout=300)
    gcp.terminate()  # gc loops until the depositor is done
    gout, gerr = gcp.communicate(timeout=60)
    assert dep.returncode == 0, err
    assert "Traceback" not in gerr, gerr
    assert sum(1 for line in gout.splitlines() if line.startswith("gc")) >= 20, "gc did not overlap the deposits"
    committed = {int(line.split()[1]) for line in out.splitlines() if line.startswith("committed")}
    removed = {int(line.split()[1]) for line in out.splitlines() if line.startswith("removed")}
    assert len(committed) == 60
    with Library(home) as lib:
        ids = {e.id for e in lib.entries()}
        assert ids == committed - removed
        for e in lib.entries():
            assert lib.read_blob(e)  # present and intact
        r = fsck(lib)
        assert r["ok"], r["problems"]


def test_redeposit_repairs_a_damaged_entry(lib):
    blob = os.urandom(700)
    e = lib.add_entry(kind="document", text="t", tokens=[1, 2, 3], blob=blob, fingerprint=FP)[0]
    lib.blobs.path(e.blob_sha256).unlink()
    assert fsck(lib, repair=True)["problems"]
    assert lib.get(e.id).damaged == "blob missing"
    # the same deposit again, with (say) other bytes on this machine: the entry now points at them
    fresh = os.urandom(800)
    again, created = lib.add_entry(kind="document", text="t", tokens=[1, 2, 3], blob=fresh, fingerprint=FP)
    assert not created and again.id == e.id and again.damaged is None
    assert again.blob_size == 800 and lib.blobs.verify(again.blob_sha256) is None
    gc(lib)
    assert bytes(lib.read_blob(lib.get(e.id))) == fresh
    assert fsck(lib)["ok"]


def test_commit_refused_when_gc_took_the_pending_record(lib, monkeypatch):
    """If gc reclaimed our pending record (it expired), the write must not commit an entry without its blob."""
    real = lib.mark_pending

    def mark_then_lose(shas):
        ids = real(shas)
        lib._db.execute("DELETE FROM pending_blobs")  # what a gc on another host would do after the grace period
        lib._db.conn.commit()
        return ids

    monkeypatch.setattr(lib, "mark_pending", mark_then_lose)
    from kvgraft.library.errors import LibraryError

    with pytest.raises(LibraryError, match="try again"):
        add(lib, 10)
    assert lib.count() == 0
