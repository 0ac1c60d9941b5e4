"""Files deposited as documents (migration m010). Mixed into `Library`.

A source is a file's resolved path under one engine fingerprint, the SHA-256 of the bytes it was read
from, and its sections: entries, in order, each under its heading. A file that fits the context is
one section holding its text verbatim. The sections of a changed file are staged (their blobs written
as pending, library/staging.py) and then replace the old ones in one write transaction, so a reader
sees the old sections or the new ones, never a mix, and a kill or a cancel leaves the old ones whole.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import LibraryError
from .provenance import now
from .records import Entry
from .staging import BlobStaging, staged
from .tokens import tokens_sha256


@dataclass(frozen=True)
class Source:
    id: int
    path: str
    fingerprint: str
    file_sha256: str | None  # None once one of its sections was removed: the next deposit rebuilds it
    title: str
    n_sections: int
    deposited_at: str

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True)
class SectionRef:
    """Where an entry sits in a deposited file: section `n` of `of`, under `heading`."""

    path: str
    n: int
    of: int
    heading: str | None

    def words(self) -> str:
        """ "doc.md" for a file in one section, "doc.md, section 3 of 12" otherwise."""
        name = Path(self.path).name
        return name if self.of == 1 else f"{name}, section {self.n} of {self.of}"

    def as_dict(self) -> dict:
        return {"file": self.path, "section": self.n, "sections": self.of, "heading": self.heading}


class SourceUpdate:
    """The new sections of one file, staged; `commit` swaps them in. Made by `Library.source_update`."""

    def __init__(self, lib, staging: BlobStaging, path: str, fingerprint: str) -> None:
        self.lib, self.staging, self.path, self.fingerprint = lib, staging, path, fingerprint
        self._sections: list[tuple[str | None, Entry | None, tuple | None]] = []

    def stored(self, tokens, kind: str = "document") -> Entry | None:
        """The intact, proven entry already holding these tokens, if any (its state need not be computed)."""
        e = self.lib.find_same(tokens_sha256(tokens), self.fingerprint, kind, None, None)
        return e if e is not None and e.damaged is None and e.proven else None

    def add(self, heading: str | None, existing: Entry | None = None, **entry) -> None:
        """The next section: an entry already stored, or a new one (`Library.stage_entry`'s keywords)."""
        if existing is not None:
            self._sections.append((heading, existing, None))
            return
        found, pending = self.lib.stage_entry(self.staging, fingerprint=self.fingerprint, **entry)
        self._sections.append((heading, found, pending))

    def commit(self, file_sha256: str, title: str) -> tuple[list[Entry], list[int]]:
        """One transaction: the new entries, the source's sections replaced, and the old sections'
        entries that no other file holds removed. Returns (the sections' entries, removed entry ids)."""
        if not self._sections:
            raise LibraryError(f"{self.path}: a deposited file needs at least one section")
        lib, db = self.lib, self.lib._db
        with self.staging.commit():
            ids = []
            for _heading, found, pending in self._sections:
                if found is not None:
                    ids.append(found.id)
                    continue
                same, stored, row, model = pending
                if model is not None:
                    lib._insert_model(model)
                ids.append(lib._write_entry_row(same, stored, row))
            row = db.execute(
                "SELECT id FROM sources WHERE path = ? AND fingerprint = ?", [self.path, self.fingerprint]
            ).fetchone()
            old: set[int] = set()
            if row is None:
                sid = (
                    db["sources"]
                    .insert(
                        {
                            "path": self.path,
                            "fingerprint": self.fingerprint,
                            "file_sha256": file_sha256,
                            "title": title,
                            "n_sections": len(ids),
                            "deposited_at": now(),
                        }
                    )
                    .last_pk
                )
            else:
                sid = row[0]
                old = {r[0] for r in db.execute("SELECT entry_id FROM source_sections WHERE source_id = ?", [sid])}
                db.execute("DELETE FROM source_sections WHERE source_id = ?", [sid])
                db.execute(
                    "UPDATE sources SET file_sha256 = ?, title = ?, n_sections = ?, deposited_at = ? WHERE id = ?",
                    [file_sha256, title, len(ids), now(), sid],
                )
            db.conn.executemany(
                "INSERT INTO source_sections (source_id, n, entry_id, heading) VALUES (?, ?, ?, ?)",
                [(sid, n, i, h) for n, (i, (h, _f, _p)) in enumerate(zip(ids, self._sections), start=1)],
            )
            removed = []
            for i in sorted(old - set(ids)):
                held = db.execute("SELECT 1 FROM source_sections WHERE entry_id = ? LIMIT 1", [i]).fetchone()
                if held is None:
                    db.execute("DELETE FROM prefix_keys WHERE entry_id = ?", [i])
                    db.execute("DELETE FROM entries WHERE id = ? AND kind = 'document'", [i])
                    removed.append(i)
        return [lib.get(i) for i in ids], removed  # the old blobs stay until `gc` finds them unreferenced


class SourceRecords:
    """Deposited files on a `Library` (needs its `_db`, `write`, `get`, `find_same`, `stage_entry`)."""

    def source(self, path: str, fingerprint: str) -> Source | None:
        for row in self._db.query("SELECT * FROM sources WHERE path = ? AND fingerprint = ?", [path, fingerprint]):
            return Source(**row)
        return None

    def sources(self) -> list[Source]:
        return [Source(**row) for row in self._db.query("SELECT * FROM sources ORDER BY id")]

    def source_sections(self, source_id: int) -> list[tuple[int, str | None, Entry]]:
        """(n, heading, entry) for each section of a source that is still in the library, in order."""
        rows = self._db.execute(
            "SELECT s.n, s.heading, s.entry_id FROM source_sections s JOIN entries e ON e.id = s.entry_id "
            "WHERE s.source_id = ? ORDER BY s.n",
            [source_id],
        ).fetchall()
        return [(n, heading, self.get(i)) for n, heading, i in rows]

    def unchanged_source(self, path: str, fingerprint: str, file_sha256: str) -> list[Entry] | None:
        """The sections' entries when this file was deposited from the very same bytes and every section
        is still here, intact and proven (a re-deposit is then a no-op); else None."""
        src = self.source(path, fingerprint)
        if src is None or src.file_sha256 != file_sha256:
            return None
        sections = self.source_sections(src.id)
        if len(sections) != src.n_sections or not all(e.graftable(fingerprint) for _n, _h, e in sections):
            return None
        return [e for _n, _h, e in sections]

    def section_of(self, entry_id: int) -> SectionRef | None:
        """Where the entry sits in a deposited file (the newest such file, if several hold it)."""
        row = self._db.execute(
            "SELECT src.path, s.n, src.n_sections, s.heading FROM source_sections s "
            "JOIN sources src ON src.id = s.source_id WHERE s.entry_id = ? ORDER BY src.deposited_at DESC LIMIT 1",
            [entry_id],
        ).fetchone()
        return SectionRef(*row) if row else None

    @contextmanager
    def source_update(self, path: str, fingerprint: str) -> Iterator[SourceUpdate]:
        """Stage the sections of `path`, then `commit`; a failure before the commit changes nothing."""
        with staged(self) as staging:
            yield SourceUpdate(self, staging, path, fingerprint)

    def _forget_sections(self, entry_id: int) -> None:
        """An entry is removed by hand: the files holding it are rebuilt on their next deposit."""
        self._db.execute(
            "UPDATE sources SET file_sha256 = NULL "
            "WHERE id IN (SELECT source_id FROM source_sections WHERE entry_id = ?)",
            [entry_id],
        )
        self._db.execute("DELETE FROM source_sections WHERE entry_id = ?", [entry_id])
