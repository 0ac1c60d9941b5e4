"""Files deposited as documents (migration m010). `Library.sources`.

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

from .entry_writes import NEW, StagedEntry
from .errors import LibraryError
from .index import Store
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
    section_tokens: int | None  # the most tokens a section was allowed; None: the file is stored verbatim
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


class SourceChanged(LibraryError):
    """An entry a deposit meant to reuse was removed meanwhile (by another process): nothing was
    written; depositing the file again computes what is missing."""


@dataclass
class _Section:
    heading: str | None
    title: str | None
    found: Entry | None  # an entry already stored, reused
    pending: StagedEntry | None  # what `Library.stage_entry` staged: written by the commit


class SourceUpdate:
    """The new sections of one file, staged; `commit` swaps them in. Made by `Library.sources.source_update`."""

    def __init__(self, store: "SourceStore", staging: BlobStaging, path: str, fingerprint: str) -> None:
        self.lib, self._db = store.lib, store._db
        self.staging, self.path, self.fingerprint = staging, path, fingerprint
        self._sections: list[_Section] = []

    def stored(self, tokens, kind: str = "document") -> Entry | None:
        """The intact, proven entry already holding these tokens, if any (its state need not be computed)."""
        e = self.lib.find_same(tokens_sha256(tokens), self.fingerprint, kind, None, None)
        return e if e is not None and e.damaged is None and e.proven else None

    def add(self, heading: str | None, existing: Entry | None = None, title: str | None = None, **entry) -> bool:
        """The next section: an entry already stored (given a `title`, it takes that title if this file
        made it), or a new one (`Library.stage_entry`'s keywords). True when a new state was staged."""
        if existing is not None:
            self._sections.append(_Section(heading, title, existing, None))
            return False
        found, pending = self.lib.stage_entry(self.staging, fingerprint=self.fingerprint, title=title, **entry)
        self._sections.append(_Section(heading, title, found, pending))
        return pending is not None

    def commit(self, file_sha256: str, title: str, section_tokens: int | None) -> tuple[list[Entry], list[int]]:
        """One transaction: the new entries, the source's sections replaced, and the old sections'
        entries that this file made and nothing else holds removed. Returns (the sections' entries,
        removed entry ids). SourceChanged, with nothing written, if a reused entry went meanwhile."""
        if not self._sections:
            raise LibraryError(f"{self.path}: a deposited file needs at least one section")
        lib, db = self.lib, self._db
        with self.staging.commit():
            row = db.execute(
                "SELECT id FROM sources WHERE path = ? AND fingerprint = ?", [self.path, self.fingerprint]
            ).fetchone()
            sid = row[0] if row else None
            old = {
                i: o for i, o in db.execute("SELECT entry_id, owned FROM source_sections WHERE source_id = ?", [sid])
            }
            reused = {sec.found.id for sec in self._sections if sec.found is not None}
            if reused:
                marks = ",".join("?" * len(reused))
                here = db.execute(f"SELECT count(*) FROM entries WHERE id IN ({marks})", sorted(reused)).fetchone()[0]
                if here != len(reused):
                    raise SourceChanged(f"{self.path}: a stored section was removed meanwhile; deposit it again")
            ids, owned = [], []
            for sec in self._sections:
                if sec.found is not None:
                    i = sec.found.id
                    mine = bool(old.get(i))
                    if mine and sec.title and sec.found.title != sec.title:
                        db.execute("UPDATE entries SET title = ? WHERE id = ?", [sec.title, i])
                else:
                    i, did = lib.write_staged(sec.pending)
                    mine = did == NEW or bool(old.get(i))
                ids.append(i)
                owned.append(int(mine))
            if sid is None:
                sid = (
                    db["sources"]
                    .insert(
                        {
                            "path": self.path,
                            "fingerprint": self.fingerprint,
                            "file_sha256": file_sha256,
                            "title": title,
                            "n_sections": len(ids),
                            "section_tokens": section_tokens,
                            "deposited_at": now(),
                        }
                    )
                    .last_pk
                )
            else:
                db.execute("DELETE FROM source_sections WHERE source_id = ?", [sid])
                db.execute(
                    "UPDATE sources SET file_sha256 = ?, title = ?, n_sections = ?, section_tokens = ?, "
                    "deposited_at = ? WHERE id = ?",
                    [file_sha256, title, len(ids), section_tokens, now(), sid],
                )
            db.conn.executemany(
                "INSERT INTO source_sections (source_id, n, entry_id, heading, owned) VALUES (?, ?, ?, ?, ?)",
                [
                    (sid, n, i, sec.heading, o)
                    for n, (i, o, sec) in enumerate(zip(ids, owned, self._sections, strict=True), 1)
                ],
            )
            removed = []
            for i in sorted(i for i, o in old.items() if o and i not in set(ids)):
                if not _held_elsewhere(db, i):
                    db.execute("DELETE FROM prefix_keys WHERE entry_id = ?", [i])
                    db.execute("DELETE FROM entries WHERE id = ?", [i])
                    removed.append(i)
            entries = _entries(db, ids)
        return entries, removed  # the old blobs stay until `gc` finds them unreferenced


def _held_elsewhere(db, entry_id: int) -> bool:
    """Another file's section, or a conversation that starts from it, still needs the entry."""
    if db.execute("SELECT 1 FROM source_sections WHERE entry_id = ? LIMIT 1", [entry_id]).fetchone():
        return True
    if db.execute("SELECT 1 FROM entries WHERE id = ? AND kind <> 'document'", [entry_id]).fetchone():
        return True
    return db.execute("SELECT 1 FROM threads WHERE from_entry_id = ? LIMIT 1", [entry_id]).fetchone() is not None


def _entries(db, ids: list[int]) -> list[Entry]:
    by_id = {}
    for k in range(0, len(ids), 500):
        part = ids[k : k + 500]
        for row in db.query(f"SELECT * FROM entries WHERE id IN ({','.join('?' * len(part))})", part):
            by_id[row["id"]] = Entry.from_row(row)
    return [by_id[i] for i in ids]


class SourceStore(Store):
    """Deposited files and their sections."""

    def source(self, path: str, fingerprint: str) -> Source | None:
        for row in self._db.query("SELECT * FROM sources WHERE path = ? AND fingerprint = ?", [path, fingerprint]):
            return Source(**row)
        return None

    def list(self) -> list[Source]:
        return [Source(**row) for row in self._db.query("SELECT * FROM sources ORDER BY id")]

    def source_sections(self, source_id: int) -> list[tuple[int, str | None, Entry]]:
        """(n, heading, entry) for each section of a source that is still in the library, in order (one query)."""
        rows = self._db.query(
            "SELECT s.n AS section_n, s.heading AS section_heading, e.* FROM source_sections s "
            "JOIN entries e ON e.id = s.entry_id WHERE s.source_id = ? ORDER BY s.n",
            [source_id],
        )
        return [(r.pop("section_n"), r.pop("section_heading"), Entry.from_row(r)) for r in rows]

    def unchanged_source(
        self, path: str, fingerprint: str, file_sha256: str, section_tokens: int, fit: int
    ) -> tuple[Source, list[Entry]] | None:
        """(the source, its sections' entries) when this file was deposited from the very same bytes
        with the same section budget, and every section is still here, intact, proven and at most `fit`
        tokens (a re-deposit is then a no-op); else None."""
        with self.index.snapshot():  # a concurrent replace is seen whole or not at all
            src = self.source(path, fingerprint)
            if src is None or src.file_sha256 != file_sha256:
                return None
            if src.section_tokens is not None and src.section_tokens != section_tokens:  # None: stored verbatim
                return None
            sections = self.source_sections(src.id)
        entries = [e for _n, _h, e in sections]
        if len(entries) != src.n_sections or not all(e.graftable(fingerprint) and e.n_tokens <= fit for e in entries):
            return None
        return src, entries

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
        with staged(self.lib) as staging:
            yield SourceUpdate(self, staging, path, fingerprint)

    def forget_source(self, path: str) -> list[int] | None:
        """Forget a deposited file (under every fingerprint): its sections, and the entries its deposits
        made that nothing else holds (returned; None when no file was deposited at `path`)."""
        with self.write() as db:
            sids = [r[0] for r in db.execute("SELECT id FROM sources WHERE path = ?", [path])]
            if not sids:
                return None
            marks = ",".join("?" * len(sids))
            owned = sorted(
                {
                    r[0]
                    for r in db.execute(
                        f"SELECT entry_id FROM source_sections WHERE source_id IN ({marks}) AND owned = 1", sids
                    )
                }
            )
            db.execute(f"DELETE FROM source_sections WHERE source_id IN ({marks})", sids)
            db.execute(f"DELETE FROM sources WHERE id IN ({marks})", sids)
            removed = []
            for i in owned:
                if not _held_elsewhere(db, i):
                    db.execute("DELETE FROM prefix_keys WHERE entry_id = ?", [i])
                    db.execute("DELETE FROM entries WHERE id = ?", [i])
                    removed.append(i)
        return removed

    def forget_sections_of(self, entry_id: int) -> None:
        """An entry is removed by hand: the files holding it are rebuilt on their next deposit."""
        self._db.execute(
            "UPDATE sources SET file_sha256 = NULL "
            "WHERE id IN (SELECT source_id FROM source_sections WHERE entry_id = ?)",
            [entry_id],
        )
        self._db.execute("DELETE FROM source_sections WHERE entry_id = ?", [entry_id])
