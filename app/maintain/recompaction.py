"""Compacting blobs stored before compaction: re-address them by their canonical bytes.

Before compaction a blob's address was the SHA-256 of llama.cpp's bytes as written. This converts
each such blob (index rows with `canonical` not 1): read it (full SHA-256 check), walk its layout,
zero its dead sliding-window cells (engine/compaction.py, with the window read from the model's
GGUF), store the compact container, and in one transaction re-point its entries, record the old
address in `blob_aliases` and drop the old row; then the old file goes. A kill at any point leaves
either the old blob and its entries untouched or the new ones committed (an orphan file at worst,
which gc reclaims). Entry receipts (the logits after a graft) stay true: a canonical graft gives
the same logits bit for bit (tests/test_compaction.py), and `kvgraft verify --receipts --check` of
a receipt made before compaction compares its hashes with the old address and the raw replay.

Runs from `kvgraft fsck --repair`; it needs no llama.cpp, only the model file's GGUF header.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Callable

from kvgraft.app.core.gguf_check import NotAModel, inspect_gguf
from kvgraft.engine.compaction import WindowSpec, canonicalize
from kvgraft.engine.errors import SnapshotError
from kvgraft.engine.state import parse_state
from kvgraft.library.errors import BlobCorrupt, BlobMissing, BlobUnreadable
from kvgraft.library.library import Library

log = logging.getLogger(__name__)

# model sha256 -> (n_swa, architecture), or None when that model is not available here
WindowLookup = Callable[[str | None], "tuple[int, str] | None"]


def local_windows(candidates: list[Path] | None = None) -> WindowLookup:
    """A lookup over the model files on this machine (the embedded model unless told otherwise)."""
    from kvgraft.app.core.model_store import ModelStoreError, embedded_model_path, model_sha256

    found: dict[str, tuple[int, str]] = {}
    try:
        paths = candidates if candidates is not None else [embedded_model_path()]
    except ModelStoreError as exc:
        log.warning("no model file to read the sliding window from: %s", exc)
        paths = []
    for path in paths:
        try:
            info = inspect_gguf(path)
            found[model_sha256(path)] = (info["sliding_window"], info["architecture"])
        except (NotAModel, ModelStoreError, OSError) as exc:
            log.warning("cannot read %s: %s", path, exc)
    return lambda sha: found.get(sha) if sha else None


def uncompacted(lib: Library) -> list[tuple[str, int]]:
    return lib.uncompacted_blobs()


def compact_blob(lib: Library, sha: str, size: int, window: WindowLookup) -> dict:
    """Convert one pre-compaction blob; returns what happened (converted / skipped with the reason)."""
    rows = lib.blob_users(sha)
    if not rows:
        return {"blob": sha, "skipped": "no entry uses it (gc reclaims it)"}
    models = {r[1] for r in rows}
    found = window(next(iter(models))) if len(models) == 1 else None
    if found is None:
        return {"blob": sha, "skipped": "its model file is not available here to read the sliding window from"}
    try:
        data = lib.blobs.read_verified(sha, size)
        parsed = parse_state(data)
    except (BlobMissing, BlobCorrupt, BlobUnreadable, SnapshotError) as exc:
        return {"blob": sha, "skipped": f"unreadable, left for fsck to report: {exc}"}
    spec = WindowSpec.for_model(found[0], found[1], len(parsed.layout.caches))
    ranges = canonicalize(data, parsed, spec)
    new = hashlib.sha256(data).hexdigest()
    stored = lib.replace_blob(sha, data, new, elide=ranges)  # the library's one blob lifecycle
    return {
        "blob": sha,
        "sha256": new,
        "entries": [r[0] for r in rows],
        "bytes_before": size,
        "bytes_after": stored.stored_size,
    }


def compact_library(
    lib: Library, window: WindowLookup | None = None, progress: Callable[[int, int], None] | None = None
) -> dict:
    """Convert every pre-compaction blob. Returns counts, bytes before/after and what was skipped."""
    todo = uncompacted(lib)
    if not todo:
        return {"converted": 0, "skipped": [], "bytes_before": 0, "bytes_after": 0}
    window = window or local_windows()
    done, skipped, before, after = 0, [], 0, 0
    for k, (sha, size) in enumerate(todo):
        res = compact_blob(lib, sha, size, window)
        if "skipped" in res:
            skipped.append(res)
        else:
            done += 1
            before += res["bytes_before"]
            after += res["bytes_after"]
        if progress:
            progress(k + 1, len(todo))
    return {"converted": done, "skipped": skipped, "bytes_before": before, "bytes_after": after}
