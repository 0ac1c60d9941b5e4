"""The team library's use cases by remote name, as the CLI and the window call them."""

from __future__ import annotations

from pathlib import Path

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.remote.check import RemoteCheck, verify_remote
from kvgraft.app.remote.pull import PullResult, pull
from kvgraft.app.remote.push import PushResult, push, why_not_pushable
from kvgraft.app.service import LibraryService
from kvgraft.library.errors import LibraryError, RemoteError
from kvgraft.library.remote import MANIFEST_ERRORS, RemoteRepo, RemoteSpec, parse_url
from kvgraft.library.remote_cache import RemoteCacheStore, gc_cache


def spec_dict(s: RemoteSpec) -> dict:
    return {"name": s.name, "url": s.url, "bucket": s.bucket, "prefix": s.prefix, "endpoint_url": s.endpoint_url}


def add_checked(lib, name: str, url: str, endpoint_url: str | None = None) -> dict:
    """Add a remote once its bucket answers with these credentials (a bucket is never created)."""
    bucket, prefix = parse_url(url)
    RemoteRepo(RemoteSpec(name, bucket, prefix, endpoint_url)).blobs.check_reachable()
    return {**spec_dict(lib.remotes.add(name, url, endpoint_url)), "reachable": True}


def remotes(lib) -> list[dict]:
    return [spec_dict(s) for s in lib.remotes.list()]


def forget(lib, name: str) -> None:
    lib.remotes.remove(name)


def push_named(
    lib,
    name: str,
    ids: list[int] | None = None,
    query: str | None = None,
    sign_key: Path | None = None,
    progress: Progress = no_progress,
) -> PushResult:
    """Push entries by id (each must be pushable, or nothing is pushed), by search, or all (None, None)."""
    spec = lib.remotes.get(name)
    if ids:
        entries = [lib.get(i) for i in ids]
        bad = [(e.id, why) for e in entries if (why := why_not_pushable(lib, e))]
        if bad:
            raise LibraryError("; ".join(f"entry {i}: {why}" for i, why in bad) + "; nothing was pushed")
    elif query:
        entries = lib.search(query, limit=1_000_000)
    else:
        entries = lib.entries()
    return push(lib, RemoteRepo(spec), entries, sign_key=sign_key, progress=progress)


def pull_named(
    service: LibraryService, name: str, require_signed: bool = False, progress: Progress = no_progress
) -> PullResult:
    return pull(
        service, RemoteRepo(service.library.remotes.get(name)), require_signed=require_signed, progress=progress
    )


def verify_named(lib, name: str, progress: Progress = no_progress) -> RemoteCheck:
    return verify_remote(RemoteRepo(lib.remotes.get(name)), trust_store(lib.root), progress=progress)


def gc_cache_named(lib, name: str, older_than_s: float, grace_s: float, budget_bytes: int | None = None) -> dict:
    """`kvgraft remote gc NAME`: a fleet's cache records older than `older_than_s` removed (and the oldest
    past `budget_bytes` of blobs), then the blobs nothing names (library/remote_cache.py `gc_cache`). Every
    manifest is read first: its blobs are never removed, and a manifest that cannot be read stops the gc
    before anything is deleted."""
    repo = RemoteRepo(lib.remotes.get(name))
    knowledge: set[str] = set()
    for sha in repo.manifest_shas():
        try:
            _, m, _ = repo.read_manifest(sha)
        except MANIFEST_ERRORS as exc:
            raise RemoteError(
                f"remote {name!r}: manifest {sha[:16]}... cannot be read ({exc}): nothing removed"
            ) from exc
        knowledge |= {e.blob_sha256 for e in m.entries}
    return {
        "remote": name,
        **gc_cache(RemoteCacheStore(repo.spec, repo.blobs.client), knowledge, older_than_s, grace_s),
    }
