"""Committing a validated pack into a library: all of it or nothing.

The caller (app/packs/imports.py) has already checked the archive, the manifest, the model and
fingerprint, every blob's SHA-256 and state layout, and each entry's tokens. Here the blobs are
recorded as pending, written (a blob already in the store is not copied again), and then every
entry (written through `Library.write_entry_row`, library/entry_writes.py, as a deposit writes
its entry), its prefix keys and the pack's row go in ONE transaction. A kill before that commit
leaves only reclaimable blobs; after it, the whole pack.

Blobs are stored compact and addressed by their canonical bytes. A format 2 pack carries them
that way; a format 1 pack carries the bytes as llama.cpp wrote them, and the caller's
`canonicalize(buffer) -> elided ranges` (engine/compaction.py with the model's window) turns
each into its canonical form first: its entries get the new address, the old one is kept in
`blob_aliases`. A format 2 blob, which the caller has checked is canonical for the model, goes
through the same function for its ranges: the ranges stored are always the model's dead cells,
never ranges a pack declares.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from . import container
from .entry_writes import PRESENT, entry_row
from .errors import LibraryError
from .library import Library, now
from .pack import PackReader
from .records import UNPROVEN, ModelRecord
from .staging import staged
from .tokens import tokens_sha256


@dataclass(frozen=True)
class EntryProof:
    """How one pack entry's state is known (the caller found it out: replay, trusted signature)."""

    proof: str  # local / replayed / signed:<key name> / unproven
    fingerprint: str  # the engine it is proven for (the pack's own for an unproven entry)
    receipt: dict | None
    vouched_by: str | None  # who vouched for the answer, None: stated
    schedule: dict | None
    replay_s: float | None = None
    replay_tokens: int = 0
    existing_id: int | None = None  # proven by an entry already here with the same text and state


def commit_pack(
    lib: Library,
    reader: PackReader,
    tokens: Sequence[Sequence[int]],
    pack_sha256: str,
    model: ModelRecord,
    signer: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    canonicalize: Callable[[bytearray], object] | None = None,
    proofs: Sequence[EntryProof] | None = None,
) -> dict:
    entries = reader.manifest.entries
    if len(tokens) != len(entries):
        raise LibraryError("one token list per pack entry is needed")
    if proofs is None:
        proofs = [EntryProof(UNPROVEN, reader.manifest.fingerprint, e.receipt, None, None) for e in entries]
    if len(proofs) != len(entries):
        raise LibraryError("one proof per pack entry is needed")
    for i, (e, t) in enumerate(zip(entries, tokens, strict=True)):
        if len(t) != e.n_tokens or tokens_sha256(t) != e.tokens_sha256:
            raise LibraryError(f"entry {i}: its text does not tokenize to the tokens the pack declares")
    shas = reader.blob_shas()
    if not reader.compact and canonicalize is None:
        raise LibraryError("a format 1 pack's blobs need canonicalizing: pass the model's canonicalize function")
    with staged(lib) as staging:
        address = {}
        for k, sha in enumerate(shas):
            stored, data, ranges = reader.read_blob_stored(sha)  # checked against its SHA-256 as it is read
            new, as_is = sha, None
            if canonicalize is not None:  # the ranges stored are the model's dead cells, never the pack's own
                data = data if isinstance(data, bytearray) else bytearray(data)
                dead = canonicalize(data)  # a format 2 blob is already canonical (app/packs/imports.py checked)
                if not reader.compact:
                    new = hashlib.sha256(data).hexdigest()
                elif ranges is not None and np.array_equal(container.normalize_ranges(dead, len(data)), ranges):
                    as_is = stored  # the member elides exactly the dead cells: written as it came, one pass
                ranges = dead
            chunks = reader.stored_chunks(sha) if as_is is not None and hasattr(reader, "stored_chunks") else None
            staging.put(data, new, elide=ranges, replaces=sha, container=as_is, chunks=chunks)  # intact: not rewritten
            address[sha] = new
            if on_progress:
                on_progress(k + 1, len(shas))
        imported = skipped = 0
        with staging.commit():
            lib._insert_model(model)
            row = lib._db.execute("SELECT id FROM packs WHERE sha256 = ?", [pack_sha256]).fetchone()
            if row:
                pack_id = row[0]
            else:
                pack_id = (
                    lib._db["packs"]
                    .insert(
                        {
                            "sha256": pack_sha256,
                            "file_name": reader.path.name,
                            "format_version": reader.manifest.format_version,
                            "kvgraft_version": reader.manifest.kvgraft_version,
                            "signer": signer,
                            "n_entries": len(entries),
                            "imported_at": now(),
                        }
                    )
                    .last_pk
                )
            for e, t, pr in zip(entries, tokens, proofs, strict=True):
                if pr.existing_id is not None:  # its proof is that entry: it must still be there, unchanged
                    same = lib.find_same(e.tokens_sha256, pr.fingerprint, e.kind, e.question, e.answer)
                    if (
                        same is None
                        or same.id != pr.existing_id
                        or same.blob_sha256 != address[e.blob_sha256]
                        or not same.proven
                    ):
                        raise LibraryError(
                            "the library changed while the pack was imported (an entry it matched was "
                            "removed or changed); nothing was imported: import it again"
                        )
                    skipped += 1
                    continue
                row = entry_row(
                    kind=e.kind,
                    text=e.text,
                    tokens=t,
                    blob_sha256=address[e.blob_sha256],
                    blob_size=e.blob_size,
                    fingerprint=pr.fingerprint,
                    model_sha256=reader.manifest.model_sha256,
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
