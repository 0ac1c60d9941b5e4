"""`kvgraft pull`: bring a remote's knowledge into this library, proven as an import proves it.

1. The index names the published manifests; each is fetched and checked against its name, parsed
   with the pack manifest's parser, and its signature (when there is one) verified.
2. Entries this library already holds (same text, same state, proven) are skipped: their blobs are
   not fetched.
3. Every other blob is downloaded (in parallel) and checked before it is kept: its declared stored
   size, its container header, and the SHA-256 of its canonical bytes against its name. A blob
   that is absent or does not hash to its name refuses the entries that name it, saying so. A
   transfer that breaks (the server gone, a timeout) stops the pull before anything is imported.
4. Per manifest, each entry goes the one way in (app/packs/admission.py), as a pack's entry does: its
   tokens, its state layout and canonical form (each blob already checked once, as it was downloaded),
   and its proof: taken as signed when a key you trust signed a manifest made under this engine's
   fingerprint, else replayed here. An entry that fails is refused with its reason, the others go on.
5. Each manifest's accepted entries are committed in one transaction (library/admission.py).
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.packs.admission import admit, label, state_size_limit
from kvgraft.app.packs.imports import fingerprint_difference, trusted_name
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.remote import WORKERS, in_order
from kvgraft.app.remote.fetched import DownloadedBlobs, Held
from kvgraft.app.service import LibraryService
from kvgraft.library import container
from kvgraft.library.admission import SourceRecord, memory_budget
from kvgraft.library.blobstore import chunk_digests
from kvgraft.library.errors import BlobCorrupt, BlobMissing, StorageFull
from kvgraft.library.manifest import Manifest
from kvgraft.library.remote import MANIFEST_ERRORS, RemoteRepo
from kvgraft.library.signing import SigningError


@dataclass
class PullResult:
    imported: int = 0
    skipped: int = 0
    refused: list[dict] = field(default_factory=list)  # [{"entry", "reason"}]
    manifests: int = 0
    bytes: int = 0  # blob bytes downloaded
    proof: dict = field(default_factory=dict)  # imported entries by proof (replayed, signed:<name>)

    def as_dict(self) -> dict:
        return {
            "imported": self.imported,
            "skipped": self.skipped,
            "refused": self.refused,
            "manifests": self.manifests,
            "bytes": self.bytes,
            "proof": self.proof,
        }


@dataclass
class _Fetched:
    sha: str
    manifest: Manifest
    signer: object
    signature_error: str | None


def _entry_name(msha: str, e) -> str:
    return f"{msha[:12]}#{e.position} {label(e)}"


def pull(
    service: LibraryService,
    repo: RemoteRepo,
    require_signed: bool = False,
    progress: Progress = no_progress,
    workers: int = WORKERS,
) -> PullResult:
    engine, lib = service.engine, service.library
    res = PullResult()
    trust = trust_store(lib.root)
    index, _ = repo.read_index()
    fetched = []
    names = sorted(index["manifests"])
    for k, msha in enumerate(names):
        progress("manifests", k, len(names))
        try:
            _, m, signer = repo.read_manifest(msha)
        except MANIFEST_ERRORS as exc:
            why = f"signature: {exc}" if isinstance(exc, SigningError) else str(exc)
            res.refused.append({"entry": f"{msha[:12]} (the whole manifest)", "reason": why})
            continue
        fetched.append(_Fetched(msha, m, signer, None if signer else "unsigned"))
    progress("manifests", len(names), len(names))
    res.manifests = len(fetched)

    # what to fetch: entries this library lacks, of manifests this engine can take
    wanted: dict[str, list[int]] = {}  # manifest sha -> entry positions
    blobs: dict[str, int] = {}  # blob sha -> the largest stored size an entry declares for it
    for f in fetched:
        m = f.manifest
        why = _refusal(engine, m, f.signer, trust, require_signed)
        for i, e in enumerate(m.entries):
            here = lib.find_same(e.tokens_sha256, engine.fingerprint, e.kind, e.question, e.answer)
            if here is not None and here.proven and here.damaged is None and here.blob_sha256 == e.blob_sha256:
                res.skipped += 1
            elif why is not None:
                res.refused.append({"entry": _entry_name(f.sha, e), "reason": why})
            else:
                wanted.setdefault(f.sha, []).append(i)
                blobs[e.blob_sha256] = max(blobs.get(e.blob_sha256, 0), e.blob_stored_size)
    if not wanted:
        return res

    _remove_stale(lib.root / "tmp")
    tmp = lib.root / "tmp" / f"pull-{os.getpid()}-{secrets.token_hex(6)}"
    tmp.mkdir(parents=True)
    try:
        files, bad, res.bytes = _download(repo, blobs, tmp, state_size_limit(engine), progress, workers)
        free = shutil.disk_usage(lib.root).free
        need = sum(_size(p) for s, p in files.items() if not lib.blobs.contains(s))
        if need > free:
            raise StorageFull(f"the pull needs {need / 1e6:,.0f} MB and the disk has {free / 1e6:,.0f} MB free")
        by_sha = {f.sha: f for f in fetched}
        for n, (msha, positions) in enumerate(wanted.items()):
            progress("importing", n, len(wanted))
            f = by_sha[msha]
            ok = []
            for i in positions:
                e = f.manifest.entries[i]
                held = files.get(e.blob_sha256)
                if e.blob_sha256 in bad:
                    res.refused.append({"entry": _entry_name(msha, e), "reason": bad[e.blob_sha256]})
                elif _size(held) != e.blob_stored_size:  # each entry's own declaration, not another's
                    why = f"blob {e.blob_sha256[:16]}... is {_size(held):,} bytes, "
                    why += f"the entry declares {e.blob_stored_size:,}"
                    res.refused.append({"entry": _entry_name(msha, e), "reason": why})
                else:
                    ok.append(i)
            _import_manifest(service, f, ok, files, trust, repo.spec.name, res, progress)
        progress("importing", len(wanted), len(wanted))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _remove_stale(root: Path) -> None:
    """Temp dirs of pulls whose process is gone (killed mid-pull): spilled blobs nothing will read."""
    for d in root.glob("pull-*") if root.is_dir() else []:
        parts = d.name.split("-")
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
        if pid is None or pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass  # another user's live process


def _size(held) -> int:
    return len(held.stored) if isinstance(held, Held) else held.stat().st_size


def _refusal(engine, m: Manifest, signer, trust, require_signed: bool) -> str | None:
    """Why every entry of a manifest is refused here, or None."""
    if m.model_sha256 != engine.model.info.sha256:
        return (
            f"made for model {m.model_name} ({m.model_sha256[:12]}...), the loaded model is "
            f"{engine.model.info.name} ({engine.model.info.sha256[:12]}...)"
        )
    if m.format_version < 3 or m.fingerprint != engine.fingerprint:
        theirs = m.engine
        return (
            f"made under engine fingerprint {m.fingerprint[:12]}..., this engine is {engine.fingerprint[:12]}... "
            f"({fingerprint_difference(theirs, engine.fingerprint_info)}); its states are not this engine's bits"
        )
    if require_signed:
        if signer is None:
            return "not signed; --require-signed refuses it"
        if not trust.trusts(signer):
            return f"signed by key {signer.key_id}, which is not in your trusted keys (kvgraft keys trust PUBLIC_KEY)"
    return None


def _download(repo: RemoteRepo, blobs: dict[str, int], tmp: Path, max_size: int, progress: Progress, workers: int):
    """Fetch and check each blob into `tmp`: ({sha: file}, {sha: why refused}, bytes fetched). A
    transport failure (RemoteError) stops the pull: nothing has been imported yet."""

    budget, budget_lock = [memory_budget()], threading.Lock()

    def one(item):
        sha, declared = item
        if declared > max_size + (64 << 20):  # a container is at most its canonical bytes and a range table
            return sha, None, f"blob {sha[:16]}... declares {declared:,} bytes, more than a state of this context", 0
        try:
            data = repo.blobs.get_stored(sha, limit=declared)
        except BlobMissing:
            return sha, None, f"blob {sha[:16]}... is named by its manifest but missing from the remote", 0
        except BlobCorrupt as exc:
            return sha, None, str(exc), 0
        try:
            canonical, ranges = container.decode_checked(data, sha, max_size=max_size)
        except BlobCorrupt as exc:
            return sha, None, f"blob {sha[:16]}... on the remote: {exc}", len(data)
        with budget_lock:
            keep = budget[0] >= len(data) + len(canonical)
            budget[0] -= len(data) + len(canonical) if keep else 0
        if keep:  # checked bytes held in memory until they are committed
            return sha, Held(data, canonical, ranges, chunk_digests(data)), None, len(data)
        path = tmp / sha  # past the memory budget: spilled, and checked again when read back
        path.write_bytes(data)
        return sha, path, None, len(data)

    files, bad, total = {}, {}, [0]
    items = sorted(blobs.items())

    def take(k: int, result) -> None:
        sha, path, why, n = result
        total[0] += n
        if why is None:
            files[sha] = path
        else:
            bad[sha] = why
        progress("download", k + 1, len(items))

    in_order(one, items, workers, "pull", take)
    return files, bad, total[0]


def _import_manifest(
    service: LibraryService,
    f: _Fetched,
    positions: list[int],
    files: dict[str, Held | Path],
    trust,
    remote_name: str,
    res: PullResult,
    progress: Progress,
) -> None:
    """Admit one manifest's entries at `positions` (app/packs/admission.py, not strict: one bad entry
    refuses only itself, with its reason)."""
    m = f.manifest
    record = SourceRecord(
        f.sha,
        f"remote {remote_name}: manifests/{f.sha[:12]}",
        m.format_version,
        m.kvgraft_version,
        f.signer.key_id if f.signer else None,
        len(m.entries),
        m.model_sha256,
    )
    done = admit(
        service,
        DownloadedBlobs(files),
        [m.entries[i] for i in positions],
        record,
        signer_name=trusted_name(f.signer, trust),
        strict=False,
        progress=progress,
    )
    res.refused += [{"entry": _entry_name(f.sha, e), "reason": why} for e, why in done.refused]
    res.imported += done.imported
    res.skipped += done.skipped
    for p in done.proofs:
        if p.existing_id is None:
            res.proof[p.proof] = res.proof.get(p.proof, 0) + 1
