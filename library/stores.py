"""One interface over every place blobs live: the local disk store and a remote S3 bucket.

The way dulwich keeps its disk, memory and overlay object stores behind one base class: a store
holds blobs as compact containers (library/container.py) named by the SHA-256 of their canonical
bytes, written once and never changed. `BlobStore` (library/blobstore.py, the data dir's `blobs/`)
and `S3BlobStore` (library/remote.py, `blobs/sha256/<hex>` in a bucket) implement it; what moves
blobs between them (push, pull, verify --remote) speaks only this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator

from . import container


class ObjectStore(ABC):
    """Content-addressed, write-once blob containers."""

    @abstractmethod
    def contains(self, sha256: str) -> bool:
        """Whether a blob is stored under this address (its bytes are not checked)."""

    @abstractmethod
    def stored_size(self, sha256: str) -> int | None:
        """The container's size as stored, None when absent."""

    @abstractmethod
    def get_stored(self, sha256: str, limit: int | None = None) -> bytes:
        """The container exactly as stored, unchecked. Raises BlobMissing when absent, BlobCorrupt when
        it is larger than `limit` (nothing larger is read)."""

    @abstractmethod
    def add_stored(self, sha256: str, data: bytes) -> bool:
        """Store a container under its address once: False when one is already there (never
        overwritten). The caller has checked `data` decodes to `sha256` (`read_checked` does)."""

    @abstractmethod
    def iter_shas(self) -> Iterator[str]:
        """Every address stored, in no promised order."""

    def known_chunks(self, sha256: str) -> bytes | None:
        """The SHA-256 of each 2 MiB chunk of the stored container, where the store already computed
        them (a download thread did); None: whoever stores it computes them."""
        return None

    def read_checked(self, sha256: str, expected_size: int | None = None, max_size: int | None = None):
        """(stored container, canonical bytes, elided ranges), after checking the canonical bytes
        hash to the address. Raises BlobMissing, or BlobCorrupt naming the problem."""
        stored = self.get_stored(sha256)
        if not container.is_container(stored[:4]):  # a plain pre-compaction file: wrap it, eliding nothing
            stored = container.make(len(stored), []).header + stored
        data, ranges = container.decode_checked(stored, sha256, expected_size, max_size)
        return stored, data, ranges
