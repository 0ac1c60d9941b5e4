"""gc and fsck for a library.

gc never removes a blob that another process is writing: a deposit records the blob in
`pending_blobs` (committed, with its pid) before the file exists and clears it in the same
transaction that commits the entry. gc runs inside one write transaction, so no deposit can
commit or start meanwhile; it keeps every blob named by an entry or by a live pending row (its
process is alive; for a row written from another host, it is younger than the grace period).
Temp files are treated the same way by the pid in their name.

fsck separates damage (`problems`: a missing or corrupt blob, an index row that points nowhere,
an entry marked damaged) from leftovers of interrupted writes (`reclaimable`: orphan blobs,
unreferenced blob rows, temp files, stale pending rows), which are not problems. Blobs stored
before compaction (`uncompacted`) are not problems either: they read and graft as before, and
`kvgraft fsck --repair` compacts them (app/maintain/recompaction.py, which needs the model's window).

gc and fsck are the index's own upkeep across its tables (entries, blobs, pending rows, sections, prefix
keys): they work on the `Index` itself (`lib.index`, library/index.py), not through one store.
"""

from __future__ import annotations

import datetime
import os
import socket
import sqlite3
import time

from .library import Library
from .records import NOT_KNOWLEDGE

GRACE_S = 3600.0
_UNREFERENCED = "SELECT sha256 FROM blobs WHERE sha256 NOT IN (SELECT blob_sha256 FROM entries)"
MAX_LIVE_AGE_S = 86400.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _age_s(iso: str) -> float:
    then = datetime.datetime.fromisoformat(iso)
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.timezone.utc)
    return (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()


def _live(pid: int, host: str | None, age_s: float, grace_s: float) -> bool:
    """Is the writer behind a pending row or temp file still at work?

    On this host: its process is alive (and the record is younger than a day, against pid
    reuse). A record from another host (a shared file system) cannot be checked: it is live for
    the grace period.
    """
    if host is not None and host != socket.gethostname():
        return age_s < grace_s
    return age_s < MAX_LIVE_AGE_S and _pid_alive(pid)


def _pending(lib: Library, grace_s: float) -> tuple[set[str], list[int]]:
    live, stale = set(), []
    for row in lib.index.db.query("SELECT id, sha256, pid, host, created_at FROM pending_blobs"):
        if _live(row["pid"], row["host"], _age_s(row["created_at"]), grace_s):
            live.add(row["sha256"])
        else:
            stale.append(row["id"])
    return live, stale


def _temp_files(lib: Library, grace_s: float, live_pending: set[str]):
    for t in lib.blobs.iter_temp():
        age = time.time() - t.mtime
        if t.sha256 in live_pending or _live(t.pid, None, age, grace_s):
            continue
        yield t


def _check_chunks(lib: Library, sha: str, problems: list, repaired: list, repair: bool) -> None:
    """The chunk digests the fast read path checks must be those of the (intact) blob."""
    row = lib.index.db.execute("SELECT chunks, size FROM blobs WHERE sha256 = ?", [sha]).fetchone()
    if row is None:
        return
    want = lib.blobs.stored_digests(sha)
    if row[0] == want:
        return
    if repair:
        with lib.write():
            lib.index.db.execute("UPDATE blobs SET chunks = ? WHERE sha256 = ?", [want, sha])
        repaired.append(f"blob {sha[:16]}...: chunk digests " + ("added" if row[0] is None else "rewritten"))
    elif row[0] is not None:
        problems.append(
            {"kind": "chunk_digests", "blob": sha, "detail": "the index's chunk digests do not match the intact blob"}
        )


def free_blobs(lib: Library) -> dict:
    """Give back the disk of the indexed blobs no entry references and no live writer has pending (what a
    delete just released, an answer-ready state that went with its solution included): the index rows go
    in one transaction, then the files (a file left by a kill between the two is a leftover gc reclaims)."""
    with lib.write():
        live, _stale = _pending(lib, GRACE_S)
        free = [
            r[0]
            for r in lib.index.db.execute(
                "SELECT sha256 FROM blobs WHERE sha256 NOT IN (SELECT blob_sha256 FROM entries)"
            )
            if r[0] not in live
        ]
        lib.index.db.conn.executemany("DELETE FROM blobs WHERE sha256 = ?", [(sha,) for sha in free])
    freed, n = 0, 0
    for sha in free:
        size = lib.blobs.stored_size(sha) or 0
        if lib.blobs.delete(sha):
            freed, n = freed + size, n + 1
    return {"removed_blobs": n, "removed_bytes": freed}


def gc(lib: Library, grace_s: float = GRACE_S) -> dict:
    """Remove session states no thread needs (older than the grace period; never a thread's newest or a
    fork point), then blobs no entry references, stale pending rows and dead temp files."""
    removed_blobs, removed_bytes, removed_temp = [], 0, 0
    cutoff = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=grace_s)).isoformat(
        timespec="microseconds"
    )
    removed_sessions = lib.remove_all(lib.threads.stale_sessions(cutoff))
    with lib.write():
        live, stale = _pending(lib, grace_s)
        for k in range(0, len(stale), 500):
            part = stale[k : k + 500]
            lib.index.db.execute(f"DELETE FROM pending_blobs WHERE id IN ({','.join('?' * len(part))})", part)
        referenced = {r[0] for r in lib.index.db.execute("SELECT DISTINCT blob_sha256 FROM entries")}
        keep = referenced | live
        unreferenced = [
            r[0]
            for r in lib.index.db.execute(
                "SELECT sha256 FROM blobs WHERE sha256 NOT IN (SELECT blob_sha256 FROM entries)"
            )
        ]
        lib.index.db.conn.executemany(
            "DELETE FROM blobs WHERE sha256 = ?", [(sha,) for sha in unreferenced if sha not in live]
        )
        for sha in list(lib.blobs.iter_shas()):
            if sha not in keep:
                removed_bytes += lib.blobs.stored_size(sha) or 0
                if lib.blobs.delete(sha):
                    removed_blobs.append(sha)
        for t in _temp_files(lib, grace_s, live):
            t.path.unlink(missing_ok=True)
            removed_temp += 1
    return {
        "removed_sessions": len(removed_sessions),
        "removed_blobs": len(removed_blobs),
        "removed_bytes": removed_bytes,
        "removed_temp_files": removed_temp,
        "removed_pending": len(stale),
        "kept_pending": len(live),
    }


def fsck(lib: Library, repair: bool = False, check_hashes: bool = True, grace_s: float = GRACE_S) -> dict:
    problems: list[dict] = []
    reclaimable: list[dict] = []
    repaired: list[str] = []
    q = lib.index.db.execute

    for (msg,) in q("PRAGMA integrity_check"):
        if msg != "ok":
            problems.append({"kind": "sqlite", "detail": msg})
    try:
        q("INSERT INTO entries_fts(entries_fts) VALUES('integrity-check')")
    except sqlite3.DatabaseError as exc:
        if repair:
            with lib.write():
                q("INSERT INTO entries_fts(entries_fts) VALUES('rebuild')")
            repaired.append("rebuilt the full-text index")
        else:
            problems.append({"kind": "fts", "detail": f"full-text index inconsistent: {exc}"})

    dangling_keys = q("SELECT count(*) FROM prefix_keys WHERE entry_id NOT IN (SELECT id FROM entries)").fetchone()[0]
    if dangling_keys:
        if repair:
            with lib.write():
                q("DELETE FROM prefix_keys WHERE entry_id NOT IN (SELECT id FROM entries)")
            repaired.append(f"removed {dangling_keys} prefix keys of deleted entries")
        else:
            problems.append(
                {"kind": "dangling_prefix_keys", "detail": f"{dangling_keys} prefix keys point to no entry"}
            )
    dangling_sections = q(
        "SELECT count(*) FROM source_sections WHERE entry_id NOT IN (SELECT id FROM entries)"
    ).fetchone()[0]
    if dangling_sections:  # a deposited file's section whose entry is gone: the file is rebuilt on its next deposit
        if repair:
            with lib.write():
                q(
                    "UPDATE sources SET file_sha256 = NULL WHERE id IN (SELECT source_id FROM source_sections "
                    "WHERE entry_id NOT IN (SELECT id FROM entries))"
                )
                q("DELETE FROM source_sections WHERE entry_id NOT IN (SELECT id FROM entries)")
            repaired.append(f"forgot {dangling_sections} sections of deposited files whose entries are gone")
        else:
            problems.append(
                {"kind": "dangling_sections", "detail": f"{dangling_sections} file sections point to no entry"}
            )
    missing_keys = q(
        "SELECT count(*) FROM entries WHERE id NOT IN (SELECT entry_id FROM prefix_keys WHERE full = 1)"
    ).fetchone()[0]
    if missing_keys:
        problems.append({"kind": "missing_prefix_keys", "detail": f"{missing_keys} entries have no prefix keys"})

    for row in q("SELECT id, blob_sha256 FROM entries WHERE blob_sha256 NOT IN (SELECT sha256 FROM blobs)"):
        problems.append(
            {"kind": "dangling_entry", "entry": row[0], "blob": row[1], "detail": "entry points to no blob row"}
        )

    blob_rows = {r[0]: r[1] for r in q("SELECT sha256, coalesce(stored_size, size) FROM blobs")}  # bytes on disk
    referenced = {}
    for eid, sha in q("SELECT id, blob_sha256 FROM entries"):
        referenced.setdefault(sha, []).append(eid)
    on_disk = set(lib.blobs.iter_shas())
    bad_blobs, intact = set(), set()
    for sha, eids in sorted(referenced.items()):
        verdict = None
        if sha not in on_disk:
            reason = "blob missing"
        elif sha in blob_rows and lib.blobs.stored_size(sha) != blob_rows[sha]:
            reason = "blob size mismatch"
        elif check_hashes and (verdict := lib.blobs.verify(sha)) is not None:
            reason = "blob unreadable" if verdict.startswith("unreadable") else "blob hash mismatch"
        else:
            reason = None
            if check_hashes:
                intact.add(sha)
                _check_chunks(lib, sha, problems, repaired, repair)
        if reason:
            bad_blobs.add(sha)
            detail = f"{reason} ({len(eids)} entries)" + (
                f": {verdict.removeprefix('unreadable: ')}" if reason == "blob unreadable" else ""
            )
            problems.append({"kind": reason.replace(" ", "_"), "blob": sha, "entries": eids, "detail": detail})
            if repair and reason != "blob unreadable":  # an OS error this time is not damage: nothing to repair
                lib.mark_damaged(sha, reason)
    for eid, sha, why in list(q("SELECT id, blob_sha256, damaged FROM entries WHERE damaged IS NOT NULL")):
        if sha in bad_blobs:
            continue  # reported above
        if sha in intact and repair:
            with lib.write():
                q("UPDATE entries SET damaged = NULL WHERE id = ?", [eid])
            repaired.append(f"entry #{eid}: blob is intact again, damaged mark cleared")
        else:
            problems.append(
                {
                    "kind": "marked_damaged",
                    "entry": eid,
                    "blob": sha,
                    "detail": f"entry #{eid} is marked damaged: {why}",
                }
            )

    live, stale = _pending(lib, grace_s)
    for sha in sorted(on_disk - set(referenced)):
        if sha not in live:
            reclaimable.append({"kind": "orphan_blob", "blob": sha, "bytes": lib.blobs.stored_size(sha)})
    for sha in sorted(set(blob_rows) - set(referenced) - live):
        reclaimable.append({"kind": "unreferenced_blob_row", "blob": sha})
    for t in _temp_files(lib, grace_s, live):
        reclaimable.append({"kind": "temp_file", "path": str(t.path)})
    for pid in stale:
        reclaimable.append({"kind": "stale_pending", "id": pid})
    if repair and reclaimable:
        r = gc(lib, grace_s)
        repaired.append(
            f"gc: {r['removed_blobs']} orphan blobs, {r['removed_temp_files']} temp files, {r['removed_pending']} "
            "stale pending rows"
        )
        reclaimable = []

    uncompacted = q("SELECT count(*) FROM blobs WHERE canonical IS NOT 1").fetchone()[0]
    return {
        "ok": not problems,
        "problems": problems,
        "reclaimable": reclaimable,
        "repaired": repaired,
        "entries": lib.count(),
        "listed": q(f"SELECT count(*) FROM entries WHERE kind NOT IN {NOT_KNOWLEDGE}").fetchone()[0],
        "blobs_on_disk": len(on_disk),
        "uncompacted": uncompacted,
    }
