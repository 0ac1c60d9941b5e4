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


def test_the_cli_counts_in_words_too():
    """No count in the CLI's or the maintenance words is put before a fixed plural ("1 entries")."""
    import re
    from pathlib import Path

    import kvgraft

    root = Path(kvgraft.__file__).resolve().parent / "app"
    fixed = re.compile(r"\{[^{}]+\} (entries|threads|turns|blobs|manifests|packs)\b")
    found = [
        f"{p.relative_to(root)}: {m.group(0)}"
        for p in sorted(root.rglob("*.py"))
        for m in fixed.finditer(p.read_text())
        if "n_threads" not in m.group(0)  # "2 threads" of the engine's settings is a setting, not a count
    ]
    assert found == []


def test_kvgraft_stats_says_it_in_words():
    from click.testing import CliRunner

    from kvgraft.entry import cli

    r = CliRunner().invoke(cli, ["stats"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("0 entries, 0 blobs, ")
