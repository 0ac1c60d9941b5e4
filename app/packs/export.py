"""Write `.kvpack` files: export library entries (blobs read back and checked), or build one from a JSONL
source pack."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kvgraft.app import __version__
from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.packs.results import PackExport
from kvgraft.app.proof.problems import read_jsonl
from kvgraft.app.service import LibraryService
from kvgraft.library import container
from kvgraft.library.pack import PackError, build_manifest, pack_sha256, write_pack
from kvgraft.library.records import PACK_KINDS, Entry
from kvgraft.library.signing import public_identity


def export_pack(service_or_library, entries: list[Entry], path: Path, sign_key: Path | None = None) -> PackExport:
    """Write `entries` (one fingerprint) to a pack; blobs are read from the library and checked."""
    lib = getattr(service_or_library, "library", service_or_library)
    entries = [e for e in entries if e.kind in PACK_KINDS]  # answer-ready states are made where they are used
    if not entries:
        raise PackError("nothing to export: no entries selected")
    fps = {e.fingerprint for e in entries}
    if len(fps) > 1:
        raise PackError(f"the selected entries were made under {len(fps)} engine fingerprints; export one at a time")
    damaged = [e.id for e in entries if e.damaged]
    if damaged:
        raise PackError(f"entries {damaged} are damaged; repair or rebuild them before exporting")
    unproven = [e.id for e in entries if not e.proven]
    if unproven:
        raise PackError(
            f"entries {unproven} are unproven here (their states were never replayed or vouched for); "
            "run kvgraft verify --library --replay first, or leave them out"
        )
    engine_info = lib.engine_info(entries[0].fingerprint)
    if engine_info is None:
        raise PackError(
            "the engine these entries were made under is not recorded in this library (made by an older "
            "kvgraft?); run kvgraft verify --library --replay to record it, then export"
        )
    shas = sorted({e.blob_sha256 for e in entries})
    old = [sha for sha in shas if lib.blob_is_canonical(sha) is not True]
    if old:
        raise PackError(
            f"{len(old)} of the selected blobs are from before compaction; run kvgraft fsck --repair to compact "
            "them, then export"
        )
    models = {e.model_sha256 for e in entries}
    model = lib.model_record(next(iter(models))) if len(models) == 1 and None not in models else None
    if model is None:
        raise PackError("the selected entries do not name one known model")
    manifest = build_manifest(entries, model, engine_info, {sha: member_size(lib, sha) for sha in shas}, __version__)
    by_sha = {e.blob_sha256: e for e in entries}
    declared = {item["blob_sha256"]: item["blob_stored_size"] for item in manifest["entries"]}
    size = write_pack(
        path,
        manifest,
        ((sha, lambda e=e: stored_checked(lib, e, declared[e.blob_sha256])) for sha, e in by_sha.items()),
        sign_key=sign_key,
    )
    return PackExport(
        file=str(path),
        entries=len(entries),
        blobs=len(by_sha),
        bytes=size,
        sha256=pack_sha256(path),
        signed_by=public_identity(sign_key).key_id if sign_key else None,
    )


def member_size(lib, sha: str) -> int | None:
    """The pack member's size: the stored container, or a plain file (a blob with nothing to elide
    kept in the form it had before compaction) plus the header that makes it one."""
    try:
        with open(lib.blobs.path(sha), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            return size if container.is_container(fh.read(4)) else size + container.HEAD_SIZE
    except OSError:
        return None  # reported by the export's read of the blob


def stored_checked(lib, e: Entry, declared: int) -> bytes:
    """The entry's blob as a compact container (as stored, or a plain file wrapped in a header
    that elides nothing), after checking it decodes to its address."""
    try:
        data = lib.blobs.stored_bytes(e.blob_sha256)
        if not container.is_container(data):
            data = container.make(len(data), []).header + data
        c = container.parse_header(data, stored_size=len(data))
    except FileNotFoundError as exc:
        raise PackError(f"entry #{e.id}: its blob is missing; run kvgraft fsck") from exc
    except OSError as exc:
        raise PackError(f"entry #{e.id}: its blob cannot be read: {exc.strerror or exc}") from exc
    except container.ContainerError as exc:
        raise PackError(f"entry #{e.id}: its blob is damaged ({exc}); run kvgraft fsck") from exc
    if c.size != e.blob_size or hashlib.sha256(container.decode(data, c)).hexdigest() != e.blob_sha256:
        lib.mark_damaged(e.blob_sha256, "blob hash mismatch")
        raise PackError(f"entry #{e.id}: its blob does not match its SHA-256 (damaged); run kvgraft fsck")
    if len(data) != declared:
        raise PackError(f"entry #{e.id}: its blob changed while it was being exported; export again")
    return data


def build_pack(
    service: LibraryService, jsonl: Path, out: Path, progress: Progress = no_progress, vouched_by: str | None = None
) -> PackExport:
    """Deposit each {question, solution, answer} of a JSONL source pack and export exactly those entries.

    A JSONL's answers are stated by its author: nothing here checks them, so they are stored as
    stated unless the caller vouches for them (`vouched_by`: the demo's generator computed its own). Every
    problem is read and its checker name checked (`read_jsonl`) before the first deposit."""
    try:
        problems = read_jsonl(jsonl)
    except (OSError, ValueError) as exc:  # UnknownChecker is a ValueError naming the file and line
        raise PackError(str(exc)) from exc
    entries = []
    for i, p in enumerate(problems):
        res = service.deposit_solution(p.question, p.solution, p.answer, checker=p.checker, vouched_by=vouched_by)
        entries.append(res.entry)
        progress("deposit", i + 1, len(problems))
    return export_pack(service, entries, out)
