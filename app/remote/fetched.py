"""A remote manifest and its downloaded blobs, read the way a `.kvpack` is read (library/pack.py's
`PackReader` interface), so that a pull proves and commits its entries with the import's own code
(app/packs/imports.py, library/importer.py): the same checks, the same proof rules, one transaction.

Blobs were checked against their addresses as they were downloaded (app/remote/pull.py) and are
checked again here as they are read: a temp file changed in between is refused, not imported.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvgraft.library import container
from kvgraft.library.errors import BlobCorrupt
from kvgraft.library.manifest import Manifest
from kvgraft.library.pack import PackError
from kvgraft.library.signing import Signer


class FetchedPack:
    compact = True  # the remote format stores compact containers only (format 2 and up)

    def __init__(
        self,
        label: str,
        manifest: Manifest,
        blob_files: dict[str, Path],
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

    def stored_size(self, sha256: str) -> int:
        return self.blob_files[sha256].stat().st_size

    def read_blob(self, sha256: str):
        return self.read_blob_ranges(sha256)[0]

    def read_blob_ranges(self, sha256: str):
        path = self.blob_files.get(sha256)
        if path is None:
            raise PackError(f"blob {sha256[:16]}... was not downloaded")
        try:
            return container.decode_checked(path.read_bytes(), sha256, self._sizes.get(sha256), self.max_blob_size)
        except BlobCorrupt as exc:
            raise PackError(str(exc)) from exc
        except OSError as exc:
            raise PackError(f"blob {sha256[:16]}... cannot be read back: {exc.strerror or exc}") from exc
