"""Subprocess worker for the library's concurrency and kill tests (no model: synthetic blobs).

    python tests/library_worker.py HOME MODE COUNT SEED [BLOB_BYTES]

MODE: deposit (COUNT deposits), gc (COUNT gc passes), mixed (deposit, and every 5th op an rm + gc).
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

from library.index import Library  # noqa: E402
from library.maintenance import gc  # noqa: E402

FINGERPRINT = "f" * 64


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
            entry, _ = lib.add_entry(kind="document", text=f"worker {seed} item {i}", tokens=tokens, blob=blob,
                                     fingerprint=FINGERPRINT, question=f"question {seed}-{i}")
            print(f"committed {entry.id} {entry.blob_sha256} {time.perf_counter() - t0:.4f}", flush=True)
            if mode == "mixed" and i % 5 == 4:
                lib.remove(entry.id)
                print(f"removed {entry.id}", flush=True)
                gc(lib, grace_s=0)
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
