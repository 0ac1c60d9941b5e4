"""The SQLite index (`<data dir>/index.db`): its one connection, shared by the library's stores.

Concurrency: the GUI and the CLI may open the same library at once. The index runs in WAL mode with a
60 s busy timeout, and every write is one `BEGIN IMMEDIATE` transaction, so writers queue instead of
failing with "database is locked". The stores (library/library.py names them) each own their tables'
SQL and reach the connection only through the `Index` they are given; nothing outside library/ does.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlite_utils import Database

from .schema import migrations

BUSY_TIMEOUT_S = 60.0


class Index:
    def __init__(self, path: Path) -> None:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        self.db = Database(conn)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA foreign_keys=ON")
        if migrations.pending(self.db):  # read-only opens never take the write lock
            with self.write():
                migrations.apply(self.db)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def write(self) -> Iterator[Database]:
        """One write transaction, taken with BEGIN IMMEDIATE (waits for other writers); nested: a savepoint."""
        if self.db.conn.in_transaction:
            with self.db.atomic():
                yield self.db
            return
        self.db.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            if self.db.conn.in_transaction:  # SQLite may have rolled back already (disk full, I/O error)
                self.db.conn.execute("ROLLBACK")
            raise
        else:
            self.db.conn.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that see one state of the index (a concurrent write is seen whole or not at all)."""
        conn = self.db.conn
        if conn.in_transaction:
            yield
            return
        conn.execute("BEGIN")  # deferred: the first read fixes the snapshot, no write lock is taken
        try:
            yield
        finally:
            conn.execute("COMMIT")


class Store:
    """A focused store over some of the index's tables: `_db` and `write` are the index's; `lib` is the
    library facade, for what other stores own (through their public methods)."""

    def __init__(self, index: Index, lib) -> None:
        self.index, self.lib = index, lib
        self._db = index.db
        self.write = index.write
