"""Counts in words (app/core/words.py): the window never says "1 entries" or "1 threads"."""

from kvgraft.app.core.words import counted
from kvgraft.app.maintain.repair import RepairReport


def test_one_is_singular_and_every_other_count_plural():
    assert [counted(n, "entry") for n in (0, 1, 2, 1234)] == ["0 entries", "1 entry", "2 entries", "1,234 entries"]
    assert [counted(1, w) for w in ("thread", "turn", "blob")] == ["1 thread", "1 turn", "1 blob"]
    assert [counted(2, w) for w in ("thread", "key", "pass")] == ["2 threads", "2 keys", "2 passes"]


def test_check_and_repair_says_what_its_count_holds_beside_the_library_table():
    report = {"ok": True, "problems": [], "reclaimable": [], "repaired": [], "uncompacted": 0}
    lines = RepairReport({**report, "entries": 9, "listed": 1, "blobs_on_disk": 9}).lines()
    assert lines[-1] == "9 entries in the index (1 in the library table), 9 blobs: ok"
    assert RepairReport({**report, "entries": 1, "listed": 1, "blobs_on_disk": 1}).lines()[-1] == (
        "1 entry in the index, 1 blob: ok"
    )
