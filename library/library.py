"""The library: a SQLite index (`<data dir>/index.db`, library/index.py) over a content-addressed blob store.

Deposit protocol (what makes kills and concurrent gc safe; see library/maintenance.py):
  1. record the blob as pending (committed, names this pid),
  2. write the blob (temp file, fsync, rename, fsync dir),
  3. one transaction: blob row, entry row, prefix keys, FTS (by trigger), pending row removed.
A kill before 3 commits leaves only a reclaimable temp file or orphan blob, never a half entry.
Entry rows are written in one place, library/entry_writes.py (a deposit, a file's sections, a pack
import and a rebuild all go through it).
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
from pathlib import Path
from typing import Sequence

from .blobstore import BlobStore, StoredBlob, check_sha
from .entry_writes import EntryWrites
from .errors import BlobCorrupt, BlobMissing, EntryNotFound, LibraryError
from .index import Index
from .normalize import question_key
from .prompt_cache import CacheStore
from .provenance import ProvenanceRecords, now
from .records import GRAFTABLE, NOT_KNOWLEDGE, UNPROVEN, Entry, ModelRecord
from .remotes import RemoteStore
from .retrieval import Retrieval
from .sources import SourceStore
from .staging import staged
from .threads import ThreadStore
from .tokens import PREFIX_BLOCK, prefix_keys
from .views import LibraryReads

log = logging.getLogger(__name__)


def _fts_query(text: str, any_term: bool) -> str | None:
    terms = [t for t in "".join(c if c.isalnum() else " " for c in text).split() if t]
    if not terms:
        return None
    return (" OR " if any_term else " ").join('"' + t.replace('"', '""') + '"' for t in terms)


class Library(EntryWrites, ProvenanceRecords, LibraryReads, Retrieval):
    """The facade: the entries (its own methods: writes, reads, search, provenance) and the focused
    stores, each owning its tables' SQL over the one `Index`:

    - `blobs`: the content-addressed blob files (library/blobstore.py, an ObjectStore);
    - `threads`: conversations and their turns (library/threads.py);
    - `cache`: the server's prompt cache states and named pins (library/prompt_cache.py, cache_pins.py);
    - `sources`: deposited files and their sections (library/sources.py);
    - `remotes`: the S3 remotes this library knows (library/remotes.py).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.blobs = BlobStore(self.root / "blobs")
        self.index = Index(self.root / "index.db")
        self._db = self.index.db  # the entries' own tables
        self.threads = ThreadStore(self.index, self)
        self.cache = CacheStore(self.index, self)
        self.sources = SourceStore(self.index, self)
        self.remotes = RemoteStore(self.index, self)

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> "Library":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self):
        """One write transaction (library/index.py)."""
        return self.index.write()

    # -- writing -------------------------------------------------------------------------------
    def find_same(
        self, tokens_sha: str, fingerprint: str, kind: str, question: str | None, answer: str | None
    ) -> Entry | None:
        qk = question_key(question) if question else None
        for row in self._db.query(
            "SELECT * FROM entries WHERE tokens_sha256 = ? AND fingerprint = ? AND kind = ? "
            "AND question_key IS ? AND answer IS ? ORDER BY id LIMIT 1",
            [tokens_sha, fingerprint, kind, qk, answer],
        ):
            return Entry.from_row(row)
        return None

    def replace_blob(self, old: str, data, new: str, elide=None) -> StoredBlob:
        """Store `data` (address `new`, the canonical form of blob `old`) and point every entry of
        `old` at it in one transaction, keeping `old` as an alias; then delete the old file."""
        with staged(self) as staging:
            stored = staging.put(data, new, elide=elide, replaces=old)
            with staging.commit() as db:
                if new != old:
                    db.execute("UPDATE entries SET blob_sha256 = ? WHERE blob_sha256 = ?", [new, old])
                    db.execute("DELETE FROM blobs WHERE sha256 = ?", [old])
        if new != old:
            self.blobs.delete(old)
        return stored

    def consume_pending(self, ids: Sequence[int]) -> None:
        """Inside the commit: remove our pending records, and refuse to commit if gc took any of them
        (it then may have removed the blob: the caller retries)."""
        gone = 0
        for k in range(0, len(ids), 500):
            part = list(ids[k : k + 500])
            gone += self._db.execute(
                f"DELETE FROM pending_blobs WHERE id IN ({','.join('?' * len(part))})", part
            ).rowcount
        if gone != len(ids):
            raise LibraryError(
                "gc reclaimed a blob this write was still using (its pending record had expired); "
                "nothing was committed, try again"
            )

    def insert_blob_row(self, stored: StoredBlob) -> None:
        """Record a blob just stored (inside a write transaction). An existing row takes the stored
        form's sizes and chunk digests: `put` has just checked or written the file they describe."""
        self._db.execute(
            "INSERT INTO blobs (sha256, size, created_at, chunks, stored_size, canonical) VALUES (?, ?, ?, ?, ?, 1) "
            "ON CONFLICT(sha256) DO UPDATE SET chunks = excluded.chunks, stored_size = excluded.stored_size, "
            "canonical = 1",
            [stored.sha256, stored.size, now(), stored.chunks, stored.stored_size],
        )

    def insert_model(self, model: ModelRecord) -> None:
        self._db["models"].insert(
            {
                "sha256": model.sha256,
                "name": model.name,
                "architecture": model.architecture,
                "size_bytes": model.size_bytes,
                "added_at": now(),
            },
            ignore=True,
        )

    def mark_pending(self, shas: Sequence[str]) -> list[int]:
        """Record blobs this process is about to write (one transaction); gc will not take them."""
        rows = [
            {"sha256": check_sha(s), "pid": os.getpid(), "host": socket.gethostname(), "created_at": now()}
            for s in shas
        ]
        with self.write():
            return [self._db["pending_blobs"].insert(r).last_pk for r in rows]

    def clear_pending(self, ids: Sequence[int]) -> None:
        """Forget pending records after a failure (best effort: gc reclaims what stays)."""
        try:
            with self.write():
                for k in range(0, len(ids), 500):
                    part = list(ids[k : k + 500])
                    self._db.execute(f"DELETE FROM pending_blobs WHERE id IN ({','.join('?' * len(part))})", part)
        except sqlite3.Error as exc:  # already failing: say so, and leave the records to gc (older than its grace)
            log.warning("%d pending blob records were not cleared (%s); kvgraft gc reclaims them", len(ids), exc)

    def remove(self, entry_id: int) -> Entry:
        entry = self.get(entry_id)
        with self.write():
            ids = [entry_id]
            if entry.kind == "solution":  # its answer-ready state goes with it
                ids += [
                    r[0]
                    for r in self._db.execute(
                        "SELECT id FROM entries WHERE kind = 'answer' AND question_key IS ? AND text = ? AND "
                        "fingerprint = ?",
                        [question_key(entry.question) if entry.question else None, entry.text, entry.fingerprint],
                    )
                ]
            for i in ids:
                self.sources.forget_sections_of(i)
                self._db.execute("DELETE FROM prefix_keys WHERE entry_id = ?", [i])
                self._db.execute("DELETE FROM cache_states WHERE entry_id = ?", [i])
                self._db.execute("DELETE FROM entries WHERE id = ?", [i])
        return entry  # the blob stays until `gc` finds it unreferenced

    def remove_all(self, entry_ids) -> list[Entry]:
        """Remove several entries; an answer-ready state already removed with its solution is skipped."""
        removed, gone = [], set()
        for i in entry_ids:
            if i in gone:
                continue
            before = {r[0] for r in self._db.execute("SELECT id FROM entries WHERE kind = 'answer'")}
            removed.append(self.remove(i))
            gone |= before - {r[0] for r in self._db.execute("SELECT id FROM entries WHERE kind = 'answer'")}
        return removed

    def mark_damaged(self, blob_sha256: str, reason: str) -> None:
        with self.write():
            self._db.execute("UPDATE entries SET damaged = ? WHERE blob_sha256 = ?", [reason, blob_sha256])

    # -- reading -------------------------------------------------------------------------------
    def get(self, entry_id: int) -> Entry:
        for row in self._db.query("SELECT * FROM entries WHERE id = ?", [entry_id]):
            return Entry.from_row(row)
        raise EntryNotFound(f"no entry #{entry_id}")

    def pack(self, pack_id: int) -> dict | None:
        """The record of an imported pack: file name, SHA-256, format version, signer key id (or None)."""
        for row in self._db.query("SELECT * FROM packs WHERE id = ?", [pack_id]):
            return dict(row)
        return None

    def entries(self, limit: int | None = None, offset: int = 0, kind: str | None = None) -> list[Entry]:
        sql = "SELECT * FROM entries" + (" WHERE kind = ?" if kind else "") + " ORDER BY id"
        args: list = [kind] if kind else []
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            args += [limit, offset]
        return [Entry.from_row(r) for r in self._db.query(sql, args)]

    def count(self) -> int:
        return self._db.execute("SELECT count(*) FROM entries").fetchone()[0]

    def search(self, text: str, limit: int = 20, any_term: bool = False, fingerprint: str | None = None) -> list[Entry]:
        """Full-text search (FTS5, porter stemming) over titles, questions and texts, best first."""
        q = _fts_query(text, any_term)
        if q is None:
            return []
        sql = (
            "SELECT e.* FROM entries_fts f JOIN entries e ON e.id = f.rowid WHERE entries_fts MATCH ? AND e.kind "
            f"NOT IN {NOT_KNOWLEDGE}"
            + (f" AND e.fingerprint = ? AND {GRAFTABLE}" if fingerprint else "")
            + " ORDER BY f.rank LIMIT ?"
        )
        args = [q] + ([fingerprint] if fingerprint else []) + [limit]
        return [Entry.from_row(r) for r in self._db.query(sql, args)]

    def related(self, question: str, fingerprint: str, limit: int = 5) -> list[Entry]:
        """Graftable entries ranked by full-text relevance to a question with no exact match (any term)."""
        return self.search(question, limit=limit, any_term=True, fingerprint=fingerprint)

    def find_question(self, question: str, fingerprint: str | None = None) -> Entry | None:
        """The entry stored for this question (normalized), preferring graftable, verified, newest."""
        key = question_key(question)
        if not key:
            return None
        rows = list(
            self._db.query(
                f"SELECT * FROM entries WHERE question_key = ? AND kind NOT IN {NOT_KNOWLEDGE} ORDER BY id DESC", [key]
            )
        )
        entries = [Entry.from_row(r) for r in rows]
        if fingerprint is not None:
            entries.sort(key=lambda e: (not e.graftable(fingerprint), not e.verified, e.answer is None))
        return entries[0] if entries else None

    def longest_prefix(self, tokens: Sequence[int], fingerprint: str) -> Entry | None:
        """The graftable entry whose tokens are the longest prefix of `tokens` (None if none is).

        Entries are indexed by keys of their token prefixes at every PREFIX_BLOCK boundary and at
        their full length. Step 1 binary-searches the longest block boundary any entry shares with
        the prompt (log2(n/B) indexed probes); step 2 looks for full-length keys block by block
        from there down and confirms a hit against the stored tokens. The cost depends on the
        prompt's length, not on the number of entries.
        """
        n = len(tokens)
        if n == 0:
            return None
        blocks = list(range(PREFIX_BLOCK, n + 1, PREFIX_BLOCK))
        bkeys = prefix_keys(tokens, blocks)
        # Entries sharing the prompt's first k*B tokens also share its first j*B for every j < k,
        # so the matched block lengths are a downward-closed set: binary search for the longest.
        lo, hi, top = 0, len(blocks) - 1, 0
        while lo <= hi:
            mid = (lo + hi) // 2
            hit = self._db.execute(
                "SELECT 1 FROM prefix_keys p JOIN entries e ON e.id = p.entry_id "
                f"WHERE p.key = ? AND p.length = ? AND e.fingerprint = ? AND {GRAFTABLE} "
                f"AND e.kind NOT IN {NOT_KNOWLEDGE} LIMIT 1",
                [bkeys[blocks[mid]], blocks[mid], fingerprint],
            ).fetchone()
            if hit:
                top, lo = blocks[mid], mid + 1
            else:
                hi = mid - 1
        start = top
        while start >= 0:
            lengths = list(range(max(1, start), min(start + PREFIX_BLOCK, n + 1)))
            keys = prefix_keys(tokens, lengths)
            by_key = {k: length for length, k in keys.items()}
            marks = ",".join("?" * len(by_key))
            rows = self._db.execute(
                f"SELECT p.entry_id, p.length FROM prefix_keys p JOIN entries e ON e.id = p.entry_id "
                f"WHERE p.full = 1 AND p.key IN ({marks}) AND e.fingerprint = ? AND {GRAFTABLE} "
                f"AND e.kind NOT IN {NOT_KNOWLEDGE} ORDER BY p.length DESC, p.entry_id DESC",
                list(by_key) + [fingerprint],
            ).fetchall()
            want = list(tokens)
            for entry_id, length in rows:
                entry = self.get(entry_id)
                if entry.tokens == want[:length]:
                    return entry
            start -= PREFIX_BLOCK
        return None

    def read_blob(self, entry: Entry, into: bytearray | None = None):
        """The entry's blob bytes, checked (into a reusable buffer when given and the index holds
        chunk digests). A missing or corrupt blob marks its entries damaged; an unreadable one
        (BlobUnreadable: an OS error this time, its bytes never compared) is not damage and passes
        through unmarked."""
        row = self._db.execute("SELECT chunks FROM blobs WHERE sha256 = ?", [entry.blob_sha256]).fetchone()
        try:
            if row and row[0]:
                return self.blobs.read_chunked(entry.blob_sha256, entry.blob_size, row[0], into=into)
            return self.blobs.read_verified(entry.blob_sha256, entry.blob_size)
        except BlobMissing:
            self.mark_damaged(entry.blob_sha256, "blob missing")
            raise
        except BlobCorrupt:
            self.mark_damaged(entry.blob_sha256, "blob hash mismatch")
            raise

    def stats(self, n_ctx: int | None = None, fingerprint: str | None = None) -> dict:
        q = self._db.execute
        entries = q("SELECT count(*) FROM entries").fetchone()[0]
        # an answer-ready state repeats its solution's text, a session is a conversation: neither is
        # more knowledge stored
        tokens = q(f"SELECT coalesce(sum(n_tokens), 0) FROM entries WHERE kind NOT IN {NOT_KNOWLEDGE}").fetchone()[0]
        blobs, nbytes, canonical_bytes, legacy = q(
            "SELECT count(*), coalesce(sum(coalesce(stored_size, size)), 0), coalesce(sum(size), 0), "
            "coalesce(sum(canonical IS NOT 1), 0) FROM blobs"
        ).fetchone()
        blob_tokens = q(
            "SELECT coalesce(sum(n), 0) FROM (SELECT max(n_tokens) AS n FROM entries GROUP BY blob_sha256)"
        ).fetchone()[0]
        out = {
            "entries": entries,
            "blobs": blobs,
            "bytes": nbytes,  # on disk
            "canonical_bytes": canonical_bytes,  # what the blobs hold uncompacted
            "tokens": tokens,
            "blob_tokens": blob_tokens,  # tokens held by distinct blobs
            "bytes_per_token": (nbytes / blob_tokens) if blob_tokens else None,
            "canonical_bytes_per_token": (canonical_bytes / blob_tokens) if blob_tokens else None,
            "uncompacted_blobs": legacy,
            "damaged": q("SELECT count(*) FROM entries WHERE damaged IS NOT NULL").fetchone()[0],
            "unproven": q("SELECT count(*) FROM entries WHERE proof = ?", [UNPROVEN]).fetchone()[0],
            "by_proof": {p: c for p, c in q("SELECT proof, count(*) FROM entries GROUP BY proof")},
            "by_kind": {k: c for k, c in q("SELECT kind, count(*) FROM entries GROUP BY kind")},
            # chat threads: bytes of their stored states, by thread id (a state a fork shares counts in each)
            "session_bytes_by_thread": {str(k): v for k, v in self.threads.session_bytes_by_thread().items()},
            "data_dir": str(self.root),
        }
        if fingerprint is not None:
            out["graftable"] = q(
                f"SELECT count(*) FROM entries e WHERE e.fingerprint = ? AND {GRAFTABLE}", [fingerprint]
            ).fetchone()[0]
            out["other_fingerprint"] = q(
                "SELECT count(*) FROM entries WHERE fingerprint <> ?", [fingerprint]
            ).fetchone()[0]
        if n_ctx:
            out["n_ctx"] = n_ctx
            out["context_multiple"] = tokens / n_ctx
        return out
