"""Subprocess worker for the library's concurrency and kill tests (no model: synthetic blobs).

    python tests/library_worker.py HOME MODE COUNT SEED [BLOB_BYTES]

MODE: deposit (COUNT deposits), gc (COUNT gc passes), mixed (deposit, and every 5th op an rm + gc),
import (COUNT imports of synthetic 5-entry packs; prints "imported <pack sha256> <entries>").
Prints one line per committed deposit, "committed <id> <blob_sha256>", flushed, so a parent
that kills this process knows exactly what had been committed.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvgraft.library.library import Library  # noqa: E402
from kvgraft.library.maintenance import gc  # noqa: E402

FINGERPRINT = "f" * 64


def _import_synthetic_pack(lib: Library, home: Path, rng: random.Random, seed: int, i: int, blob_bytes: int):
    """Write a 5-entry pack of random blobs and commit it (the library half of an import: no model, so
    the blobs are taken as checked once their SHA-256 is)."""
    from kvgraft.library.admission import (
        Admitted,
        CheckedBlob,
        EntryProof,
        HeldBlobs,
        SourceRecord,
        commit_admission,
    )
    from kvgraft.library.pack import PackReader, pack_sha256, write_pack
    from kvgraft.library.records import UNPROVEN, ModelRecord
    from kvgraft.library.staging import staged
    from kvgraft.library.tokens import tokens_sha256

    entries, blobs, toks = [], {}, []
    for k in range(5):
        t = [rng.randrange(262144) for _ in range(rng.randint(8, 200))]
        blob = rng.randbytes(blob_bytes)
        import hashlib

        from kvgraft.library import container

        sha = hashlib.sha256(blob).hexdigest()
        blobs[sha] = container.make(len(blob), []).header + blob  # a compact container eliding nothing
        toks.append(t)
        entries.append(
            {
                "blob_sha256": sha,
                "blob_size": len(blob),
                "blob_stored_size": len(blobs[sha]),
                "kind": "document",
                "title": None,
                "question": f"pack {seed}-{i} item {k}",
                "text": f"pack {seed}-{i} item {k}",
                "answer": None,
                "n_tokens": len(t),
                "tokens_sha256": tokens_sha256(t),
                "checker": None,
                "receipt": None,
            }
        )
    manifest = {
        "format_version": 2,
        "kvgraft_version": "test",
        "model": {"sha256": "a" * 64, "name": "m", "architecture": "x"},
        "fingerprint": FINGERPRINT,
        "entries": entries,
    }
    path = home.parent / f"worker-{seed}-{i}.kvpack"
    write_pack(path, manifest, [(sha, lambda b=b: b) for sha, b in blobs.items()])
    sha = pack_sha256(path)
    with PackReader(path) as reader, staged(lib) as staging:
        m = reader.manifest
        held = HeldBlobs(staging)
        for name in reader.blob_shas():
            stored, data, ranges = reader.read_checked(name)
            held.keep(CheckedBlob(name, name, len(data), 0, ranges, data, container=stored))
        proof = EntryProof(UNPROVEN, FINGERPRINT, None, None, None)
        record = SourceRecord(sha, path.name, 2, "test", None, len(m.entries), "a" * 64)
        admitted = [Admitted(e, t, proof) for e, t in zip(m.entries, toks, strict=True)]
        res = commit_admission(lib, held, record, admitted, ModelRecord("a" * 64, "m", "x", 1))
    path.unlink()
    return sha, res["imported"]


def main() -> int:
    home, mode, count, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    blob_bytes = int(sys.argv[5]) if len(sys.argv) > 5 else 4096
    rng = random.Random(seed)
    lib = Library(home)
    print("ready", flush=True)
    for i in range(count):
        if mode in ("deposit", "mixed"):
            t0 = time.perf_counter()
            tokens = [rng.randrange(262144) for _ in range(rng.randint(8, 300))]
            blob = rng.randbytes(blob_bytes)
            entry, _ = lib.add_entry(
                kind="document",
                text=f"worker {seed} item {i}",
                tokens=tokens,
                blob=blob,
                fingerprint=FINGERPRINT,
                question=f"question {seed}-{i}",
            )
            print(f"committed {entry.id} {entry.blob_sha256} {time.perf_counter() - t0:.4f}", flush=True)
            if mode == "mixed" and i % 5 == 4:
                # announced before it commits: a kill right after the commit must not look like a lost entry
                print(f"removed {entry.id}", flush=True)
                lib.remove(entry.id)
                gc(lib, grace_s=0)
        elif mode == "import":
            n = _import_synthetic_pack(lib, home, rng, seed, i, blob_bytes)
            print(f"imported {n[0]} {n[1]}", flush=True)
        elif mode == "gc":
            gc(lib, grace_s=0)
            print(f"gc {i + 1}", flush=True)
        else:
            raise SystemExit(f"unknown mode {mode}")
    lib.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
