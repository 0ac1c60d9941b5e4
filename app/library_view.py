"""Read-only views of the library for the desktop app's GUI thread (fast, column-light queries)."""

from __future__ import annotations

from dataclasses import dataclass

from kvgraft.library.index import GRAFTABLE, Library

from .paths import data_dir


@dataclass(frozen=True)
class Row:
    id: int
    kind: str
    title: str
    tokens: int
    verified: bool
    source: str
    graftable: bool
    damaged: str | None
    proof: str = "unproven"
    verified_by: str | None = None
    stated: bool = False  # an answer is stored, but nobody vouched for it


class LibraryView:
    """One connection for the GUI thread's reads (the worker thread has its own for writes)."""

    def __init__(self, root=None) -> None:
        self.library = Library(root or data_dir())

    def close(self) -> None:
        self.library.close()

    def rows(self, fingerprint: str | None, query: str | None = None, limit: int = 100_000) -> list[Row]:
        fp = fingerprint or ""
        base = (
            "SELECT e.id, e.kind, coalesce(e.title, e.question, ''), e.n_tokens, "
            "e.answer IS NOT NULL AND e.vouched_by IS NOT NULL, "
            "CASE WHEN e.pack_id IS NULL THEN e.source ELSE coalesce(p.file_name, e.pack_id) || "
            "CASE WHEN p.signer IS NULL THEN ' (unsigned)' ELSE ' (signed ' || p.signer || ')' END END, "
            f"e.fingerprint = ? AND {GRAFTABLE}, e.damaged, e.proof, e.vouched_by, "
            "e.answer IS NOT NULL AND e.vouched_by IS NULL FROM entries e LEFT JOIN packs p ON p.id = e.pack_id"
        )
        if query and query.strip():
            # at most 10,000 search hits: few enough for one IN (...) list on any SQLite build
            ids = [e.id for e in self.library.search(query, limit=min(limit, 10_000))]
            if not ids:
                return []
            order = {i: k for k, i in enumerate(ids)}
            rows = self.library.db.execute(base + f" WHERE e.id IN ({','.join('?' * len(ids))})", [fp, *ids]).fetchall()
            rows.sort(key=lambda r: order[r[0]])
        else:
            rows = self.library.db.execute(
                base + " WHERE e.kind <> 'answer' ORDER BY e.id LIMIT ?", [fp, limit]
            ).fetchall()
        return [
            Row(r[0], r[1], r[2], r[3], bool(r[4]), r[5], bool(r[6]), r[7], r[8] or "unproven", r[9], bool(r[10]))
            for r in rows
        ]

    def stats(self, n_ctx: int) -> dict:
        return self.library.stats(n_ctx=n_ctx)
