"""Check the library and repair what is safe: the use case behind `kvgraft fsck [--repair]` and
the window's File > Check and repair library.

Repair compacts blobs stored before compaction (app/maintain/recompaction.py: needs the model file, for
its window), then lets library/maintenance.py reclaim leftovers of interrupted writes, fix index
rows and mark damage. Without `repair` nothing is changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.core.words import counted
from kvgraft.app.maintain.recompaction import compact_library
from kvgraft.library.library import Library
from kvgraft.library.maintenance import fsck


def _listed(r: dict) -> str:
    """What of the index's entries the library table lists (the rest are answer-ready, thread and cache
    states), where the report says."""
    listed = r.get("listed")
    return "" if listed is None or listed == r["entries"] else f" ({listed:,} in the library table)"


@dataclass(frozen=True)
class RepairReport:
    report: dict  # fsck's report: ok, problems, reclaimable, repaired, entries, blobs_on_disk, uncompacted, ...

    @property
    def ok(self) -> bool:
        return bool(self.report["ok"])

    def as_dict(self) -> dict:
        """The JSON contract of `kvgraft fsck --json`."""
        return self.report

    def lines(self) -> list[str]:
        """The report in plain words, one finding a line, the verdict last."""
        r = self.report
        out = [f"problem: {p['detail']}" + (f" [{p['blob'][:16]}...]" if p.get("blob") else "") for p in r["problems"]]
        out += [f"reclaimable: {x['kind']} {x.get('blob') or x.get('path') or x.get('id')}" for x in r["reclaimable"]]
        out += [f"repaired: {x}" for x in r["repaired"]]
        out.append(
            f"{counted(r['entries'], 'entry')} in the index{_listed(r)}, {counted(r['blobs_on_disk'], 'blob')}: "
            + ("ok" if r["ok"] else f"{len(r['problems'])} problems")
        )
        if r["uncompacted"]:
            out.append(
                f"{counted(r['uncompacted'], 'blob')} from before compaction ("
                + (
                    "their model file is not here"
                    if r.get("compacted") is not None
                    else "run kvgraft fsck --repair to compact them"
                )
                + ")"
            )
        return out


def check_library(
    lib: Library, *, repair: bool = False, quick: bool = False, progress: Progress = no_progress
) -> RepairReport:
    compacted = None
    if repair and lib.uncompacted_blobs():
        compacted = compact_library(lib, progress=lambda done, total: progress("compact", done, total))
    res = fsck(lib, repair=repair, check_hashes=not quick)
    if compacted is not None:
        res["compacted"] = compacted
        res["repaired"].append(
            f"compacted {counted(compacted['converted'], 'blob')} from before compaction: "
            f"{compacted['bytes_before'] / 1e6:,.1f} MB -> {compacted['bytes_after'] / 1e6:,.1f} MB"
        )
        for sk in compacted["skipped"]:
            res["repaired"].append(f"not compacted: blob {sk['blob'][:16]}...: {sk['skipped']}")
    return RepairReport(res)
