"""A second process uploading cache records to a remote, slowly: each blob, a pause, then its record (as an
instance's uploader writes them), so a gc or a kill -9 can land between the two (tests/test_shared_cache.py).

    python -m tests.cache_uploader BUCKET ENDPOINT KEY_FILE COUNT PAUSE_S
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

from kvgraft.library import container
from kvgraft.library.remote import RemoteSpec
from kvgraft.library.remote_cache import CacheRecord, RemoteCacheStore, signed_record


def main(bucket: str, endpoint: str, key: str, count: int, pause_s: float, first: int = 0) -> None:
    store = RemoteCacheStore(RemoteSpec("team", bucket, "fleet/", endpoint))
    for i in range(first, first + count):
        data = os.urandom(64 << 10)
        stored = container.make(len(data), []).header + data
        sha = hashlib.sha256(data).hexdigest()
        record = CacheRecord("f" * 64, hashlib.sha256(f"{i}".encode()).hexdigest(), 1, sha, len(data), len(stored))
        store.blobs.add_stored(sha, stored)
        print(f"blob {i}", flush=True)
        time.sleep(pause_s)
        store.blobs.put_once(store.record_key(record.key), signed_record(record, Path(key)))
        print(f"record {i}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
