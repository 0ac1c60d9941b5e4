"""`kvgraft verify --remote NAME`: check a remote in place, with no model loaded.

Every manifest in the bucket (published in the index or not) must hash to its name, parse, and,
when signed, carry a signature that verifies; every cache record (a fleet's shared prompt cache) must
parse, be signed and lie at its own key; every blob a manifest or a record names must be present at its
declared size and its canonical bytes must hash to its name; every manifest the index publishes
must exist. Problems fail the check. A manifest the index does not publish yet (a push stopped
before it published it: the next push does) and a blob no manifest names (a push stopped before
its manifest) are notes: neither is named by anything a pull reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.core.words import counted
from kvgraft.app.remote import WORKERS, in_order
from kvgraft.app.remote.push import manifest_keys
from kvgraft.library import container
from kvgraft.library.errors import BlobCorrupt, BlobMissing
from kvgraft.library.remote import MANIFEST_ERRORS, RemoteRepo
from kvgraft.library.remote_cache import RecordError, RemoteCacheStore, read_record
from kvgraft.library.signing import SigningError, TrustStore

MAX_BLOB = 8 << 30  # no state this kvgraft makes is near it; a larger declaration is refused unread


@dataclass
class RemoteCheck:
    remote: str
    manifests: int = 0
    entries: int = 0
    blobs: int = 0
    cache_records: int = 0  # a fleet's shared cache states (library/remote_cache.py)
    bytes: int = 0
    signed: dict = field(default_factory=dict)  # key id -> manifests it signed
    problems: list[dict] = field(default_factory=list)  # [{"object", "problem"}]
    notes: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "remote": self.remote,
            "manifests": self.manifests,
            "entries": self.entries,
            "blobs": self.blobs,
            "cache_records": self.cache_records,
            "bytes": self.bytes,
            "signed": self.signed,
            "problems": self.problems,
            "notes": self.notes,
        }


def verify_remote(
    repo: RemoteRepo, trust: TrustStore | None = None, progress: Progress = no_progress, workers: int = WORKERS
) -> RemoteCheck:
    out = RemoteCheck(repo.spec.name)
    index, _ = repo.read_index()
    in_bucket = set(repo.manifest_shas())
    for sha in sorted(set(index["manifests"]) - in_bucket):
        out.problems.append({"object": repo.manifest_key(sha), "problem": "published in the index but absent"})
    for sha in sorted(in_bucket - set(index["manifests"])):
        out.notes.append(
            {"object": repo.manifest_key(sha), "note": "not published in the index yet (the next push publishes it)"}
        )
    named: dict[str, tuple[int, int]] = {}  # blob -> (stored size, canonical size)
    for k, sha in enumerate(sorted(in_bucket)):
        progress("manifests", k, len(in_bucket))
        key = repo.manifest_key(sha)
        try:
            _, m, signer = repo.read_manifest(sha)
        except SigningError as exc:
            out.problems.append({"object": repo.signature_key(sha), "problem": f"signature does not verify: {exc}"})
            continue
        except MANIFEST_ERRORS as exc:
            out.problems.append({"object": key, "problem": str(exc)})
            continue
        if signer is not None:
            kid = signer.key_id
            out.signed[kid] = out.signed.get(kid, 0) + 1
            if trust is not None and trust.name_of(kid) is not None:
                out.notes.append({"object": key, "note": f"signed by {kid} ({trust.name_of(kid)}, trusted here)"})
        published = index["manifests"].get(sha)
        if published is not None and published.get("keys") != manifest_keys(m):
            out.problems.append({"object": key, "problem": "the index lists other entries for it than it holds"})
        out.manifests += 1
        out.entries += len(m.entries)
        for e in m.entries:
            declared = (e.blob_stored_size, e.blob_size)
            if named.setdefault(e.blob_sha256, declared) != declared:
                out.problems.append(
                    {
                        "object": key,
                        "problem": f"declares blob {e.blob_sha256[:16]}... at sizes another entry contradicts",
                    }
                )
    progress("manifests", len(in_bucket), len(in_bucket))
    _check_cache_records(repo, out, named)

    def one(item):
        sha, (stored, size) = item
        if stored > MAX_BLOB or size > container.MAX_EXPANSION * stored + (1 << 20):
            return sha, f"declared at {stored:,} bytes ({size:,} decoded): implausible, not read", 0
        try:
            data = repo.blobs.get_stored(sha, limit=stored)
        except BlobMissing:
            return sha, "named by a manifest but absent", 0
        except BlobCorrupt as exc:
            return sha, str(exc), 0
        if len(data) != stored:
            return sha, f"{len(data):,} bytes, the manifest says {stored:,}", len(data)
        try:
            container.decode_checked(data, sha, expected_size=size)
        except BlobCorrupt as exc:
            return sha, str(exc), len(data)
        return sha, None, len(data)

    items = sorted(named.items())

    def take(k: int, result) -> None:
        sha, why, n = result
        out.bytes += n
        if why is not None:
            out.problems.append({"object": repo.blobs.key(sha), "problem": why})
        progress("blobs", k + 1, len(items))

    in_order(one, items, workers, "verify", take)
    out.blobs = len(items)
    unnamed = sorted(set(repo.blobs.iter_shas()) - set(named))
    if unnamed:
        out.notes.append(
            {
                "object": f"{repo.spec.prefix}blobs/sha256/",
                "note": f"{counted(len(unnamed), 'blob')} no manifest or cache record names (a stopped push)",
            }
        )
    return out


def _check_cache_records(repo: RemoteRepo, out: RemoteCheck, named: dict) -> None:
    """Every cache record parses and is signed, and names a blob checked as a manifest's are (a record is
    written after its blob: one naming a blob the bucket lacks is a problem)."""
    store = RemoteCacheStore(repo.spec, repo.blobs.client)
    for key, _ in store.records():
        raw = store.get_record(key)
        if raw is None:  # removed meanwhile (a gc)
            continue
        try:
            record, _signer = read_record(raw)
        except RecordError as exc:
            out.problems.append({"object": store.record_key(key), "problem": str(exc)})
            continue
        if record.key != key:
            out.problems.append({"object": store.record_key(key), "problem": "lies at another key than its own"})
            continue
        out.cache_records += 1
        declared = (record.stored_size, record.blob_size)
        if named.setdefault(record.blob_sha256, declared) != declared:
            out.problems.append(
                {"object": store.record_key(key), "problem": "declares its blob at sizes another entry contradicts"}
            )
