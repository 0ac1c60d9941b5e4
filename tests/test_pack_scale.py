"""A pack of 10,000 small entries imports in one transaction, with progress, all or nothing."""

from __future__ import annotations

import json
import time
import zipfile

import pytest

import kvgraft.library.entry_writes as entry_writes
from kvgraft.app.packs.export import export_pack
from kvgraft.app.packs.imports import import_pack
from kvgraft.app.service import LibraryService, open_library
from kvgraft.library.library import Library

N_TEXTS, PER_TEXT = 50, 200  # 10,000 entries over 50 distinct blobs


@pytest.fixture(scope="module")
def big_pack(engine, tmp_path_factory):
    d = tmp_path_factory.mktemp("big-pack")
    with Library(d / "lib") as lib:
        service = LibraryService(engine, lib)
        entries = [service.deposit(f"Note {i}: the harbor holds {i * 7} crates.").entry for i in range(N_TEXTS)]
        export_pack(lib, entries, d / "base.kvpack")
    with zipfile.ZipFile(d / "base.kvpack") as z:
        manifest = json.loads(z.read("manifest.json"))
        blobs = {n: z.read(n) for n in z.namelist() if n.startswith("blobs/")}
    base = manifest["entries"]
    manifest["entries"] = [
        dict(e, question=f"{e['text']} (question {k})", answer=str(k)) for e in base for k in range(PER_TEXT)
    ]
    with zipfile.ZipFile(d / "big.kvpack", "w") as z:
        z.writestr("manifest.json", json.dumps(manifest))
        for n, b in blobs.items():
            z.writestr(zipfile.ZipInfo(n), b)
    return d / "big.kvpack"


def test_ten_thousand_entries_in_one_transaction(engine, big_pack):
    seen = []
    with open_library() as lib:
        t0 = time.perf_counter()
        res = import_pack(LibraryService(engine, lib), big_pack, progress=lambda st, d, n: seen.append((st, d, n)))
        elapsed = time.perf_counter() - t0
        assert res.imported == N_TEXTS * PER_TEXT and res.skipped == 0
        assert lib.count() == 10_000 and lib.stats()["blobs"] == N_TEXTS
        assert lib._db.execute("SELECT count(DISTINCT pack_id) FROM entries").fetchone()[0] == 1
    assert ("tokens", 10_000, 10_000) in seen and ("blobs", N_TEXTS, N_TEXTS) in seen
    print(f"\n10,000-entry pack imported in {elapsed:.1f} s")


def test_ten_thousand_entries_all_or_nothing(engine, big_pack, monkeypatch):
    """A failure at the very last entry leaves none of the 10,000 in the library."""
    real = entry_writes.insert_prefix_keys  # every entry row is written there (library/entry_writes.py)
    calls = []

    def fail_at_the_end(db, entry_id, blob, n):
        calls.append(entry_id)
        if len(calls) == N_TEXTS * PER_TEXT:
            raise RuntimeError("simulated failure at the last entry")
        return real(db, entry_id, blob, n)

    monkeypatch.setattr(entry_writes, "insert_prefix_keys", fail_at_the_end)
    with open_library() as lib:
        with pytest.raises(RuntimeError, match="last entry"):
            import_pack(LibraryService(engine, lib), big_pack)
        assert lib.count() == 0
        assert lib._db.execute("SELECT count(*) FROM packs").fetchone()[0] == 0
