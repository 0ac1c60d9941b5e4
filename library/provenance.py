"""What the library records about where its states come from: proofs, engines, signers, relabels.

Mixed into `Library` (library/library.py); the tables are from migration m007 (library/schema.py).
"""

from __future__ import annotations

import datetime
import json

from .records import Entry

# tables whose rows are made under a fingerprint and own entries: table -> (its link table, the link's
# column naming the owner); `migrate_owners` moves an owner once all its entries have moved
OWNERS = {"threads": ("turns", "thread_id"), "sources": ("source_sections", "source_id")}


def _under(fingerprints, model_sha256: str | None) -> tuple[str, list]:
    """The WHERE clause of intact entries under `fingerprints` (none: matches nothing), of a model."""
    fps = list(fingerprints)
    where = f"fingerprint IN ({','.join('?' * len(fps))}) AND damaged IS NULL" if fps else "0"
    if model_sha256 is not None:
        return where + " AND (model_sha256 = ? OR model_sha256 IS NULL)", [*fps, model_sha256]
    return where, fps


def now() -> str:
    """A UTC timestamp as the index stores them (library.index re-exports it)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


class ProvenanceRecords:
    """Proof-of-origin bookkeeping on a `Library` (needs its `_db`, `write` and `get`)."""

    def set_proof(self, entry_id: int, proof: str, fingerprint: str, receipt: dict | None = None) -> Entry:
        """Record a proof of origin found for an entry (a replay here reproduced its state), with the
        fingerprint of the engine that found it and the receipt computed there."""
        with self.write():
            self._db.execute(
                "UPDATE entries SET proof = ?, fingerprint = ?, receipt = ? WHERE id = ?",
                [proof, fingerprint, json.dumps(receipt, sort_keys=True) if receipt else None, entry_id],
            )
        return self.get(entry_id)

    def record_check(self, entry_id: int, ok: bool) -> None:
        """A verify run checked the entry here: when, and whether every check passed."""
        with self.write():
            self._db.execute(
                "UPDATE entries SET checked_at = ?, check_ok = ? WHERE id = ?", [now(), int(bool(ok)), entry_id]
            )

    def record_engine(self, fingerprint: str, info: dict, environment: dict) -> None:
        """Remember what a fingerprint stands for (once per fingerprint)."""
        if self._db.execute("SELECT 1 FROM engines WHERE fingerprint = ?", [fingerprint]).fetchone():
            return
        with self.write():
            self._db.execute(
                "INSERT OR IGNORE INTO engines (fingerprint, info, environment, seen_at) VALUES (?, ?, ?, ?)",
                [fingerprint, json.dumps(info, sort_keys=True), json.dumps(environment, sort_keys=True), now()],
            )

    def engines(self) -> dict[str, dict]:
        """What every fingerprint this library has seen stands for: {fingerprint: info}."""
        return {fp: json.loads(info) for fp, info in self._db.execute("SELECT fingerprint, info FROM engines")}

    def engine_info(self, fingerprint: str) -> dict | None:
        row = self._db.execute("SELECT info, environment FROM engines WHERE fingerprint = ?", [fingerprint]).fetchone()
        return {"info": json.loads(row[0]), "environment": json.loads(row[1])} if row else None

    def revoke_signer(self, key_id: str) -> int:
        """A signer is no longer trusted: the entries its packs proved become unproven, and the
        answers it vouched for become stated. Returns how many entries changed."""
        with self.write():
            n = self._db.execute(
                "UPDATE entries SET proof = 'unproven' WHERE proof LIKE 'signed:%' AND pack_id IN "
                "(SELECT id FROM packs WHERE signer = ?)",
                [key_id],
            ).rowcount
            self._db.execute(
                "UPDATE entries SET vouched_by = NULL, verified_at = NULL WHERE vouched_by LIKE 'signer:%' "
                "AND pack_id IN (SELECT id FROM packs WHERE signer = ?)",
                [key_id],
            )
        return n

    def legacy_samples(self, legacy: str, limit: int = 3) -> list[Entry] | None:
        """Up to `limit` intact entries with a receipt still under an old-style fingerprint, newest
        first; None when no entry at all is under it (nothing to relabel)."""
        if self._db.execute("SELECT 1 FROM entries WHERE fingerprint = ? LIMIT 1", [legacy]).fetchone() is None:
            return None
        return [
            Entry.from_row(r)
            for r in self._db.query(
                "SELECT * FROM entries WHERE fingerprint = ? AND receipt IS NOT NULL AND damaged IS NULL ORDER BY "
                "id DESC LIMIT ?",
                [legacy, limit],
            )
        ]

    def relabel_fingerprint(self, legacy: str, fingerprint: str) -> int:
        """Move entries made under an old-style fingerprint (version 1, which hashed the CPU feature
        string) to the probe fingerprint of the engine whose old-style fingerprint it is. Their
        proof does not change. Returns how many moved."""
        if (
            legacy == fingerprint
            or self._db.execute("SELECT 1 FROM entries WHERE fingerprint = ? LIMIT 1", [legacy]).fetchone() is None
        ):
            return 0
        with self.write():
            n = self._db.execute(
                "UPDATE entries SET fingerprint = ? WHERE fingerprint = ?", [fingerprint, legacy]
            ).rowcount
            self._db.execute(
                "INSERT OR REPLACE INTO fingerprint_relabels (legacy, fingerprint, entries, relabelled_at) "
                "VALUES (?, ?, ?, ?)",
                [legacy, fingerprint, n, now()],
            )
        return n

    def entries_under(self, fingerprints, model_sha256: str | None = None) -> list[Entry]:
        """Intact entries made under any of `fingerprints` (of `model_sha256` when given), oldest first."""
        where, args = _under(fingerprints, model_sha256)
        return [Entry.from_row(r) for r in self._db.query(f"SELECT * FROM entries WHERE {where} ORDER BY id", args)]

    def count_under(self, fingerprints, model_sha256: str | None = None) -> int:
        """How many `entries_under` there are, without reading them (the window's library line, doctor)."""
        where, args = _under(fingerprints, model_sha256)
        return self._db.execute(f"SELECT count(*) FROM entries WHERE {where}", args).fetchone()[0]

    def migrate_entry(
        self, entry: Entry, data, sha: str, elide, fingerprint: str, proof: str, receipt: dict | None
    ) -> Entry:
        """Point `entry` at the state `data` (address `sha`, computed from its tokens by the engine of
        `fingerprint`) with that proof and receipt, in one transaction. The old blob is not an alias of
        the new one (other bits, not another form of them); its row and file go once no entry uses it."""
        from .staging import staged  # the staging imports the library's write path

        old = entry.blob_sha256
        with staged(self) as staging:
            if sha != old:
                staging.put(data, sha, elide=elide)
            with staging.commit() as db:
                db.execute(
                    "UPDATE entries SET blob_sha256 = ?, fingerprint = ?, proof = ?, receipt = ? WHERE id = ?",
                    [sha, fingerprint, proof, json.dumps(receipt, sort_keys=True) if receipt else None, entry.id],
                )
                orphan = (
                    sha != old
                    and db.execute("SELECT 1 FROM entries WHERE blob_sha256 = ? LIMIT 1", [old]).fetchone() is None
                )
                if orphan:
                    db.execute("DELETE FROM blobs WHERE sha256 = ?", [old])
        if sha != old and orphan:
            self.blobs.delete(old)
        return self.get(entry.id)

    def migrate_owners(self, old: list[str], fingerprint: str) -> dict:
        """Move threads and deposited files made under `old` fingerprints to `fingerprint` once none of
        their entries is left under them (their states have all been migrated). Returns how many moved."""
        if not old:
            return {table: 0 for table in OWNERS}
        marks = ",".join("?" * len(old))
        moved = {}
        with self.write():
            for table, (links, key) in OWNERS.items():
                moved[table] = self._db.execute(
                    f"UPDATE OR IGNORE {table} SET fingerprint = ? WHERE fingerprint IN ({marks}) AND NOT EXISTS ("
                    f"SELECT 1 FROM {links} l JOIN entries e ON e.id = l.entry_id WHERE l.{key} = {table}.id "
                    f"AND e.fingerprint IN ({marks}))",
                    [fingerprint, *old, *old],
                ).rowcount
        return moved
