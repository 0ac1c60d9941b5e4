"""A pull's downloaded blobs, read as an object store (library/stores.py), so a pull admits its
entries through the one way in (app/packs/admission.py) as an import does a pack's.

Each blob was checked against its address as it was downloaded (app/remote/pull.py): one read from the
remote, one SHA-256 pass, on a download thread. Held in memory, it is handed to the admission as it
is (no second hash); spilled to a temp file past the memory budget, it is checked again as it is read
back: a file changed in between is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from kvgraft.library import container
from kvgraft.library.errors import BlobCorrupt, BlobMissing
from kvgraft.library.pack import PackError
from kvgraft.library.stores import ObjectStore


@dataclass(frozen=True)
class Held:
    """A downloaded blob checked against its address: the container and its canonical bytes."""

    stored: bytes
    canonical: bytearray
    ranges: np.ndarray
    chunks: bytes  # SHA-256 of each 2 MiB chunk of `stored` (what the library's index keeps)


class DownloadedBlobs(ObjectStore):
    """Read-only: the blobs one pull downloaded and checked, in memory or spilled to temp files."""

    def __init__(self, blobs: dict[str, "Held | Path"]) -> None:
        self.blobs = blobs

    def contains(self, sha256: str) -> bool:
        return sha256 in self.blobs

    def stored_size(self, sha256: str) -> int | None:
        held = self.blobs.get(sha256)
        if held is None:
            return None
        return len(held.stored) if isinstance(held, Held) else held.stat().st_size

    def get_stored(self, sha256: str, limit: int | None = None) -> bytes:
        held = self.blobs.get(sha256)
        if held is None:
            raise BlobMissing(f"blob {sha256[:16]}... was not downloaded")
        return held.stored if isinstance(held, Held) else held.read_bytes()

    def add_stored(self, sha256: str, data: bytes) -> bool:
        raise PackError("a pull's downloaded blobs are read-only")

    def iter_shas(self) -> Iterator[str]:
        return iter(sorted(self.blobs))

    def known_chunks(self, sha256: str) -> bytes | None:
        held = self.blobs.get(sha256)
        return held.chunks if isinstance(held, Held) else None

    def read_checked(self, sha256: str, expected_size: int | None = None, max_size: int | None = None):
        """(container, canonical bytes, elided ranges). A blob held in memory was decoded and checked as
        it was downloaded: handed out as it is, after its sizes; a spilled one is checked again."""
        held = self.blobs.get(sha256)
        if held is None:
            raise PackError(f"blob {sha256[:16]}... was not downloaded")
        if isinstance(held, Held):
            size = len(held.canonical)
            if expected_size is not None and size != expected_size:
                raise PackError(f"blob {sha256[:16]}... holds {size:,} bytes, the manifest says {expected_size:,}")
            if max_size is not None and size > max_size:
                raise PackError(f"blob {sha256[:16]}... decodes to more than a state of this context")
            return held.stored, held.canonical, held.ranges
        try:
            stored = held.read_bytes()
            data, ranges = container.decode_checked(stored, sha256, expected_size, max_size)
            return stored, data, ranges
        except BlobCorrupt as exc:
            raise PackError(str(exc)) from exc
        except OSError as exc:
            raise PackError(f"blob {sha256[:16]}... cannot be read back: {exc.strerror or exc}") from exc
