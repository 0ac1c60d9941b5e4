"""Named cache pins: a prefix a client asked to keep (Anthropic's `cache_control`, OpenAI's
`prompt_cache_key`), kept by name until its time to live runs out, whatever the cache budget says.

A pin names a prefix by its tokens (their SHA-256 and count) and the engine fingerprint its state must
have. It holds the cache state of exactly those tokens once one is stored (`attach_pins`, called as a
state is stored; at once where one is stored already): while the pin lives, the budget's
least-recently-used eviction never takes that state (`pinned_entry_ids`, read by library/prompt_cache.py).
Pins are bounded instead: at most MAX_PINS live at once (past it the ones that end soonest go:
`trim_pins`), each for at most 30 days. Each use of the state, and each
request that pins it again, moves the expiry to its time to live from now (default 24 h, at most 30
days). A pin whose time ran out is an ordinary cache state again; `unpin` ends one at once. The rows live
in `cache_pins` (m014).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from .tokens import tokens_sha256

DEFAULT_TTL_S = 24 * 3600
MAX_TTL_S = 30 * 86400
MAX_PINS = 64  # live pins past this: the ones that end soonest go (what pins may hold on disk is bounded)


@dataclass(frozen=True)
class CachePin:
    name: str
    n_tokens: int
    tokens_sha256: str
    entry_id: int | None  # the stored state it holds; None: not stored yet (pending)
    ttl_s: float
    expires_at: float  # epoch seconds

    @property
    def state(self) -> str:
        if self.expires_at <= time.time():
            return "expired"
        return "pinned" if self.entry_id is not None else "pending"


class CachePinRecords:
    def pin_prefix(self, name: str, tokens: Sequence[int], fingerprint: str, ttl_s: float = DEFAULT_TTL_S) -> CachePin:
        """Pin the prefix `tokens` by `name` (a pin of that name is moved to it); it holds the cache state
        of exactly these tokens made by this engine, now if one is stored, else once one is."""
        sha, t = tokens_sha256(tokens), time.time()
        with self.write() as db:
            row = db.execute(
                "SELECT e.id FROM entries e JOIN cache_states c ON c.entry_id = e.id "
                "WHERE e.tokens_sha256 = ? AND e.n_tokens = ? AND e.fingerprint = ? ORDER BY e.id LIMIT 1",
                [sha, len(tokens), fingerprint],
            ).fetchone()
            db.execute(
                "INSERT OR REPLACE INTO cache_pins (name, tokens_sha256, n_tokens, fingerprint, entry_id, ttl_s, "
                "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, "
                "coalesce((SELECT created_at FROM cache_pins WHERE name = ?), ?), ?)",
                [name, sha, len(tokens), fingerprint, row[0] if row else None, ttl_s, name, t, t + ttl_s],
            )
        return self.cache_pin(name)

    def attach_pins(self, entry_id: int, tokens: Sequence[int], fingerprint: str) -> int:
        """A cache state of these tokens is stored: the pins waiting for it hold it now."""
        with self.write() as db:
            cur = db.execute(
                "UPDATE cache_pins SET entry_id = ? WHERE tokens_sha256 = ? AND n_tokens = ? AND fingerprint = ? "
                "AND (entry_id IS NULL OR entry_id NOT IN (SELECT entry_id FROM cache_states))",
                [entry_id, tokens_sha256(tokens), len(tokens), fingerprint],
            )
            return cur.rowcount

    def refresh_pins(self, entry_id: int) -> None:
        """The state was used: its pins live their time to live from now."""
        with self.write() as db:
            db.execute(
                "UPDATE cache_pins SET expires_at = ? + ttl_s WHERE entry_id = ? AND expires_at > ?",
                [time.time(), entry_id, time.time()],
            )

    def pinned_entry_ids(self) -> list[int]:
        """The cache states a live pin holds (a pin whose state was removed holds none)."""
        rows = self._db.execute(
            "SELECT DISTINCT p.entry_id FROM cache_pins p JOIN cache_states c ON c.entry_id = p.entry_id "
            "WHERE p.expires_at > ?",
            [time.time()],
        )
        return [int(r[0]) for r in rows]

    _COLUMNS = (
        "SELECT p.name, p.n_tokens, p.tokens_sha256, c.entry_id, p.ttl_s, p.expires_at FROM cache_pins p "
        "LEFT JOIN cache_states c ON c.entry_id = p.entry_id"
    )

    def cache_pin(self, name: str) -> CachePin | None:
        row = self._db.execute(f"{self._COLUMNS} WHERE p.name = ?", [name]).fetchone()
        return CachePin(*row) if row else None

    def cache_pins(self) -> list[CachePin]:
        return [CachePin(*r) for r in self._db.execute(f"{self._COLUMNS} ORDER BY p.name")]

    def trim_pins(self, keep: int = MAX_PINS) -> int:
        """Drop the pins whose time ran out, and past `keep` live pins the ones that end soonest; returns
        how many went."""
        with self.write() as db:
            gone = db.execute("DELETE FROM cache_pins WHERE expires_at <= ?", [time.time()]).rowcount
            gone += db.execute(
                "DELETE FROM cache_pins WHERE name IN (SELECT name FROM cache_pins ORDER BY expires_at DESC "
                "LIMIT -1 OFFSET ?)",
                [keep],
            ).rowcount
        return gone

    def unpin(self, name: str) -> bool:
        with self.write() as db:
            return db.execute("DELETE FROM cache_pins WHERE name = ?", [name]).rowcount > 0
