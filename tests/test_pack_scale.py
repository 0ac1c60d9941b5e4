"""A pack of 10,000 small entries imports in one transaction, with progress, all or nothing (2,000 in
`make test`, 10,000 in `make test-slow`)."""

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

PER_TEXT = 200
SIZES = [  # entries = texts x PER_TEXT: 2,000 in `make test`, 10,000 in `make test-slow`
    pytest.param(10, id="2000-entries"),
    pytest.param(50, id="10000-entries", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=SIZES)
def big_pack(engine, tmp_path_factory, request):
    n_texts = request.param
    d = tmp_path_factory.mktemp("big-pack")
    with Library(d / "lib") as lib:
        service = LibraryService(engine, lib)
        entries = [service.deposit(f"Note {i}: the harbor holds {i * 7} crates.").entry for i in range(n_texts)]
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
    return d / "big.kvpack", n_texts


def test_a_big_pack_imports_in_one_transaction(engine, big_pack):
    big_pack, n_texts = big_pack
    n = n_texts * PER_TEXT
    seen = []
    with open_library() as lib:
        t0 = time.perf_counter()
        res = import_pack(LibraryService(engine, lib), big_pack, progress=lambda st, d, n: seen.append((st, d, n)))
        elapsed = time.perf_counter() - t0
        assert res.imported == n and res.skipped == 0
        assert lib.count() == n and lib.stats()["blobs"] == n_texts
        assert lib._db.execute("SELECT count(DISTINCT pack_id) FROM entries").fetchone()[0] == 1
    assert ("tokens", n, n) in seen and ("blobs", n_texts, n_texts) in seen
    print(f"\n{n:,}-entry pack imported in {elapsed:.1f} s")


def test_a_big_pack_is_all_or_nothing(engine, big_pack, monkeypatch):
    """A failure at the very last entry leaves none of the pack's entries in the library."""
    big_pack, n_texts = big_pack
    real = entry_writes.insert_prefix_keys  # every entry row is written there (library/entry_writes.py)
    calls = []

    def fail_at_the_end(db, entry_id, blob, n):
        calls.append(entry_id)
        if len(calls) == n_texts * PER_TEXT:
            raise RuntimeError("simulated failure at the last entry")
        return real(db, entry_id, blob, n)

    monkeypatch.setattr(entry_writes, "insert_prefix_keys", fail_at_the_end)
    with open_library() as lib:
        with pytest.raises(RuntimeError, match="last entry"):
            import_pack(LibraryService(engine, lib), big_pack)
        assert lib.count() == 0
        assert lib._db.execute("SELECT count(*) FROM packs").fetchone()[0] == 0
