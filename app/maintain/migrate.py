"""Moving the library onto a new engine: every entry made under this engine's predecessor, proven again here.

When the engine's fingerprint changes (the batch-invariant build: docs/exact-graft.md), entries stored
under the old one are "another engine": never grafted. Relabelling them in bulk would be a claim nobody
checked: the old build made the same bits only in calls of 8+ rows, and a thread's replies were decoded
a token at a time. So each entry is computed again from its tokens on this engine (one prefill when the
engine is batch-invariant, else in the entry's recorded schedule), its probe decoded after it fresh and
after a graft of the new state, and only when the two logits are bit-identical is the entry moved: to
the new state (the same blob when the bits did not change), proof "replayed", the new receipt. An entry
whose tokens are not its text's, or whose graft check differs, stays where it is and is reported.

Which entries: those of this model under the fingerprints earlier versions of kvgraft used for this
engine (`predecessors`: recorded in the library's engines table, which every version fills when it
opens the library, with an older fingerprint version and this engine's config; or
`Engine.legacy_fingerprint`, from before that table).
`kvgraft migrate` runs it; `kvgraft doctor` and the window say how many are left.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from kvgraft.app.proof.replay import expected_tokens
from kvgraft.app.service import LibraryService
from kvgraft.engine.errors import EngineError
from kvgraft.library.errors import LibraryError
from kvgraft.library.records import REPLAYED, TRANSCRIPT_KINDS, Entry
from kvgraft.library.tokens import tokens_sha256

log = logging.getLogger(__name__)

MIGRATED = "library migrate"  # what a migrated entry's receipt says made it


def predecessors(engine, library=None) -> list[str]:
    """The fingerprints earlier versions of kvgraft stored this engine's entries under: the ones the library
    recorded (its `engines` table) with an older fingerprint version and this engine's bit-deciding config,
    and this engine's version-1 fingerprint (which hashed the CPU feature string)."""
    config = {
        k: v for k, v in engine.fingerprint_info.items() if k not in ("fingerprint_version", "probe", "n_threads")
    }
    found = {engine.legacy_fingerprint}
    for fp, info in (library.engines() if library is not None else {}).items():
        older = info.get("fingerprint_version", 1) < engine.fingerprint_info["fingerprint_version"]
        if older and all(info.get(k) == v for k, v in config.items()):
            found.add(fp)
    found.discard(engine.fingerprint)
    return sorted(found)


def pending(service: LibraryService) -> list[Entry]:
    """Entries left to migrate onto this engine, oldest first."""
    engine = service.engine
    return service.library.entries_under(predecessors(engine, service.library), engine.model.info.sha256)


def pending_count(engine, home=None) -> int:
    """How many entries of the library in `home` are left to migrate (0 where there is no library yet:
    none is created to say so)."""
    from kvgraft.app.core.paths import data_dir
    from kvgraft.app.service import open_library

    if not (data_dir(home) / "index.db").is_file():
        return 0
    with open_library(home) as lib:
        return lib.count_under(predecessors(engine, lib), engine.model.info.sha256)


@dataclass
class MigrationReport:
    pending: int = 0  # entries that were left to migrate when it started
    left: int = 0  # and when it ended
    moved: list[int] = field(default_factory=list)  # entries now under this engine
    same_bits: list[int] = field(default_factory=list)  # of those, the state computed here was the stored one
    refused: dict[int, str] = field(default_factory=dict)  # entry id -> why it stayed
    owners: dict = field(default_factory=dict)  # threads and deposited files moved with their entries

    def as_dict(self) -> dict:
        refused = {str(k): v for k, v in self.refused.items()}
        return {
            "moved": self.moved,
            "same_bits": self.same_bits,
            "refused": refused,
            "owners": self.owners,
            "left": self.left,
        }


def _tokens(engine, e: Entry) -> list[int]:
    tokens = e.tokens
    if len(tokens) != e.n_tokens or tokens_sha256(tokens) != e.tokens_sha256:
        raise ValueError("its stored tokens do not match their hash")
    if e.kind not in TRANSCRIPT_KINDS and tokens != expected_tokens(engine.model, e.kind, e.text, e.question):
        raise ValueError("its tokens are not its text's on this model")
    return tokens


def migrate_entry(service: LibraryService, e: Entry) -> tuple[Entry, bool]:
    """Compute `e`'s state here, check a graft of it against the fresh run, and move the entry.
    Returns (the moved entry, whether its stored bits were already this engine's). Raises ValueError,
    EngineError or LibraryError when it stays."""
    engine = service.engine
    tokens = _tokens(engine, e)
    # a deposit's reference run: fresh prefill (one, the engine being invariant; else the entry's recorded
    # schedule), snapshot, probe, then the probe again after a graft of that snapshot
    schedule = None if engine.batch_invariant else e.schedule
    ref = service.reference_run(tokens, e.kind, e.question, None, text=e.text, schedule=schedule, computed=MIGRATED)
    r = ref.receipt
    if not r.equal:
        raise EngineError(
            "a graft of its state gives other logits than the fresh run "
            f"({r.graft_logits_sha256[:12]} vs {r.fresh_logits_sha256[:12]})"
        )
    moved = service.library.migrate_entry(
        e, ref.snap.data, ref.snap.sha256, ref.snap.elided, engine.fingerprint, REPLAYED, r.as_dict()
    )
    return moved, ref.snap.sha256 == e.blob_sha256


def migrate(
    service: LibraryService, on_progress: Callable[[int, int, Entry], None] | None = None, limit: int | None = None
) -> MigrationReport:
    """Migrate every pending entry (or the first `limit`); `on_progress(done, total, entry)` after each."""
    old = predecessors(service.engine, service.library)
    todo = service.library.entries_under(old, service.engine.model.info.sha256)
    report = MigrationReport(pending=len(todo))
    todo = todo[:limit] if limit is not None else todo
    for k, e in enumerate(todo):
        try:
            _moved, same = migrate_entry(service, e)
            report.moved.append(e.id)
            if same:
                report.same_bits.append(e.id)
        except (ValueError, EngineError, LibraryError) as exc:
            report.refused[e.id] = str(exc)
            log.warning("entry #%d not migrated: %s", e.id, exc)
        if on_progress is not None:
            on_progress(k + 1, len(todo), e)
    report.owners = service.library.migrate_owners(old, service.engine.fingerprint)
    report.left = service.library.count_under(old, service.engine.model.info.sha256)
    return report
