"""The server's prompt cache in the index: automatic states (kind `cache`), found by token prefix,
evicted least recently used past a byte budget (app/serve/prompt_cache.py decides what to store).

A cache state is an entry like any other (a blob, its tokens, `proof: local`: computed here) plus a
`cache_states` row: the block size of the schedule that decoded it, when it was last used, how many
times it was. Two ways to find one:

- made in aligned blocks (an engine whose bits depend on the batching): `cached_state`, reused only by a
  request decoded in the same blocks, and only at its own length (a boundary of that request's schedule);
- made on a batch-invariant engine (block 0: no schedule): `cache_candidates`, any state sharing a
  prefix with the request, found through prefix keys kept at every GRAIN tokens and confirmed against
  the stored tokens; the caller (app/serve/prompt_cache.py) decides how much of it a graft may use.

Search, the window's table, packs and the token count never show it (records.NOT_KNOWLEDGE). One
budget rule keeps the server's states and the conversations' the same way: past the budget the least
recently used go, automatic states and the conversation states no thread pins (a thread's newest state
and its fork points stay while the thread exists); it never touches any other kind.
"""

from __future__ import annotations

from typing import Sequence

from .cache_pins import CachePinRecords
from .entry_writes import PRESENT
from .index import Store
from .provenance import now
from .records import GRAFTABLE, LOCAL, Entry
from .staging import staged
from .tokens import PREFIX_BLOCK, prefix_keys, shared_prefix

CACHE = "cache"
GRAIN = 16  # a state made without a schedule is also keyed at every GRAIN tokens (and its first GRAIN-1, its n-1)


class PromptCacheRecords:
    def cached_state(self, tokens: Sequence[int], lengths: Sequence[int], fingerprint: str, block: int) -> Entry | None:
        """The longest cache state made under `fingerprint` in blocks of `block` whose tokens are
        tokens[:L] for one of `lengths` (one indexed query over the candidates' prefix keys)."""
        keys = prefix_keys(tokens, lengths)
        if not keys:
            return None
        by_key = {k: length for length, k in keys.items()}
        marks = ",".join("?" * len(by_key))
        rows = self._db.execute(
            "SELECT p.entry_id, p.length FROM prefix_keys p JOIN entries e ON e.id = p.entry_id "
            "JOIN cache_states c ON c.entry_id = e.id "
            f"WHERE p.full = 1 AND p.key IN ({marks}) AND e.fingerprint = ? AND c.block = ? AND {GRAFTABLE} "
            "ORDER BY p.length DESC, p.entry_id DESC",
            [*by_key, fingerprint, block],
        ).fetchall()
        want = list(tokens)
        for entry_id, length in rows:
            entry = self.lib.get(entry_id)
            if entry.kind == CACHE and entry.tokens == want[:length]:
                return entry
        return None

    def cache_candidates(self, tokens: Sequence[int], fingerprint: str, limit: int = 16) -> list[tuple[Entry, int]]:
        """States made without a schedule (block 0) under `fingerprint` that share a prefix with `tokens`,
        as (entry, how many leading tokens it shares), longest shared first; one indexed query over the
        request's keys at every GRAIN tokens, its first GRAIN-1 lengths and its whole length."""
        n = len(tokens)
        lengths = [*range(1, min(n, GRAIN)), *range(GRAIN, n + 1, GRAIN), n - 1, n]
        keys = prefix_keys(tokens, lengths)
        if not keys:
            return []
        marks = ",".join("?" * len(keys))
        rows = self._db.execute(
            "SELECT p.entry_id, max(p.length) AS l FROM prefix_keys p JOIN entries e ON e.id = p.entry_id "
            "JOIN cache_states c ON c.entry_id = e.id "
            f"WHERE p.key IN ({marks}) AND e.fingerprint = ? AND c.block = 0 AND {GRAFTABLE} "
            "GROUP BY p.entry_id ORDER BY l DESC, e.n_tokens, p.entry_id DESC LIMIT ?",
            [*keys.values(), fingerprint, limit],
        ).fetchall()
        want = list(tokens)
        out = []
        for entry_id, _ in rows:
            entry = self.lib.get(entry_id)
            shared = shared_prefix(entry.tokens, want)
            if entry.kind == CACHE and shared > 0:
                out.append((entry, shared))
        out.sort(key=lambda c: (-c[1], c[0].n_tokens))
        return out

    def add_cache_state(self, block: int, proof: str = LOCAL, **entry) -> tuple[Entry, bool]:
        """Store an automatic state (the keywords are `stage_entry`'s, kind `cache`) and its cache row
        in one transaction; the same tokens again only mark it used. A state made without a schedule
        (block 0) is also keyed at every GRAIN tokens and one short of its end (`cache_candidates`).
        `proof`: local (computed here), or signed:<name> (a fleet's state, app/serve/shared_cache.py)."""
        with staged(self.lib) as staging:
            existing, pending = self.lib.stage_entry(staging, kind=CACHE, proof=proof, **entry)
            if existing is not None:
                self.touch_cache_state(existing.id)
                self.attach_pins(existing.id, entry["tokens"], entry["fingerprint"])
                return existing, False
            with staging.commit() as db:
                entry_id, written = self.lib.write_staged(pending)
                db.execute(
                    "INSERT OR REPLACE INTO cache_states (entry_id, block, last_used, hits) VALUES (?, ?, ?, 0)",
                    [entry_id, block, now()],
                )
                if block == 0 and written != PRESENT:
                    _key_grains(db, entry_id, entry["tokens"])
        self.attach_pins(entry_id, entry["tokens"], entry["fingerprint"])
        return self.lib.get(entry_id), True

    def touch_cache_state(self, entry_id: int) -> None:
        with self.write() as db:
            db.execute("UPDATE cache_states SET last_used = ?, hits = hits + 1 WHERE entry_id = ?", [now(), entry_id])
        self.refresh_pins(entry_id)

    def largest_cache_blob(self) -> int:
        row = self._db.execute(
            "SELECT coalesce(max(e.blob_size), 0) FROM entries e JOIN cache_states c ON c.entry_id = e.id"
        ).fetchone()
        return int(row[0])

    def _budgeted(self) -> str:
        """SQL for the entries the cache budget governs: automatic states, and conversation states no
        thread pins (`sessions_to_keep`: a thread's newest state and its fork points, pinned while the
        thread exists)."""
        pinned = ",".join(str(int(i)) for i in self.lib.threads.sessions_to_keep()) or "-1"
        named = ",".join(str(int(i)) for i in self.pinned_entry_ids()) or "-1"  # library/cache_pins.py
        return (
            "SELECT e.id, coalesce(c.last_used, e.created_at) AS used FROM entries e "
            "LEFT JOIN cache_states c ON c.entry_id = e.id "
            f"WHERE (c.entry_id IS NOT NULL AND e.id NOT IN ({named})) "
            f"OR (e.kind = 'session' AND e.id NOT IN ({pinned}))"
        )

    def cache_bytes(self) -> tuple[int, int]:
        """(states the cache budget governs, bytes of the blobs only they hold): automatic states and
        conversation states no thread pins."""
        budgeted = self._budgeted()
        n = self._db.execute(f"SELECT count(*) FROM ({budgeted})").fetchone()[0]
        size = self._db.execute(
            "SELECT coalesce(sum(b.size), 0) FROM blobs b WHERE b.sha256 IN "
            f"(SELECT e.blob_sha256 FROM entries e WHERE e.id IN (SELECT id FROM ({budgeted}))) AND b.sha256 NOT IN "
            f"(SELECT blob_sha256 FROM entries WHERE id NOT IN (SELECT id FROM ({budgeted})))"
        ).fetchone()[0]
        return n, int(size)

    def evict_cache(self, budget_bytes: int) -> tuple[int, int]:
        """Remove the least recently used of the states the budget governs (automatic states by their last
        use, unpinned conversation states by when they were made), and the blobs only they held, until
        those blobs fit `budget_bytes`. Returns (states removed, bytes freed)."""
        removed = freed = 0
        self.trim_pins()  # pins past their time, and past MAX_PINS the soonest to end, go (their states are budgeted)
        while True:
            _, size = self.cache_bytes()
            if size <= budget_bytes:
                return removed, freed
            row = self._db.execute(f"SELECT id FROM ({self._budgeted()}) ORDER BY used, id LIMIT 1").fetchone()
            if row is None:
                return removed, freed
            freed += self._remove_cache_state(row[0])
            removed += 1

    def _remove_cache_state(self, entry_id: int) -> int:
        entry = self.lib.get(entry_id)
        with self.write() as db:
            db.execute("DELETE FROM cache_states WHERE entry_id = ?", [entry_id])
            db.execute("UPDATE cache_pins SET entry_id = NULL WHERE entry_id = ?", [entry_id])
            db.execute("DELETE FROM prefix_keys WHERE entry_id = ?", [entry_id])
            db.execute("DELETE FROM entries WHERE id = ?", [entry_id])
            still = db.execute("SELECT 1 FROM entries WHERE blob_sha256 = ? LIMIT 1", [entry.blob_sha256]).fetchone()
            pending = db.execute("SELECT 1 FROM pending_blobs WHERE sha256 = ? LIMIT 1", [entry.blob_sha256]).fetchone()
            if still or pending:
                return 0
            size = db.execute("SELECT size FROM blobs WHERE sha256 = ?", [entry.blob_sha256]).fetchone()
            db.execute("DELETE FROM blobs WHERE sha256 = ?", [entry.blob_sha256])
        self.lib.blobs.delete(entry.blob_sha256)  # after the commit: a crash before leaves a file gc reclaims
        return int(size[0]) if size else 0


def _key_grains(db, entry_id: int, tokens: Sequence[int]) -> None:
    """The prefix keys a state made without a schedule has beyond every entry's (each PREFIX_BLOCK
    tokens and its whole length): its first GRAIN-1 lengths, each GRAIN tokens and its length less one
    (the lengths `cache_candidates` asks for)."""
    n = len(tokens)
    lengths = {*range(1, min(n, GRAIN)), *(p for p in range(GRAIN, n, GRAIN) if p % PREFIX_BLOCK), n - 1} - {0}
    keys = prefix_keys(tokens, lengths)
    db.conn.executemany(
        "INSERT INTO prefix_keys (key, length, entry_id, full) VALUES (?, ?, ?, 0)",
        [(k, length, entry_id) for length, k in keys.items()],
    )


class CacheStore(PromptCacheRecords, CachePinRecords, Store):
    """`Library.cache`: the server's automatic states (this module) and the named pins (library/cache_pins.py)."""
