"""Disk given back: a delete frees its blobs at once, gc takes what no thread or entry needs (the window's
Delete and "Give back disk", `kvgraft rm` and `kvgraft gc`)."""

from __future__ import annotations

from kvgraft.library.library import Library
from kvgraft.library.maintenance import free_blobs, gc


def remove_entries(library: Library, ids) -> dict:
    """Remove the entries (a solution takes its answer-ready state along) and free the blobs nothing else uses."""
    removed = library.remove_all([int(i) for i in ids])
    return {"entries": len(removed), "removed": removed, **free_blobs(library)}


def collect(library: Library) -> dict:
    return gc(library)
