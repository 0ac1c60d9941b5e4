"""Committing a validated pack into a library: all of it or nothing.

The caller (app/packs.py) has already checked the archive, the manifest, the model and
fingerprint, every blob's SHA-256 and state layout, and each entry's tokens. Here the blobs are
recorded as pending, written (a blob already in the store is not copied again), and then every
entry, its prefix keys and the pack's row go in ONE transaction. A kill before that commit
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
import json
from dataclasses import dataclass
from typing import Callable, Sequence

from .errors import LibraryError
from .library import Library, now
from .normalize import question_key
from .pack import PackReader
from .records import UNPROVEN, ModelRecord
from .schema import insert_prefix_keys
from .staging import staged
from .tokens import pack_tokens, tokens_sha256


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
    for i, (e, t) in enumerate(zip(entries, tokens)):
        if len(t) != e.n_tokens or tokens_sha256(t) != e.tokens_sha256:
            raise LibraryError(f"entry {i}: its text does not tokenize to the tokens the pack declares")
    shas = reader.blob_shas()
    if not reader.compact and canonicalize is None:
        raise LibraryError("a format 1 pack's blobs need canonicalizing: pass the model's canonicalize function")
    with staged(lib) as staging:
        address = {}
        for k, sha in enumerate(shas):
            data, ranges = reader.read_blob_ranges(sha)  # checked against its SHA-256 again as it is read
            new = sha
            if canonicalize is not None:  # the ranges stored are the model's dead cells, never the pack's own
                data = data if isinstance(data, bytearray) else bytearray(data)
                ranges = canonicalize(data)  # a format 2 blob is already canonical (app/packs.py checked)
                if not reader.compact:
                    new = hashlib.sha256(data).hexdigest()
            staging.put(data, new, elide=ranges, replaces=sha)  # an intact copy is not written again
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
            for e, t, pr in zip(entries, tokens, proofs):
                same = lib.find_same(e.tokens_sha256, pr.fingerprint, e.kind, e.question, e.answer)
                if pr.existing_id is not None:  # its proof is that entry: it must still be there, unchanged
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
                if same is not None and same.damaged is None and (same.proven or pr.proof == UNPROVEN):
                    skipped += 1
                    continue
                receipt = json.dumps(pr.receipt, sort_keys=True) if pr.receipt else None
                schedule = json.dumps(pr.schedule, sort_keys=True) if pr.schedule else None
                if same is not None:  # an unproven or damaged twin, proven now: it takes the proven state
                    vouched = pr.vouched_by if e.answer is not None else None
                    lib._db.execute(
                        "UPDATE entries SET blob_sha256 = ?, blob_size = ?, proof = ?, receipt = ?, schedule = ?, "
                        "damaged = NULL, vouched_by = coalesce(?, vouched_by), "
                        "verified_at = CASE WHEN ? IS NULL THEN verified_at ELSE ? END WHERE id = ?",
                        [
                            address[e.blob_sha256],
                            e.blob_size,
                            pr.proof,
                            receipt,
                            schedule,
                            vouched,
                            vouched,
                            now(),
                            same.id,
                        ],
                    )
                    imported += 1
                    continue
                t_now = now()
                entry_id = (
                    lib._db["entries"]
                    .insert(
                        {
                            "kind": e.kind,
                            "title": e.title,
                            "question": e.question,
                            "question_key": question_key(e.question) if e.question else None,
                            "text": e.text,
                            "tokens": pack_tokens(t),
                            "n_tokens": e.n_tokens,
                            "tokens_sha256": e.tokens_sha256,
                            "answer": e.answer,
                            "blob_sha256": address[e.blob_sha256],
                            "blob_size": e.blob_size,
                            "fingerprint": pr.fingerprint,
                            "model_sha256": reader.manifest.model_sha256,
                            "source": "pack",
                            "pack_id": pack_id,
                            "created_at": t_now,
                            "verified_at": t_now if e.answer is not None and pr.vouched_by else None,
                            "damaged": None,
                            "receipt": receipt,
                            "checker": e.checker,
                            "proof": pr.proof,
                            "schedule": schedule,
                            "vouched_by": pr.vouched_by if e.answer is not None else None,
                        }
                    )
                    .last_pk
                )
                insert_prefix_keys(lib._db, entry_id, pack_tokens(t), e.n_tokens)
                imported += 1
    return {"imported": imported, "skipped": skipped, "pack_id": pack_id}
