"""A remote manifest and its downloaded blobs, read the way a `.kvpack` is read (library/pack.py's
`PackReader` interface), so that a pull proves and commits its entries with the import's own code
(app/packs/imports.py, library/importer.py): the same checks, the same proof rules, one transaction.

Blobs were checked against their addresses as they were downloaded (app/remote/pull.py); those
spilled to temp files are checked again as they are read: a file changed in between is refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvgraft.library import container
from kvgraft.library.errors import BlobCorrupt
from kvgraft.library.manifest import Manifest
from kvgraft.library.pack import PackError
from kvgraft.library.signing import Signer


@dataclass(frozen=True)
class Held:
    """A downloaded blob checked against its address: the container and its canonical bytes."""

    stored: bytes
    canonical: bytearray
    ranges: np.ndarray
    chunks: bytes  # SHA-256 of each 2 MiB chunk of `stored` (what the library's index keeps)


class FetchedPack:
    compact = True  # the remote format stores compact containers only (format 2 and up)

    def __init__(
        self,
        label: str,
        manifest: Manifest,
        blob_files: dict[str, "Held | Path"],  # checked blobs: in memory, or spilled to a temp file
        signer: Signer | None,
        signature_error: str | None,
        indices: list[int] | None = None,
    ) -> None:
        self.path = Path(label)  # what the packs table records as the file name
        self.full = manifest
        self.indices = list(range(len(manifest.entries))) if indices is None else list(indices)
        self.manifest = dataclasses.replace(
            manifest,
            entries=tuple(manifest.entries[i] for i in self.indices),
            raw={**manifest.raw, "entries": [manifest.raw["entries"][i] for i in self.indices]},
        )
        self.blob_files = blob_files
        self.signer, self.signature_error = signer, signature_error
        self.max_blob_size: int | None = None
        self._sizes = {e.blob_sha256: e.blob_size for e in self.manifest.entries}

    def subset(self, positions: list[int]) -> "FetchedPack":
        """The same manifest with only these entries (positions in this reader's own entry list)."""
        sub = FetchedPack(
            str(self.path),
            self.full,
            self.blob_files,
            self.signer,
            self.signature_error,
            [self.indices[p] for p in positions],
        )
        sub.max_blob_size = self.max_blob_size
        return sub

    def blob_shas(self) -> list[str]:
        return sorted({e.blob_sha256 for e in self.manifest.entries})

    def stored_chunks(self, sha256: str) -> bytes | None:
        """The chunk digests of a container held in memory, computed on a download thread."""
        held = self.blob_files.get(sha256)
        return held.chunks if isinstance(held, Held) else None

    def read_blob(self, sha256: str):
        return self.read_blob_stored(sha256)[1]

    def read_blob_ranges(self, sha256: str):
        return self.read_blob_stored(sha256)[1:]

    def read_blob_stored(self, sha256: str):
        """(container, canonical bytes, elided ranges). A blob held in memory was decoded and
        checked as it was downloaded (its canonical bytes are handed out as they are); one spilled
        to a temp file is checked again as it is read back."""
        held = self.blob_files.get(sha256)
        if held is None:
            raise PackError(f"blob {sha256[:16]}... was not downloaded")
        if isinstance(held, Held):  # each entry's declared sizes, checked against what was downloaded
            if len(held.canonical) != self._sizes.get(sha256):
                raise PackError(
                    f"blob {sha256[:16]}... holds {len(held.canonical):,} bytes, the manifest says "
                    f"{self._sizes.get(sha256)}"
                )
            if self.max_blob_size is not None and len(held.canonical) > self.max_blob_size:
                raise PackError(f"blob {sha256[:16]}... decodes to more than a state of this context")
            return held.stored, held.canonical, held.ranges
        try:
            stored = held.read_bytes()
            data, ranges = container.decode_checked(stored, sha256, self._sizes.get(sha256), self.max_blob_size)
            return stored, data, ranges
        except BlobCorrupt as exc:
            raise PackError(str(exc)) from exc
        except OSError as exc:
            raise PackError(f"blob {sha256[:16]}... cannot be read back: {exc.strerror or exc}") from exc
