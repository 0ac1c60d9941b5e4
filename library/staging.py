"""The one blob lifecycle, shared by a deposit, a pack import and the re-compaction of an old blob.

  1. record the blob as pending (committed, names this pid): gc will not take it,
  2. write the blob (temp file, fsync, rename, fsync dir; an intact copy is not written again),
  3. one write transaction: the blob row, the aliases of addresses it replaces, the caller's own
     entry rows, and the pending records removed (refused if gc took one meanwhile).
A failure or a kill before 3 commits leaves only a reclaimable temp file or orphan blob and
pending records that expire, never a half entry (library/maintenance.py reclaims them).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from sqlite_utils import Database

from .blobstore import StoredBlob
from .provenance import now


class BlobStaging:
    """Blobs written for one commit. Made by `staged(lib)`; `put` each blob, then `commit()`."""

    def __init__(self, lib) -> None:
        self.lib = lib
        self.pending: list[int] = []
        self.stored: list[StoredBlob] = []
        self.aliases: list[tuple[str, str]] = []  # (old address, new address)

    def put(self, data, sha: str, elide=None, replaces: str | None = None) -> StoredBlob:
        """Steps 1 and 2 for one blob (`data` hashes to `sha`, checked by the caller), stored eliding the
        `elide` ranges. `replaces`: the address it had before compaction, recorded as an alias in the commit."""
        self.pending += self.lib.mark_pending([sha])
        return self._stored(self.lib.blobs.put(data, sha, trusted=True, elide=elide), replaces)

    def put_container(
        self, container: bytes, sha: str, size: int, chunks: bytes | None = None, replaces: str | None = None
    ) -> StoredBlob:
        """Steps 1 and 2 for a blob already as a compact container (decoding to `size` canonical bytes that
        hash to `sha`, eliding exactly the ranges `put` would: checked by the caller), written as is, with
        its chunk digests when the caller has them."""
        self.pending += self.lib.mark_pending([sha])
        return self._stored(self.lib.blobs.put_container(sha, container, size, chunks), replaces)

    def _stored(self, stored: StoredBlob, replaces: str | None) -> StoredBlob:
        self.stored.append(stored)
        if replaces is not None and replaces != stored.sha256:
            self.aliases.append((replaces, stored.sha256))
        return stored

    @contextmanager
    def commit(self) -> Iterator[Database]:
        """Step 3: yields the connection inside the write transaction for the caller's entry rows."""
        with self.lib.write() as db:
            for stored in self.stored:
                self.lib.insert_blob_row(stored)
            for old, new in self.aliases:
                db.execute(
                    "INSERT OR REPLACE INTO blob_aliases (legacy_sha256, sha256, converted_at) VALUES (?, ?, ?)",
                    [old, new, now()],
                )
            yield db
            self.lib.consume_pending(self.pending)
        self.pending = []


@contextmanager
def staged(lib) -> Iterator[BlobStaging]:
    """A staging whose pending records are forgotten if anything fails before the commit."""
    staging = BlobStaging(lib)
    try:
        yield staging
    except BaseException:
        if staging.pending:
            lib.clear_pending(staging.pending)
        raise
