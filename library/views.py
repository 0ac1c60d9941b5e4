"""Read models of the library: the typed rows that the app's table and the CLI show, and the few
facts about blobs and models that callers above the library need (no SQL leaves library/).

Mixed into `Library` (library/library.py); needs its `_db` and `search`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .records import GRAFTABLE, NOT_KNOWLEDGE, ModelRecord


@dataclass(frozen=True)
class TableRow:
    """One row of the library table: what an entry is, where it came from and how it is known."""

    id: int
    kind: str
    title: str
    tokens: int
    verified: bool  # an answer is stored and someone vouched for it
    source: str  # "local", or the pack's file name and how it was signed (app/packs/trust.source_words)
    graftable: bool  # this engine may graft it: its fingerprint, intact, proven
    damaged: str | None
    proof: str = "unproven"
    verified_by: str | None = None
    stated: bool = False  # an answer is stored, but nobody vouched for it
    pack_file: str | None = None  # the pack it came from, if any
    signer: str | None = None  # that pack's signer key id, if it was signed


_TABLE_SELECT = (
    "SELECT e.id, e.kind, coalesce(e.title, e.question, ''), e.n_tokens, "
    "e.answer IS NOT NULL AND e.vouched_by IS NOT NULL, "
    "CASE WHEN e.pack_id IS NULL THEN e.source ELSE coalesce(p.file_name, e.pack_id) || "
    "CASE WHEN p.signer IS NULL THEN ' (unsigned)' ELSE ' (signed ' || p.signer || ')' END END, "
    f"e.fingerprint = ? AND {GRAFTABLE}, e.damaged, e.proof, e.vouched_by, "
    "e.answer IS NOT NULL AND e.vouched_by IS NULL, coalesce(p.file_name, e.pack_id), p.signer "
    "FROM entries e LEFT JOIN packs p ON p.id = e.pack_id"
)


class LibraryReads:
    def table_rows(self, fingerprint: str | None, query: str | None = None, limit: int = 100_000) -> list[TableRow]:
        """Rows for the table (answer-ready states left out), in id order, or in search order for `query`."""
        fp = fingerprint or ""
        if query and query.strip():
            # at most 10,000 search hits: few enough for one IN (...) list on any SQLite build
            ids = [e.id for e in self.search(query, limit=min(limit, 10_000))]
            if not ids:
                return []
            order = {i: k for k, i in enumerate(ids)}
            marks = ",".join("?" * len(ids))
            rows = self._db.execute(_TABLE_SELECT + f" WHERE e.id IN ({marks})", [fp, *ids]).fetchall()
            rows.sort(key=lambda r: order[r[0]])
        else:
            rows = self._db.execute(
                _TABLE_SELECT + f" WHERE e.kind NOT IN {NOT_KNOWLEDGE} ORDER BY e.id LIMIT ?", [fp, limit]
            ).fetchall()
        return [
            TableRow(
                *(r[0], r[1], r[2], r[3], bool(r[4]), r[5], bool(r[6]), r[7], r[8] or "unproven", r[9], bool(r[10])),
                pack_file=None if r[11] is None else str(r[11]),
                signer=r[12],
            )
            for r in rows
        ]

    def blob_is_canonical(self, sha: str) -> bool | None:
        """True for a compacted (canonical) blob, False for one from before compaction, None if unknown."""
        row = self._db.execute("SELECT canonical FROM blobs WHERE sha256 = ?", [sha]).fetchone()
        return None if row is None else row[0] == 1

    def blob_aliases(self, sha: str) -> tuple[str, ...]:
        """The addresses this blob had before compaction (receipts made then still name them)."""
        rows = self._db.execute("SELECT legacy_sha256 FROM blob_aliases WHERE sha256 = ? ORDER BY 1", [sha])
        return tuple(r[0] for r in rows)

    def uncompacted_blobs(self) -> list[tuple[str, int]]:
        """(sha256, size) of every blob stored before compaction."""
        rows = self._db.execute("SELECT sha256, size FROM blobs WHERE canonical IS NOT 1 ORDER BY sha256")
        return [(r[0], r[1]) for r in rows]

    def blob_users(self, sha: str) -> list[tuple[int, str | None]]:
        """(entry id, model SHA-256) of every entry whose state is this blob."""
        return [tuple(r) for r in self._db.execute("SELECT id, model_sha256 FROM entries WHERE blob_sha256 = ?", [sha])]

    def model_record(self, sha: str) -> ModelRecord | None:
        for r in self._db.query("SELECT * FROM models WHERE sha256 = ?", [sha]):
            return ModelRecord(r["sha256"], r["name"], r["architecture"], r["size_bytes"])
        return None

    def index_bytes(self) -> int:
        """Size of the index file after a WAL checkpoint (what the index costs on disk)."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return (self.root / "index.db").stat().st_size
