"""The library half of the one way in: checked blobs and proven entries, committed all or nothing.

Every state that enters the library from elsewhere (a `.kvpack` import, a pull from a remote) takes one
path (app/packs/admission.py holds the engine's half):

  1. a source (library/pack.py's `PackReader`, app/remote/fetched.py's downloaded blobs: both
     `ObjectStore`s) and its manifest's typed entries (`PackEntry`, parsed once);
  2. each blob read once through the store's `read_checked` (one read, one SHA-256 pass), its state
     layout checked against the model, and kept here as a `CheckedBlob`: in memory while the pull's
     memory budget lasts, past it staged at once (written as a pending blob, library/staging.py);
  3. each entry proven (`EntryProof`: a trusted signer, an equal entry already here, or a replay);
  4. `commit_admission`: the held blobs staged, then the source's row, every entry row and the
     blobs' rows in ONE transaction. A failure or a kill before that commit leaves only reclaimable
     pending blobs; after it, the whole source.

Blobs are stored compact and addressed by their canonical bytes. A format 1 pack's blob was named by
llama.cpp's bytes: its canonical form gets the new address and the old name is kept in `blob_aliases`.
The ranges stored elided are always the model's dead cells, never ranges a source declares; a
container that elides exactly those is written as it came (one pass).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .blobstore import StoredBlob
from .entry_writes import PRESENT, entry_row
from .errors import LibraryError
from .manifest import PackEntry
from .records import ModelRecord
from .staging import BlobStaging


def memory_budget() -> int:
    """Checked blob bytes one admission holds in memory (a quarter of RAM, 256 MiB to 4 GiB); past it
    each checked blob is staged at once instead of held."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 4 << 30
    return max(256 << 20, min(4 << 30, ram // 4))


@dataclass
class CheckedBlob:
    """One blob of a source, read once and checked: its canonical bytes hash to `address`, they are a
    state of `n_tokens` tokens for this model, and `dead` are the model's dead cells in them."""

    name: str  # its name in the source (= address, but for a format 1 pack's raw bytes)
    address: str  # the SHA-256 of its canonical bytes
    size: int  # canonical bytes
    n_tokens: int
    dead: np.ndarray  # elided ranges as the library stores them
    canonical: bytearray | bytes | None  # what is written, unless `container` is (None once staged)
    container: bytes | None = None  # the source's container when it elides exactly `dead`: written as is
    chunks: bytes | None = None  # the container's chunk digests, when the source computed them
    staged: StoredBlob | None = None

    def __post_init__(self) -> None:
        if self.container is not None:  # the container is what gets written: only it is held
            self.canonical = None

    @property
    def held_bytes(self) -> int:
        return len(self.container if self.container is not None else self.canonical or b"")

    def stage(self, staging: BlobStaging) -> None:
        """Write it as a pending blob (once), and let go of its bytes."""
        if self.staged is None:
            if self.container is not None:
                self.staged = staging.put_container(self.container, self.address, self.size, self.chunks, self.name)
            else:
                self.staged = staging.put(self.canonical, self.address, elide=self.dead, replaces=self.name)
        self.canonical = self.container = None


class HeldBlobs:
    """The checked blobs of one admission: held in memory up to `budget` bytes, staged past it."""

    def __init__(self, staging: BlobStaging, budget: int | None = None) -> None:
        self.staging = staging
        self.left = memory_budget() if budget is None else budget
        self.by_name: dict[str, CheckedBlob] = {}

    def keep(self, blob: CheckedBlob) -> None:
        if blob.held_bytes > self.left:
            blob.stage(self.staging)
        else:
            self.left -= blob.held_bytes
        self.by_name[blob.name] = blob

    def address(self, name: str) -> str:
        return self.by_name[name].address

    def __contains__(self, name: str) -> bool:
        return name in self.by_name


@dataclass(frozen=True)
class EntryProof:
    """How one incoming entry's state is known (found by app/packs/admission.py)."""

    proof: str  # local / replayed / signed:<key name> / unproven
    fingerprint: str  # the engine it is proven for (the source's own for an unproven entry)
    receipt: dict | None
    vouched_by: str | None  # who vouched for the answer, None: stated
    schedule: dict | None
    replay_s: float | None = None
    replay_tokens: int = 0
    existing_id: int | None = None  # proven by an entry already here with the same text and state


@dataclass(frozen=True)
class Admitted:
    """An entry ready to commit: checked, its tokens computed here, proven."""

    entry: PackEntry
    tokens: Sequence[int]
    proof: EntryProof


@dataclass(frozen=True)
class SourceRecord:
    """The `packs` row of where entries came from (a pack file, or a remote's manifest)."""

    sha256: str
    file_name: str
    format_version: int
    kvgraft_version: str
    signer: str | None  # the key id that signed it (trusted or not)
    n_entries: int
    model_sha256: str


def commit_admission(
    lib,
    held: HeldBlobs,
    source: SourceRecord,
    admitted: Sequence[Admitted],
    model: ModelRecord,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Stage the blobs the admitted entries name, then commit the source's row and every entry in one
    transaction. Returns {"imported", "skipped", "pack_id"}."""
    names = sorted({a.entry.blob_sha256 for a in admitted})
    for k, name in enumerate(names):
        held.by_name[name].stage(held.staging)
        if on_progress:
            on_progress(k + 1, len(names))
    imported = skipped = 0
    with held.staging.commit():
        lib.insert_model(model)
        pack_id = lib.record_pack(source)
        for a in admitted:
            e, pr = a.entry, a.proof
            address = held.address(e.blob_sha256)
            if pr.existing_id is not None:  # its proof is that entry: it must still be there, unchanged
                same = lib.find_same(e.tokens_sha256, pr.fingerprint, e.kind, e.question, e.answer)
                if same is None or same.id != pr.existing_id or same.blob_sha256 != address or not same.proven:
                    raise LibraryError(
                        "the library changed while the pack was imported (an entry it matched was "
                        "removed or changed); nothing was imported: import it again"
                    )
                skipped += 1
                continue
            row = entry_row(
                kind=e.kind,
                text=e.text,
                tokens=a.tokens,
                blob_sha256=address,
                blob_size=e.blob_size,
                fingerprint=pr.fingerprint,
                model_sha256=source.model_sha256,
                title=e.title,
                question=e.question,
                answer=e.answer,
                source="pack",
                pack_id=pack_id,
                receipt=pr.receipt,
                checker=e.checker,
                proof=pr.proof,
                schedule=pr.schedule,
                vouched_by=pr.vouched_by if e.answer is not None else None,
            )
            _, did = lib.write_entry_row(row)
            imported += did != PRESENT
            skipped += did == PRESENT
    return {"imported": imported, "skipped": skipped, "pack_id": pack_id}
