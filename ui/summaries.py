"""The words the window shows for what the worker reports: an import's and a verify's summary."""

from __future__ import annotations

from pathlib import Path

from kvgraft.app.core.words import counted


def import_summary(s: dict) -> str:
    """`ImportSummary.as_dict()` (app/ingest/import_files.py) in lines for people."""
    lines = [f"imported: {counted(s['imported'], 'entry')}", f"skipped as duplicates: {s['skipped']}"]
    for d in s.get("documents", []):
        what = "unchanged" if d["unchanged"] else f"{d['sections']} section" + ("s" if d["sections"] != 1 else "")
        lines.append(f"document {Path(d['file']).name} ({d['title']}): {what}")
    if s.get("replayed"):
        lines.append(f"proved by replay here: {counted(s['replayed'], 'entry')} ({s['replay_s']:.1f} s)")
    if s.get("unproven"):
        lines.append(f"unproven (never grafted until verified by replay): {s['unproven']}")
    lines += [f"refused {Path(x['file']).name}: {x['reason']}" for x in s["refused"]]
    return "\n".join(lines)


def verify_summary(out: dict) -> str:
    """A verify's receipts (app/verify/batch.py): every check passed, or the failures one a line."""
    if not out["ok"]:
        return "\n".join(f"{f['entry']}: {f['check']}" for f in out["failures"])
    unproven = out.get("unproven", 0)
    return f"{counted(out['entries'], 'entry')}: every check that ran passed" + (
        f"; {unproven} unproven (not grafted, no answer check: replay proves them)" if unproven else ""
    )
