"""Migrations: a blank database and a database stopped before each migration, with data, both reach
the latest schema."""

from __future__ import annotations

import datetime
import sqlite3

import pytest
from sqlite_utils import Database

from kvgraft.library.library import Library
from kvgraft.library.schema import MIGRATIONS, insert_prefix_keys, migrations
from kvgraft.library.tokens import pack_tokens, tokens_sha256

TOKENS = list(range(1, 200))


def test_migration_list_is_complete():
    assert [m.name for m in migrations.pending(Database(memory=True))] == MIGRATIONS


def test_blank_database(tmp_path):
    with Library(tmp_path) as lib:
        applied = [m.name for m in migrations.applied(lib._db)]
        assert applied == MIGRATIONS
        assert {
            "entries",
            "blobs",
            "models",
            "packs",
            "pending_blobs",
            "prefix_keys",
            "entries_fts",
        } <= set(lib._db.table_names())
        assert "receipts" not in lib._db.table_names()  # m008: a table nothing wrote
        assert lib._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with Library(tmp_path) as lib:  # reopening applies nothing twice
        assert [m.name for m in migrations.applied(lib._db)] == MIGRATIONS


@pytest.mark.parametrize("stop_before", MIGRATIONS[1:])
def test_older_schema_with_data(tmp_path, stop_before):
    db = Database(sqlite3.connect(str(tmp_path / "index.db")))
    migrations.apply(db, stop_before=stop_before)
    blob = b"x" * 64
    import hashlib

    sha = hashlib.sha256(blob).hexdigest()
    (tmp_path / "blobs" / sha[:2]).mkdir(parents=True)
    (tmp_path / "blobs" / sha[:2] / sha).write_bytes(blob)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    db["blobs"].insert({"sha256": sha, "size": len(blob), "created_at": now})
    db["entries"].insert(
        {
            "kind": "document",
            "title": "old river entry",
            "question": None,
            "question_key": None,
            "text": "an old river entry",
            "tokens": pack_tokens(TOKENS),
            "n_tokens": len(TOKENS),
            "tokens_sha256": tokens_sha256(TOKENS),
            "answer": None,
            "blob_sha256": sha,
            "blob_size": len(blob),
            "fingerprint": "f" * 64,
            "model_sha256": None,
            "source": "local",
            "pack_id": None,
            "created_at": now,
            "verified_at": None,
            "damaged": None,
        }
    )
    if MIGRATIONS.index(stop_before) > MIGRATIONS.index("m007_proof"):  # that version's deposits record a proof
        db.execute("UPDATE entries SET proof = 'local' WHERE id = 1")
    if MIGRATIONS.index(stop_before) > MIGRATIONS.index("m003_prefix_keys"):
        insert_prefix_keys(db, 1, pack_tokens(TOKENS), len(TOKENS))  # what that version's deposit wrote
    db.conn.commit()
    db.close()
    with Library(tmp_path) as lib:
        assert [m.name for m in migrations.applied(lib._db)] == MIGRATIONS
        assert lib.count() == 1
        assert lib.longest_prefix(TOKENS + [7, 7], "f" * 64).id == 1
        assert [e.id for e in lib.search("river")] == [1]
        from kvgraft.library.maintenance import fsck

        assert fsck(lib)["ok"]
