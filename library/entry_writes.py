"""Writing entries. Mixed into `Library`: the one way an entry row reaches the index.

Every writer goes through here: a deposit (`add_entry`), a document's sections (library/sources.py),
a pack import or a pull (library/admission.py) and a rebuild (`entry_batch`). `entry_row` makes the row from an
entry's facts and `write_entry_row` writes it inside a write transaction, after its blob's row:

- an intact twin (same tokens, fingerprint, kind, question and answer) that is proven, or any intact
  twin when the new row is unproven itself, is kept and nothing is written ("present");
- a damaged or unproven twin is repaired ("repaired"): it takes the new blob, proof, receipt and
  schedule, its damage is cleared (and that of every entry of the now intact blob), and a voucher
  the new row names is recorded (with the time it vouched), an earlier one kept otherwise;
- otherwise a new row with its prefix keys ("new").

A batch (`entry_batch`) stages every entry's blob as pending first (library/staging.py) and commits
all the rows in one transaction: a failure or a cancel before the commit leaves the library as it
was (the staged blobs are reclaimed by gc).
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

from .errors import BlobCorrupt, LibraryError
from .normalize import question_key
from .provenance import now
from .records import KINDS, LOCAL, UNPROVEN, Entry, ModelRecord
from .schema import insert_prefix_keys
from .staging import BlobStaging, staged
from .tokens import pack_tokens, tokens_sha256

PRESENT, REPAIRED, NEW = "present", "repaired", "new"  # what `write_entry_row` did


def entry_row(
    *,
    kind: str,
    text: str,
    tokens: Sequence[int],
    blob_sha256: str,
    blob_size: int,
    fingerprint: str,
    model_sha256: str | None = None,
    title: str | None = None,
    question: str | None = None,
    answer: str | None = None,
    source: str = "local",
    pack_id: int | None = None,
    receipt: dict | None = None,
    checker: str | None = None,
    proof: str = LOCAL,
    schedule: dict | None = None,
    vouched_by: str | None = None,
) -> dict:
    """The columns of an entry row (the times and the damage are `write_entry_row`'s)."""
    if kind not in KINDS:
        raise LibraryError(f"kind must be one of {KINDS}, got {kind!r}")
    if not tokens:
        raise LibraryError("an entry needs at least one token")
    return dict(
        kind=kind,
        title=title,
        question=question,
        question_key=question_key(question) if question else None,
        text=text,
        tokens=pack_tokens(tokens),
        n_tokens=len(tokens),
        tokens_sha256=tokens_sha256(tokens),
        answer=answer,
        blob_sha256=blob_sha256,
        blob_size=blob_size,
        fingerprint=fingerprint,
        model_sha256=model_sha256,
        source=source,
        pack_id=pack_id,
        receipt=json.dumps(receipt, sort_keys=True) if receipt else None,
        checker=checker,
        proof=proof,
        schedule=json.dumps(schedule, sort_keys=True) if schedule else None,
        vouched_by=vouched_by,
    )


@dataclass(frozen=True)
class StagedEntry:
    """An entry whose blob is staged (pending): its row and model, written by the commit."""

    row: dict
    model: ModelRecord | None


class EntryBatch:
    """Entries staged for one commit. Made by `Library.entry_batch`; `add` each, then `commit()`."""

    def __init__(self, lib, staging: BlobStaging) -> None:
        self.lib, self.staging = lib, staging
        self._items: list[tuple[Entry | None, StagedEntry | None]] = []

    @property
    def size(self) -> int:
        """How many entries were added or kept so far (the next one's position in `commit`'s list)."""
        return len(self._items)

    def keep(self, entry: Entry) -> None:
        """An entry already stored that the batch counts as its next one (nothing staged)."""
        self._items.append((entry, None))

    def add(self, **entry) -> Entry | None:
        """Stage one entry (`stage_entry`'s keywords); returns the intact entry already stored instead
        (nothing staged), else None."""
        found, pending = self.lib.stage_entry(self.staging, **entry)
        self._items.append((found, pending))
        return found

    def commit(self) -> list[tuple[Entry, bool]]:
        """One transaction: every staged row written. (entry, created) per `add`, in order."""
        ids: list[tuple[int, bool]] = []
        with self.staging.commit():
            for found, pending in self._items:
                if found is not None:
                    self.lib.get(found.id)  # EntryNotFound (nothing written) if it was removed meanwhile
                    ids.append((found.id, False))
                else:
                    i, did = self.lib.write_staged(pending)
                    ids.append((i, did == NEW))
        return [(self.lib.get(i), created) for i, created in ids]


class EntryWrites:
    """Entry writes on a `Library` (needs its `_db`, `write`, `find_same`, `get`, `insert_model`)."""

    def add_entry(self, **entry) -> tuple[Entry, bool]:
        """Store a blob and its entry; return (entry, created). The same deposit twice is one entry.
        The keywords are `stage_entry`'s."""
        with staged(self) as staging:
            existing, pending = self.stage_entry(staging, **entry)
            if existing is not None:
                return existing, False
            with staging.commit():
                entry_id, did = self.write_staged(pending)
        return self.get(entry_id), did == NEW

    @contextmanager
    def entry_batch(self) -> Iterator[EntryBatch]:
        """Stage several entries, then `commit` them in one transaction; a failure before changes nothing."""
        with staged(self) as staging:
            yield EntryBatch(self, staging)

    def stage_entry(
        self,
        staging: BlobStaging,
        *,
        kind: str,
        text: str,
        tokens: Sequence[int],
        blob,
        fingerprint: str,
        model: ModelRecord | None = None,
        title: str | None = None,
        question: str | None = None,
        answer: str | None = None,
        blob_sha256: str | None = None,
        source: str = "local",
        pack_id: int | None = None,
        receipt: dict | None = None,
        checker: str | None = None,
        elided=None,
        proof: str = LOCAL,
        schedule: dict | None = None,
        vouched_by: str | None = None,
    ) -> tuple[Entry | None, StagedEntry | None]:
        """Steps 1-2 of a deposit (library/staging.py): (the intact entry already stored, None), or
        (None, what `write_staged` commits).

        `blob` is the canonical bytes (its SHA-256 is the address); `elided` lists the byte ranges
        of it that are zero and need not be stored (library/container.py)."""
        same = self.find_same(tokens_sha256(tokens), fingerprint, kind, question, answer)
        if same is not None and same.damaged is None and (same.proven or proof == UNPROVEN):
            return same, None
        view = memoryview(blob).cast("B")
        sha = hashlib.sha256(view).hexdigest()
        if blob_sha256 is not None and blob_sha256 != sha:
            raise BlobCorrupt(f"blob bytes hash to {sha}, not the declared {blob_sha256}")
        row = entry_row(  # checks the kind and the tokens before anything is staged
            kind=kind,
            text=text,
            tokens=tokens,
            blob_sha256=sha,
            blob_size=len(view),
            fingerprint=fingerprint,
            model_sha256=model.sha256 if model else None,
            title=title,
            question=question,
            answer=answer,
            source=source,
            pack_id=pack_id,
            receipt=receipt,
            checker=checker,
            proof=proof,
            schedule=schedule,
            vouched_by=vouched_by,
        )
        staging.put(view, sha, elide=elided)
        return None, StagedEntry(row, model)

    def record_pack(self, source) -> int:
        """The `packs` row of an admission's source (library/admission.py `SourceRecord`), inside its
        commit: the existing row's id when the same pack (by SHA-256) came in before."""
        row = self._db.execute("SELECT id FROM packs WHERE sha256 = ?", [source.sha256]).fetchone()
        if row:
            return row[0]
        return (
            self._db["packs"]
            .insert(
                {
                    "sha256": source.sha256,
                    "file_name": source.file_name,
                    "format_version": source.format_version,
                    "kvgraft_version": source.kvgraft_version,
                    "signer": source.signer,
                    "n_entries": source.n_entries,
                    "imported_at": now(),
                }
            )
            .last_pk
        )

    def write_staged(self, pending: StagedEntry) -> tuple[int, str]:
        """A staged entry's row (inside the staging's commit): its model recorded, then `write_entry_row`."""
        if pending.model is not None:
            self.insert_model(pending.model)
        return self.write_entry_row(pending.row)

    def write_entry_row(self, row: dict) -> tuple[int, str]:
        """Write `row` (an `entry_row`, inside a write transaction, after its blob's row): (entry id,
        PRESENT / REPAIRED / NEW), as the module docstring says."""
        same = self.find_same(row["tokens_sha256"], row["fingerprint"], row["kind"], row["question"], row["answer"])
        if same is not None and same.damaged is None and (same.proven or row["proof"] == UNPROVEN):
            return same.id, PRESENT  # already here (another process may have committed it meanwhile)
        if same is not None:  # a damaged or unproven twin: point it at the state just staged, then it is whole
            vouched = row["vouched_by"]
            self._db.execute(
                "UPDATE entries SET blob_sha256 = ?, blob_size = ?, proof = ?, receipt = ?, schedule = ?, "
                "damaged = NULL, vouched_by = coalesce(?, vouched_by), "
                "verified_at = CASE WHEN ? IS NULL THEN verified_at ELSE ? END WHERE id = ?",
                [
                    row["blob_sha256"],
                    row["blob_size"],
                    row["proof"],
                    row["receipt"],
                    row["schedule"],
                    vouched,
                    vouched,
                    now(),
                    same.id,
                ],
            )
            self._db.execute("UPDATE entries SET damaged = NULL WHERE blob_sha256 = ?", [row["blob_sha256"]])
            return same.id, REPAIRED
        t = now()
        entry_id = (
            self._db["entries"]
            .insert(
                {
                    **row,
                    "created_at": t,
                    "verified_at": t if row["answer"] is not None and row["vouched_by"] else None,
                    "damaged": None,
                }
            )
            .last_pk
        )
        insert_prefix_keys(self._db, entry_id, row["tokens"], row["n_tokens"])
        return entry_id, NEW
