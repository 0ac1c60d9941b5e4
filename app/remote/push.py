"""`kvgraft push`: publish proven knowledge to a remote (docs/remote-format.md).

Blobs first, manifest last, index after: each blob is checked against its address as it is read
from the library and written once (If-None-Match: *); then the signature (when a key is given) and
the manifest, named by its SHA-256; then the index learns the manifest with If-Match on its ETag,
retried on a lost race, so two pushers never drop each other's entries. A push killed at any
moment leaves a bucket whose every manifest's blobs are present; a manifest it wrote but did not
publish is published by the next push (it lists `manifests/` for manifests the index lacks).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvgraft.app import __version__
from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.packs.export import member_size, stored_checked
from kvgraft.app.remote import WORKERS, in_order
from kvgraft.library.errors import LibraryError, RemoteError
from kvgraft.library.manifest import build_manifest
from kvgraft.library.provenance import now
from kvgraft.library.records import PACK_KINDS, Entry
from kvgraft.library.remote import MANIFEST_ERRORS, RemoteRepo, entry_key
from kvgraft.library.signing import public_identity, sign_manifest


@dataclass
class PushResult:
    pushed: int = 0  # entries published by this push
    skipped: int = 0  # entries the remote already holds
    bytes: int = 0  # blob bytes uploaded (blobs the remote already held are not sent)
    manifests: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)  # manifests an earlier, stopped push left unpublished
    not_pushable: list[dict] = field(default_factory=list)  # [{"entry", "reason"}]

    def as_dict(self) -> dict:
        return asdict(self)


def why_not_pushable(lib, e: Entry) -> str | None:
    """None when `e` may be pushed: knowledge (the kinds packs carry), proven, intact, compacted."""
    if e.kind not in PACK_KINDS:
        return f"a {e.kind!r} entry is made where it is used; only knowledge ({', '.join(PACK_KINDS)}) is pushed"
    if e.damaged:
        return f"damaged ({e.damaged}); repair it first (kvgraft fsck --repair)"
    if not e.proven:
        return "unproven here (never replayed or vouched for); run kvgraft verify --library --replay first"
    if lib.blob_is_canonical(e.blob_sha256) is not True:
        return "its blob is from before compaction; run kvgraft fsck --repair first"
    if lib.engine_info(e.fingerprint) is None or lib.model_record(e.model_sha256 or "") is None:
        return "the engine or model it was made under is not recorded here; run kvgraft verify --library --replay"
    return None


def manifest_keys(manifest) -> list[str]:
    """The entry keys of a parsed manifest (library/remote.py `entry_key`)."""
    return [
        entry_key(manifest.fingerprint, e.kind, e.tokens_sha256, e.blob_sha256, e.question, e.answer)
        for e in manifest.entries
    ]


def _summary(manifest_dict: dict, keys: list[str], signed_by: str | None, stored: dict[str, int]) -> dict:
    return {
        "entries": len(keys),
        "keys": keys,
        "fingerprint": manifest_dict["fingerprint"],
        "model_sha256": manifest_dict["model"]["sha256"],
        "signed_by": signed_by,
        "bytes": sum(stored.values()),
        "published_at": now(),
    }


def named_blobs(repo: RemoteRepo) -> set[str]:
    """The blobs some manifest in the bucket names (published or not; one that does not parse names
    none: verify --remote reports it)."""
    out = set()
    for sha in repo.manifest_shas():
        try:
            _, m, _ = repo.read_manifest(sha)
        except MANIFEST_ERRORS:  # a RemoteError (the bucket out of reach) stops the push instead
            continue
        out.update(e.blob_sha256 for e in m.entries)
    return out


def recover_unpublished(repo: RemoteRepo, index: dict, present: set[str]) -> dict[str, dict]:
    """Summaries of the manifests in the bucket that the index does not publish (a push stopped
    between its manifest and its index update), when each is intact: its bytes hash to its name,
    it parses, and every blob it names is present at its declared size."""
    out = {}
    for sha in sorted(present):
        if sha in index["manifests"]:
            continue
        try:
            _, m, signer = repo.read_manifest(sha)
            stored = {e.blob_sha256: e.blob_stored_size for e in m.entries}
            if any(repo.blobs.stored_size(b) != size for b, size in stored.items()):
                continue  # verify --remote reports it; publishing it would name an absent blob
        except LibraryError:  # MANIFEST_ERRORS, and a RemoteError here: the push below meets it again
            continue
        signer = signer.key_id if signer else None
        out[sha] = _summary(m.raw, manifest_keys(m), signer, stored)
    return out


def push(
    lib,
    repo: RemoteRepo,
    entries: list[Entry],
    sign_key: Path | None = None,
    progress: Progress = no_progress,
    workers: int = WORKERS,
) -> PushResult:
    """Publish `entries`: knowledge only (other kinds are passed over, as an export does), proven (the
    rest are listed in `not_pushable`)."""
    res = PushResult()
    ok = []
    for e in (e for e in entries if e.kind in PACK_KINDS):
        why = why_not_pushable(lib, e)
        if why is None:
            ok.append(e)
        else:
            res.not_pushable.append({"entry": e.id, "reason": why})
    signer = public_identity(sign_key).key_id if sign_key is not None else None
    index, _ = repo.read_index()
    present = set(repo.manifest_shas())
    recovered = recover_unpublished(repo, index, present)
    res.recovered = sorted(recovered)
    # entries count as there only while their manifest is (one deleted from the bucket is pushed again)
    summaries = [v for k, v in index["manifests"].items() if k in present] + list(recovered.values())
    known = {k for summary in summaries for k in summary.get("keys", [])}
    todo, seen = [], set()
    for e in ok:
        key = entry_key(e.fingerprint, e.kind, e.tokens_sha256, e.blob_sha256, e.question, e.answer)
        if key in known or key in seen:
            res.skipped += 1
        else:
            seen.add(key)
            todo.append(e)
    published = {}
    groups: dict[tuple, list[Entry]] = {}
    for e in todo:  # one manifest per engine fingerprint and model, as a pack holds one
        groups.setdefault((e.fingerprint, e.model_sha256), []).append(e)
    for (fp, model_sha), group in groups.items():
        shas = sorted({e.blob_sha256 for e in group})
        stored = {sha: member_size(lib, sha) for sha in shas}
        missing = [e for e in group if stored[e.blob_sha256] is None]
        if missing:
            why = "its blob is missing here; run kvgraft fsck"
            res.not_pushable += [{"entry": e.id, "reason": why} for e in missing]
            group = [e for e in group if stored[e.blob_sha256] is not None]
            stored = {k: v for k, v in stored.items() if v is not None}
            if not group:
                continue
        manifest = build_manifest(group, lib.model_record(model_sha), lib.engine_info(fp), stored, __version__)
        res.bytes += _upload_blobs(lib, repo, group, stored, progress, workers)
        body = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
        msha = hashlib.sha256(body).hexdigest()
        if sign_key is not None:  # the signature first: a published manifest is never seen unsigned
            repo.blobs.put_once(repo.signature_key(msha), sign_manifest(body, sign_key))
        repo.blobs.put_once(repo.manifest_key(msha), body)
        keys = [entry_key(fp, e.kind, e.tokens_sha256, e.blob_sha256, e.question, e.answer) for e in group]
        published[msha] = _summary(manifest, keys, signer, stored)
        res.manifests.append(msha)
        res.pushed += len(group)
    if published or recovered:
        progress("publishing", 0, 1)
        repo.update_index(lambda idx: idx["manifests"].update({**recovered, **published}))
        progress("publishing", 1, 1)
    return res


def _upload_blobs(lib, repo: RemoteRepo, group: list[Entry], stored: dict, progress: Progress, workers: int) -> int:
    """Every blob of `group` onto the remote (those it holds at the same size are not sent); the bytes sent.

    A blob the remote holds at another size is replaced only when no manifest in the bucket names it:
    a put cut off mid-body (a killed push) on a server that kept what it received. One a manifest names
    is damage a pull would meet: the push stops and says so."""
    by_sha = {e.blob_sha256: e for e in group}
    items = sorted(by_sha.items())
    lock, named = threading.Lock(), []

    def is_named(sha: str) -> bool:
        with lock:  # read every manifest once, and only when a damaged blob is met
            if not named:
                named.append(named_blobs(repo))
            return sha in named[0]

    def one(item) -> int:
        sha, e = item
        have = repo.blobs.stored_size(sha)
        if have is not None and have != stored[sha]:
            if is_named(sha):
                raise RemoteError(
                    f"remote {repo.spec.name!r} holds blob {sha[:16]}... at {have:,} bytes, not {stored[sha]:,}, and "
                    "a manifest names it: it is damaged there and such a blob is never overwritten; run kvgraft "
                    "verify --remote"
                )
            repo.blobs.remove_damaged(sha, stored[sha])  # a stopped push's cut-off put: sent again below
            have = None
        if have is not None:
            return 0
        data = stored_checked(lib, e, stored[sha])  # checked against its address as it is read
        if repo.blobs.add_stored(sha, data):
            return len(data)
        if repo.blobs.stored_size(sha) != len(data):  # someone else's write: there, and whole?
            raise RemoteError(
                f"remote {repo.spec.name!r}: blob {sha[:16]}... was written by another pusher meanwhile and is not "
                "there whole; run kvgraft verify --remote, then push again"
            )
        return 0

    sent = [0]

    def take(k: int, n: int) -> None:
        sent[0] += n
        progress("blobs", k + 1, len(items))

    in_order(one, items, workers, "push", take)  # stopped early: no manifest is written
    return sent[0]
