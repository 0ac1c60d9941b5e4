"""Conversations in the index: threads and their turns (migration m009). `Library.threads`.

A turn row keeps what a resume needs without re-tokenizing anything: the transcript's token ids as
the KV holds them after the reply, the `session` entry holding that state, and the decode schedule
that made it. The states themselves are ordinary entries (content-addressed blobs, proof `local`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import LibraryError
from .index import Store
from .provenance import now
from .records import Entry
from .tokens import pack_tokens, unpack_tokens


class ThreadNotFound(LibraryError):
    pass


@dataclass(frozen=True)
class Thread:
    id: int
    title: str | None
    system: str | None
    format: str
    fingerprint: str
    model_sha256: str | None
    from_entry_id: int | None
    forked_from: int | None
    fork_turn: int | None
    created_at: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Turn:
    thread_id: int
    n: int
    user: str
    reply: str
    tokens_blob: bytes
    n_tokens: int
    entry_id: int
    schedule: dict
    logits_sha256: str
    created_at: str
    decoded: int | None = None  # reply tokens decoded into the KV (None: a turn made before m012)
    restored: int | None = None  # tokens grafted from a stored state
    prefilled: int | None = None  # tokens computed for the message
    resume_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    checked: int | None = None  # the last "Check this turn": 1 exact, 0 differs, None never checked
    stop_reason: str | None = None  # how the reply ended (m015; None: a turn made before)
    regenerated: int | None = None  # 1: the reply of a Regenerate

    @property
    def tokens(self) -> list[int]:
        return unpack_tokens(self.tokens_blob)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.pop("tokens_blob")
        return d


def _thread(row) -> Thread:
    return Thread(**{k: row[k] for k in Thread.__dataclass_fields__})


TURN_STATS = ("decoded", "restored", "prefilled", "resume_ms", "prefill_ms", "decode_ms", "stop_reason", "regenerated")


def _turn(row) -> Turn:
    d = {k: row[k] for k in Turn.__dataclass_fields__ if k not in ("tokens_blob", "schedule")}
    return Turn(**d, tokens_blob=row["tokens"], schedule=json.loads(row["schedule"]))


class ThreadStore(Store):
    """Threads and turns on a `Library` (needs its `_db` and `write`)."""

    def create_thread(
        self,
        *,
        format: str,
        fingerprint: str,
        model_sha256: str | None,
        title: str | None = None,
        system: str | None = None,
        from_entry_id: int | None = None,
        forked_from: int | None = None,
        fork_turn: int | None = None,
    ) -> Thread:
        with self.write():
            thread_id = self._insert_thread(
                title, system, format, fingerprint, model_sha256, from_entry_id, forked_from, fork_turn
            )
        return self.thread(thread_id)

    def _insert_thread(self, *values) -> int:
        """One thread row (inside the caller's write transaction): title, system, format, fingerprint,
        model_sha256, from_entry_id, forked_from, fork_turn; returns its id."""
        given = self._db.execute("SELECT value FROM counters WHERE name = 'threads'").fetchone()
        top = self._db.execute("SELECT coalesce(max(id), 0) FROM threads").fetchone()[0]
        new = max(top, given[0] if given else 0) + 1  # never a number a deleted thread had
        self._db.execute(
            "INSERT INTO threads (id, title, system, format, fingerprint, model_sha256, from_entry_id, forked_from, "
            "fork_turn, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [new, *values, now()],
        )
        self._db.execute("INSERT OR REPLACE INTO counters (name, value) VALUES ('threads', ?)", [new])
        return new

    def thread(self, thread_id: int) -> Thread:
        rows = list(self._db.query("SELECT * FROM threads WHERE id = ?", [thread_id]))
        if not rows:
            raise ThreadNotFound(f"no thread #{thread_id} (kvgraft chat list shows them)")
        return _thread(rows[0])

    def list(self) -> list[Thread]:
        return [_thread(r) for r in self._db.query("SELECT * FROM threads ORDER BY id")]

    def turns(self, thread_id: int) -> list[Turn]:
        return [_turn(r) for r in self._db.query("SELECT * FROM turns WHERE thread_id = ? ORDER BY n", [thread_id])]

    def add_turn(
        self,
        thread_id: int,
        *,
        user: str,
        reply: str,
        tokens: list[int],
        entry_id: int,
        schedule: dict,
        logits_sha256: str,
        stats: dict | None = None,
    ) -> Turn:
        """Append the next turn (numbered from 1) in one transaction; `stats` holds TURN_STATS."""
        stats = stats or {}
        with self.write():
            last = self._db.execute("SELECT max(n) FROM turns WHERE thread_id = ?", [thread_id]).fetchone()[0]
            n = (last or 0) + 1
            self._db.execute(
                "INSERT INTO turns (thread_id, n, user, reply, tokens, n_tokens, entry_id, schedule, logits_sha256, "
                f"created_at, {', '.join(TURN_STATS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                f"{', '.join('?' * len(TURN_STATS))})",
                [
                    thread_id,
                    n,
                    user,
                    reply,
                    pack_tokens(tokens),
                    len(tokens),
                    entry_id,
                    json.dumps(schedule, sort_keys=True),
                    logits_sha256,
                    now(),
                    *(stats.get(k) for k in TURN_STATS),
                ],
            )
        return self.turns(thread_id)[-1]

    def rename_thread(self, thread_id: int, title: str) -> Thread:
        self.thread(thread_id)
        with self.write():
            self._db.execute("UPDATE threads SET title = ? WHERE id = ?", [title.strip() or None, thread_id])
        return self.thread(thread_id)

    def drop_last_turn(self, thread_id: int) -> Turn:
        """Remove the thread's last turn (Regenerate); its state stays until gc, unless a fork holds it."""
        turns = self.turns(thread_id)
        if not turns:
            raise LibraryError(f"thread #{thread_id} has no turn to take back")
        with self.write():
            self._db.execute("DELETE FROM turns WHERE thread_id = ? AND n = ?", [thread_id, turns[-1].n])
        return turns[-1]

    def set_turn_checked(self, thread_id: int, n: int, exact: bool) -> None:
        with self.write():
            self._db.execute("UPDATE turns SET checked = ? WHERE thread_id = ? AND n = ?", [int(exact), thread_id, n])

    def threads_from_entry(self, entry_id: int) -> list[Thread]:
        rows = self._db.query("SELECT * FROM threads WHERE from_entry_id = ? ORDER BY id", [entry_id])
        return [_thread(r) for r in rows]

    def fork_thread(self, thread_id: int, turn: int) -> Thread:
        """A new thread holding turns 1..`turn` of `thread_id` (the same states: nothing is recomputed)."""
        src = self.thread(thread_id)
        have = len(self.turns(thread_id))
        if not 0 <= turn <= have:
            raise LibraryError(f"thread #{thread_id} has no turn {turn} (it has {have})")
        with self.write():
            new_id = self._insert_thread(
                src.title, src.system, src.format, src.fingerprint, src.model_sha256, src.from_entry_id, thread_id, turn
            )
            self._db.execute(
                f"INSERT INTO turns (thread_id, n, user, reply, tokens, n_tokens, entry_id, schedule, logits_sha256, "
                f"created_at, {', '.join(TURN_STATS)}, checked) SELECT ?, n, user, reply, tokens, n_tokens, entry_id, "
                f"schedule, logits_sha256, created_at, {', '.join(TURN_STATS)}, checked "
                "FROM turns WHERE thread_id = ? AND n <= ?",
                [new_id, thread_id, turn],
            )
        return self.thread(new_id)

    def remove_thread(self, thread_id: int) -> Thread:
        """Delete a thread and its turns. Its session entries stay until gc (`stale_sessions`)."""
        thread = self.thread(thread_id)
        with self.write():
            self._db.execute("DELETE FROM turns WHERE thread_id = ?", [thread_id])
            self._db.execute("DELETE FROM threads WHERE id = ?", [thread_id])
        return thread

    def existing_entries(self, ids) -> dict:
        """{id: Entry} for those of `ids` still in the library."""
        ids = sorted(set(ids))
        out = {}
        for k in range(0, len(ids), 500):
            part = ids[k : k + 500]
            for r in self._db.query(f"SELECT * FROM entries WHERE id IN ({','.join('?' * len(part))})", part):
                out[r["id"]] = Entry.from_row(r)
        return out

    def sessions_to_keep(self) -> set[int]:
        """Session entries gc keeps: each thread's newest state and every fork point."""
        newest = self._db.execute(
            "SELECT t.entry_id FROM turns t WHERE t.n = (SELECT max(n) FROM turns u WHERE u.thread_id = t.thread_id)"
        )
        forks = self._db.execute(
            "SELECT t.entry_id FROM turns t JOIN threads f ON f.forked_from = t.thread_id AND f.fork_turn = t.n"
        )
        return {r[0] for r in newest} | {r[0] for r in forks}

    def stale_sessions(self, older_than: str) -> list[int]:
        """Session entries created before `older_than` (an index timestamp) that gc may remove: not a
        thread's newest state, not a fork point. Their turns stay (text and tokens); a resume grafts the
        newest state, which is always kept."""
        keep = self.sessions_to_keep()
        rows = self._db.execute("SELECT id FROM entries WHERE kind = 'session' AND created_at < ?", [older_than])
        return [r[0] for r in rows if r[0] not in keep]

    def session_bytes_by_thread(self) -> dict[int, int]:
        """Stored bytes of each thread's session states (a state shared by forks counts in each)."""
        rows = self._db.execute(
            "SELECT t.thread_id, coalesce(sum(coalesce(b.stored_size, b.size)), 0) FROM turns t "
            "JOIN entries e ON e.id = t.entry_id JOIN blobs b ON b.sha256 = e.blob_sha256 GROUP BY t.thread_id"
        )
        return {tid: n for tid, n in rows}
