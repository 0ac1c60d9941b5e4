"""Read-only views of the library for the desktop app's GUI thread (fast, column-light queries).

The rows are library/views.py's typed read models; this module only owns the GUI thread's own
connection (the worker thread has its own for writes).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvgraft.app.core.paths import data_dir
from kvgraft.app.packs.trust import source_words, trust_store
from kvgraft.library.library import Library
from kvgraft.library.views import TableRow

Row = TableRow  # the table's row type (library/views.py)


class LibraryView:
    """One connection for the GUI thread's reads."""

    def __init__(self, root: Path | None = None) -> None:
        self.library = Library(data_dir(root))
        self.trust = trust_store(self.library.root)

    def close(self) -> None:
        self.library.close()

    def rows(self, fingerprint: str | None, query: str | None = None, limit: int = 100_000) -> list[TableRow]:
        rows = self.library.table_rows(fingerprint, query, limit)
        if any(r.signer for r in rows):
            rows = [dataclasses.replace(r, source=source_words(r, self.trust)) if r.signer else r for r in rows]
        return rows

    def stats(self, n_ctx: int) -> dict:
        return self.library.stats(n_ctx=n_ctx)

    def to_migrate(self, predecessors: list[str], model_sha256: str) -> int:
        """Entries of this model under the engine's earlier fingerprints (kvgraft migrate moves them)."""
        return self.library.count_under(predecessors, model_sha256)

    def remotes(self) -> list[dict]:
        """The remotes this library knows (app/remote/manage.py's shape)."""
        from kvgraft.app.remote.manage import remotes

        return remotes(self.library)
