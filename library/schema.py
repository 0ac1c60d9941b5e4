"""The index schema, as sqlite-utils migrations. Change it only by adding a migration at the end.

tests/test_library_schema.py migrates a blank database and a database stopped before each
migration, with data in it.
"""

from __future__ import annotations

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from .tokens import entry_key_lengths, prefix_keys, unpack_tokens

migrations = Migrations("kvgraft")


@migrations()
def m001_core(db: Database) -> None:
    db["models"].create(
        {"sha256": str, "name": str, "architecture": str, "size_bytes": int, "added_at": str},
        pk="sha256",
    )
    db["packs"].create(
        {
            "id": int, "sha256": str, "file_name": str, "format_version": int, "kvgraft_version": str,
            "signer": str, "n_entries": int, "imported_at": str,
        },
        pk="id",
    )
    db["packs"].create_index(["sha256"], unique=True)
    db["blobs"].create({"sha256": str, "size": int, "created_at": str}, pk="sha256")
    db["entries"].create(
        {
            "id": int,
            "kind": str,  # solution / document / prefix
            "title": str,
            "question": str,
            "question_key": str,  # normalized question (library.normalize.question_key)
            "text": str,  # exactly the text that was prefilled
            "tokens": bytes,  # int32 little-endian token ids
            "n_tokens": int,
            "tokens_sha256": str,
            "answer": str,  # the verified answer, if any
            "blob_sha256": str,
            "blob_size": int,
            "fingerprint": str,  # engine fingerprint the blob was made under
            "model_sha256": str,
            "source": str,  # "local" or "pack"
            "pack_id": int,
            "created_at": str,
            "verified_at": str,
            "damaged": str,  # null when fine, else why (missing blob, hash mismatch)
        },
        pk="id",
        not_null={"kind", "text", "tokens", "n_tokens", "tokens_sha256", "blob_sha256", "blob_size", "fingerprint", "created_at"},
        foreign_keys=[("blob_sha256", "blobs", "sha256"), ("pack_id", "packs", "id")],
    )
    db["entries"].create_index(["question_key"])
    db["entries"].create_index(["blob_sha256"])
    db["entries"].create_index(["tokens_sha256", "fingerprint"])
    db["receipts"].create(
        {"id": int, "kind": str, "created_at": str, "sha256": str, "fingerprint": str, "ok": int, "body": str},
        pk="id",
    )
    # A blob being written by a live process: gc never removes a blob named here (see library/maintenance.py).
    db["pending_blobs"].create({"id": int, "sha256": str, "pid": int, "host": str, "created_at": str}, pk="id")
    db["pending_blobs"].create_index(["sha256"])


@migrations()
def m002_fts(db: Database) -> None:
    db["entries"].enable_fts(["title", "question", "text"], create_triggers=True, tokenize="porter")


@migrations()
def m003_prefix_keys(db: Database) -> None:
    db["prefix_keys"].create({"key": bytes, "length": int, "entry_id": int, "full": int},
                             foreign_keys=[("entry_id", "entries", "id")])
    db["prefix_keys"].create_index(["key"])
    db["prefix_keys"].create_index(["entry_id"])
    for row in db.query("SELECT id, tokens, n_tokens FROM entries"):
        insert_prefix_keys(db, row["id"], row["tokens"], row["n_tokens"])


def insert_prefix_keys(db: Database, entry_id: int, tokens_blob: bytes, n_tokens: int) -> None:
    tokens = unpack_tokens(tokens_blob)
    keys = prefix_keys(tokens, entry_key_lengths(n_tokens))
    db.conn.executemany(
        "INSERT INTO prefix_keys (key, length, entry_id, full) VALUES (?, ?, ?, ?)",
        [(k, length, entry_id, int(length == n_tokens)) for length, k in keys.items()],
    )


MIGRATIONS = ["m001_core", "m002_fts", "m003_prefix_keys"]
