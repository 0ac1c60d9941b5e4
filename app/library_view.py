"""Read-only views of the library for the desktop app's GUI thread (fast, column-light queries).

The rows are library/views.py's typed read models; this module only owns the GUI thread's own
connection (the worker thread has its own for writes).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvgraft.library.library import Library
from kvgraft.library.signing import TrustStore
from kvgraft.library.views import TableRow

from .packs import trust_store
from .paths import data_dir

Row = TableRow  # the table's row type (library/views.py)


def signer_words(signer: str | None, trust: TrustStore) -> str:
    """How a pack was signed, naming a key you trust (the CLI's `show` and the app's table say the same)."""
    if not signer:
        return "unsigned"
    name = trust.name_of(signer)
    return f"signed by {signer}" + (f" ({name})" if name else " (not in your trusted keys)")


def source_words(row: TableRow, trust: TrustStore) -> str:
    """The table's source column: "local", or the pack and how it was signed."""
    if row.pack_file is None:
        return row.source
    if not row.signer:
        return f"{row.pack_file} (unsigned)"
    name = trust.name_of(row.signer)
    return f"{row.pack_file} (signed {name})" if name else f"{row.pack_file} (signed, key not trusted here)"


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
