"""Import files into the library: the one use case behind `kvgraft import` and a drop on the window.

A `.kvpack` is imported whole or refused (app/packs/imports.py: checked completely, unsigned entries
replayed before anything is written); a `.jsonl` problem file is built here (each verified
problem deposited as a solution; already stored ones are skipped); a document (`.txt`, `.md`,
`.markdown`, `.rst`, `.text`, `.pdf`) is deposited (app/ingest/documents.py: verbatim, or in sections
when longer than the context). Any other suffix is read as a pack, so a file with none (`/etc/hostname`)
is refused as "not a valid zip archive", never deposited. A refused file does not stop the others;
cancelling (the progress callback raising Cancelled) stops at once, and the pack or document being
imported then has changed nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.ingest.documents import DOCUMENT_SUFFIXES, FileDeposit, deposit_file
from kvgraft.app.packs.imports import import_pack
from kvgraft.app.packs.results import PackImport
from kvgraft.app.proof.problems import read_jsonl
from kvgraft.app.service import LibraryService
from kvgraft.engine.errors import Cancelled, EngineError
from kvgraft.library.errors import LibraryError

PROBLEM_FILES = (".jsonl",)


@dataclass(frozen=True)
class Refusal:
    file: str
    reason: str


@dataclass(frozen=True)
class FileImport:
    """What one file gave: a pack's import (app/packs/imports.import_pack), a document's deposit, or a
    problem file's counts."""

    file: str
    kind: str  # "pack", "problems" or "document"
    imported: int
    skipped: int
    detail: PackImport | FileDeposit | None  # a pack's import, a document's deposit; None for a problem file


@dataclass
class ImportSummary:
    imported: int = 0
    skipped: int = 0
    replayed: int = 0
    replay_s: float = 0.0
    unproven: int = 0
    files: list[FileImport] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The JSON contract of `kvgraft import --json` (keys are kept; more may be added)."""
        return {
            "imported": self.imported,
            "skipped": self.skipped,
            "refused": [{"file": r.file, "reason": r.reason} for r in self.refused],
            "replayed": self.replayed,
            "replay_s": round(self.replay_s, 3),
            "unproven": self.unproven,
            "documents": [
                {
                    "file": f.file,
                    "title": f.detail.title,
                    "sections": len(f.detail.entries),
                    "unchanged": f.detail.unchanged,
                }
                for f in self.files
                if f.kind == "document"
            ],
        }


def import_files(
    service: LibraryService,
    paths: Sequence[Path | str],
    *,
    progress: Progress = no_progress,
    rebuild: bool = False,
    require_signed: bool = False,
    replay: bool = True,
    on_file: Callable[[FileImport | Refusal], None] | None = None,
) -> ImportSummary:
    """Import each file; `on_file` hears of each as it is done (imported or refused)."""
    summary = ImportSummary()
    for k, raw in enumerate(paths):
        path = Path(raw)
        try:
            if path.suffix.lower() in PROBLEM_FILES:
                done = _build_problems(service, path, progress)
            elif path.suffix.lower() in DOCUMENT_SUFFIXES:
                fd = deposit_file(service, path, progress=progress)
                made = sum(fd.created)
                done = FileImport(str(path), "document", made, len(fd.entries) - made, fd)
            else:
                res = import_pack(
                    service,
                    path,
                    rebuild=rebuild,
                    progress=lambda stage, d, t, name=path.name: progress(f"{name}: {stage}", d, t),
                    require_signed=require_signed,
                    replay=replay,
                )
                done = FileImport(str(path), "pack", res.imported, res.skipped, res)
        except Cancelled:
            raise
        except (LibraryError, EngineError, OSError, ValueError) as exc:  # this file is refused, the others go on
            refusal = Refusal(str(path), str(exc) or type(exc).__name__)
            summary.refused.append(refusal)
            progress("files", k + 1, len(paths))  # before the refusal is told: nothing is printed after it
            if on_file:
                on_file(refusal)
        else:
            summary.files.append(done)
            summary.imported += done.imported
            summary.skipped += done.skipped
            if isinstance(done.detail, PackImport):
                summary.replayed += done.detail.replayed
                summary.replay_s += done.detail.replay_s
                summary.unproven += done.detail.unproven
            progress("files", k + 1, len(paths))
            if on_file:
                on_file(done)
    return summary


def _build_problems(service: LibraryService, path: Path, progress: Progress) -> FileImport:
    problems = read_jsonl(path)
    imported = skipped = 0
    for i, prob in enumerate(problems):
        res = service.deposit_solution(prob.question, prob.solution, prob.answer, checker=prob.checker)
        if res.created:
            imported += 1
        else:
            skipped += 1
        progress(f"building {path.name}", i + 1, len(problems))
    return FileImport(str(path), "problems", imported, skipped, None)
