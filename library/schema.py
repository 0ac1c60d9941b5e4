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
            "id": int,
            "sha256": str,
            "file_name": str,
            "format_version": int,
            "kvgraft_version": str,
            "signer": str,
            "n_entries": int,
            "imported_at": str,
        },
        pk="id",
    )
    db["packs"].create_index(["sha256"], unique=True)
    db["blobs"].create({"sha256": str, "size": int, "created_at": str}, pk="sha256")
    # raw SQL for AUTOINCREMENT: an entry id is never reused after a removal ("entry #12" stays one thing)
    db.execute(
        """
        CREATE TABLE entries (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,             -- solution / document / prefix
            title TEXT,
            question TEXT,
            question_key TEXT,              -- library.normalize.question_key(question)
            text TEXT NOT NULL,             -- exactly the text that was prefilled
            tokens BLOB NOT NULL,           -- int32 little-endian token ids
            n_tokens INTEGER NOT NULL,
            tokens_sha256 TEXT NOT NULL,
            answer TEXT,                    -- the verified answer, if any
            blob_sha256 TEXT NOT NULL REFERENCES blobs(sha256),
            blob_size INTEGER NOT NULL,
            fingerprint TEXT NOT NULL,      -- engine fingerprint the blob was made under
            model_sha256 TEXT,
            source TEXT NOT NULL,           -- "local" or "pack"
            pack_id INTEGER REFERENCES packs(id),
            created_at TEXT NOT NULL,
            verified_at TEXT,
            damaged TEXT                    -- null when fine, else why (blob missing, hash mismatch)
        )
        """
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
    db["prefix_keys"].create(
        {"key": bytes, "length": int, "entry_id": int, "full": int}, foreign_keys=[("entry_id", "entries", "id")]
    )
    db["prefix_keys"].create_index(["key", "full"])
    db["prefix_keys"].create_index(["entry_id"])
    for row in db.query("SELECT id, tokens, n_tokens FROM entries"):
        insert_prefix_keys(db, row["id"], row["tokens"], row["n_tokens"])


@migrations()
def m004_entry_receipts(db: Database) -> None:
    """Per-entry receipt (fresh and grafted logits SHA-256 of its probe) and the answer checker's name."""
    db["entries"].add_column("receipt", str)  # JSON: probe text, probe tokens sha256, fresh/graft logits sha256
    db["entries"].add_column("checker", str)


@migrations()
def m005_blob_chunks(db: Database) -> None:
    """SHA-256 of each 2 MiB chunk of a blob, for the parallel integrity check on the graft path.

    Blobs stored before this migration have none and are read with the full SHA-256 check;
    `kvgraft fsck --repair` adds them."""
    db["blobs"].add_column("chunks", bytes)


@migrations()
def m006_compaction(db: Database) -> None:
    """Compact blobs (library/container.py): a blob's address becomes the SHA-256 of its canonical
    bytes, and the file leaves out their zero runs.

    `stored_size`: bytes on disk (NULL for a plain pre-compaction file, whose size is `size`).
    `canonical`: 1 when the address is of canonical bytes; older rows are converted, with their
    entries re-pointed and the old address kept in `blob_aliases`, by `kvgraft fsck --repair`
    (app/maintain/recompaction.py), which needs the model's window and so cannot run inside SQL."""
    db["blobs"].add_column("stored_size", int)
    db["blobs"].add_column("canonical", int)
    db["blob_aliases"].create({"legacy_sha256": str, "sha256": str, "converted_at": str}, pk="legacy_sha256")
    db["blob_aliases"].create_index(["sha256"])


@migrations()
def m007_proof(db: Database) -> None:
    """Proof of origin and who vouched for an answer (docs/exact-graft.md, docs/pack-format.md).

    `proof`: how the state is known to be the state of its text: "local" (computed here),
    "replayed" (recomputed here, canonical SHA-256 reproduced), "signed:<key name>" (a pack signed
    by a trusted key, made under a compatible engine) or "unproven" (never grafted).
    `schedule`: the decode schedule the state was made with (JSON; NULL = one prefill of the text
    in chunks of n_batch from position 0), which a replay follows.
    `vouched_by`: who vouched for the answer ("checker:<name>", "generator:<name>", "signer:<key
    name>", "you"); NULL = the answer is stated, not verified. `verified_at` is kept only where
    someone vouched: answers stored before this migration were never checked, so they become stated.
    `fingerprint_relabels`: entries moved from an old-style fingerprint to the probe fingerprint
    (done when an engine whose old-style fingerprint matches opens the library).
    `engines`: what each fingerprint stands for (config and probe hashes, and the machine it was
    seen on), recorded when an engine opens the library; an export puts it in the pack."""
    db["entries"].add_column("proof", str)
    db["entries"].add_column("schedule", str)
    db["entries"].add_column("vouched_by", str)
    db.execute("UPDATE entries SET proof = CASE WHEN source = 'local' THEN 'local' ELSE 'unproven' END")
    db.execute("UPDATE entries SET verified_at = NULL")
    db["engines"].create({"fingerprint": str, "info": str, "environment": str, "seen_at": str}, pk="fingerprint")
    db["fingerprint_relabels"].create(
        {"legacy": str, "fingerprint": str, "entries": int, "relabelled_at": str}, pk="legacy"
    )


@migrations()
def m008_drop_receipts_table(db: Database) -> None:
    """m001 made a `receipts` table that nothing ever wrote: receipts live in each entry's `receipt`
    column (m004) and in the receipts files `kvgraft verify --receipts` writes."""
    if db["receipts"].exists():
        db["receipts"].drop()


@migrations()
def m009_threads(db: Database) -> None:
    """Conversations (app/answer/chat.py). A thread is a system prompt, a prompt format and turns; each turn
    keeps the transcript's tokens as the KV holds them after the reply, the `session` entry whose state
    is that transcript, and the decode schedule that made it (JSON, as entries.schedule: a replay of
    it in a new context must give the same logits before the reply: `logits_sha256`)."""
    db["threads"].create(
        {
            "id": int,
            "title": str,
            "system": str,
            "format": str,
            "fingerprint": str,
            "model_sha256": str,
            "from_entry_id": int,
            "forked_from": int,
            "fork_turn": int,
            "created_at": str,
        },
        pk="id",
    )
    db["turns"].create(
        {
            "thread_id": int,
            "n": int,
            "user": str,
            "reply": str,
            "tokens": bytes,
            "n_tokens": int,
            "entry_id": int,
            "schedule": str,
            "logits_sha256": str,
            "created_at": str,
        },
        pk=("thread_id", "n"),
        foreign_keys=[("thread_id", "threads", "id")],
    )
    db["turns"].create_index(["entry_id"])


@migrations()
def m010_sources(db: Database) -> None:
    """Files deposited as documents (app/ingest/documents.py). A source is a file's resolved path under one
    engine fingerprint, the SHA-256 of the bytes it was read from, and its title; its sections are
    entries (`source_sections`: section n of the file is entry_id, under that heading). A file that
    fits the context is one section holding its text verbatim. Re-depositing an unchanged file is a
    no-op; a changed file's sections are replaced in one transaction. `section_tokens`: the most
    tokens a section was allowed (a deposit with another budget splits the file again; NULL for a
    file stored verbatim). `owned`: the
    section's entry was made by this file's deposit (a changed file removes only entries it made:
    one it found already stored, from a pack or a `--text` deposit, stays)."""
    db["sources"].create(
        {
            "id": int,
            "path": str,
            "fingerprint": str,
            "file_sha256": str,
            "title": str,
            "n_sections": int,
            "section_tokens": int,
            "deposited_at": str,
        },
        pk="id",
    )
    db["sources"].create_index(["path", "fingerprint"], unique=True)
    db["source_sections"].create(
        {"source_id": int, "n": int, "entry_id": int, "heading": str, "owned": int},
        pk=("source_id", "n"),
        foreign_keys=[("source_id", "sources", "id")],
    )
    db["source_sections"].create_index(["entry_id"])


@migrations()
def m011_prompt_cache(db: Database) -> None:
    """The server's automatic states (kind `cache`, app/serve/): the schedule's block size they were
    decoded with (a state is reused only by a request decoded in the same blocks), and when each was
    last used (least recently used go first past the cache budget)."""
    db["cache_states"].create(
        {"entry_id": int, "block": int, "last_used": str, "hits": int},
        pk="entry_id",
        foreign_keys=[("entry_id", "entries", "id")],
    )
    db["cache_states"].create_index(["last_used"])


@migrations()
def m012_turn_stats(db: Database) -> None:
    """What each turn cost and did (the window's provenance line under a reply, and "Check this turn"): the
    reply tokens decoded into the KV (a replay of the state before the reply drops that many calls from
    the schedule's end), the tokens restored by graft and prefilled, the times, and the result of the
    last check that ran (1 exact, 0 differs, NULL: never checked). NULL for turns made before."""
    for col, typ in (
        ("decoded", int),
        ("restored", int),
        ("prefilled", int),
        ("resume_ms", float),
        ("prefill_ms", float),
        ("decode_ms", float),
        ("checked", int),
    ):
        db["turns"].add_column(col, typ)


@migrations()
def m013_remotes(db: Database) -> None:
    """The S3 remotes a library pushes to and pulls from (library/remotes.py): a name, the bucket, the key
    prefix ("" or ending in "/"), and the endpoint when it is not AWS. Credentials are never stored:
    boto3 reads them from its usual environment variables and files."""
    db["remotes"].create({"name": str, "bucket": str, "prefix": str, "endpoint_url": str, "added_at": str}, pk="name")


@migrations()
def m014_cache_pins(db: Database) -> None:
    """Named cache pins (library/cache_pins.py): a prefix kept by name, its tokens' SHA-256 and count, the
    engine fingerprint its state must have, the cache state that holds it once stored, its time to live
    and when it ends (epoch seconds)."""
    db["cache_pins"].create(
        {
            "name": str,
            "tokens_sha256": str,
            "n_tokens": int,
            "fingerprint": str,
            "entry_id": int,
            "ttl_s": float,
            "created_at": float,
            "expires_at": float,
        },
        pk="name",
    )
    db["cache_pins"].create_index(["tokens_sha256", "n_tokens"])
    db["cache_pins"].create_index(["entry_id"])


def insert_prefix_keys(db: Database, entry_id: int, tokens_blob: bytes, n_tokens: int) -> None:
    tokens = unpack_tokens(tokens_blob)
    keys = prefix_keys(tokens, entry_key_lengths(n_tokens))
    db.conn.executemany(
        "INSERT INTO prefix_keys (key, length, entry_id, full) VALUES (?, ?, ?, ?)",
        [(k, length, entry_id, int(length == n_tokens)) for length, k in keys.items()],
    )


MIGRATIONS = [
    "m001_core",
    "m002_fts",
    "m003_prefix_keys",
    "m004_entry_receipts",
    "m005_blob_chunks",
    "m006_compaction",
    "m007_proof",
    "m008_drop_receipts_table",
    "m009_threads",
    "m010_sources",
    "m011_prompt_cache",
    "m012_turn_stats",
    "m013_remotes",
    "m014_cache_pins",
    "m015_turn_endings",
    "m016_entry_checks",
]


@migrations()
def m015_turn_endings(db: Database) -> None:
    """How each turn's reply ended ("eog", "callback": stopped, "max_tokens", ...) and whether it was a
    Regenerate: the window marks a stopped or regenerated turn after a restart too (NULL for turns made
    before); and `counters`, so that a thread's number is not reused after a delete."""
    db["turns"].add_column("stop_reason", str)
    db["turns"].add_column("regenerated", int)
    # a thread's number is never given again after a delete: the highest ever given is kept here
    db.execute("CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    db.execute("INSERT INTO counters (name, value) SELECT 'threads', coalesce(max(id), 0) FROM threads")


@migrations()
def m016_entry_checks(db: Database) -> None:
    """When `kvgraft verify` (the window's Verify selected too) last checked an entry here and whether every
    check passed: `checked_at`, `check_ok` (NULL: never checked). Not `verified_at`, which says when
    someone vouched for the answer."""
    db["entries"].add_column("checked_at", str)
    db["entries"].add_column("check_ok", int)
