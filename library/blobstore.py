"""Content-addressed blob store: `<root>/<sha256[:2]>/<sha256>`.

Writes go to a temp file in the blob's own directory (`.tmp-<sha>-<pid>-<rand>`), are fsynced,
renamed into place and the directory fsynced: a reader never sees a partial blob, and a crash
leaves at most a temp file (reclaimable by gc). The same bytes are stored once.

A blob is stored as a compact container (library/container.py): its canonical bytes without the
zero runs the writer declared (for a KV snapshot, the dead sliding-window cells). The content
address is the SHA-256 of the canonical bytes. Blobs written before compaction are plain files
holding their bytes as they are; both kinds are read.

Reads check integrity before the bytes go anywhere, into one buffer (no intermediate copies).
A single SHA-256 pass is slower than reading a blob from the page cache, so the store also keeps
the SHA-256 of each 2 MiB chunk of the *stored* bytes (computed when the blob is stored, kept in
the index next to the content address): the hot read path reads and hashes the chunks on two
threads at once (`os.preadv` and hashlib both release the GIL), placing each live run straight
where it belongs in the canonical buffer, and compares each chunk digest; any flipped byte
changes its chunk's digest. The full check (`read_verified`, fsck) decodes and hashes the
canonical bytes against the address.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import container
from .blobread import CHUNK, ReadPlan, pread_all, read_header, unreadable
from .errors import BlobCorrupt, BlobMissing, BlobUnreadable, LibraryError, StorageFull
from .stores import ObjectStore

_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvgraft-blob")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_TMP = re.compile(r"^\.tmp-([0-9a-f]{64})-(\d+)-[0-9a-f]+$")


def check_sha(sha256: str) -> str:
    if not isinstance(sha256, str) or not _SHA.match(sha256):
        raise LibraryError(f"not a SHA-256 hex digest: {sha256!r}")
    return sha256


@dataclass(frozen=True)
class TempFile:
    path: Path
    sha256: str
    pid: int
    mtime: float


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobStore(ObjectStore):
    """The data dir's blobs (the local tier of library/stores.py)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        check_sha(sha256)
        return self.root / sha256[:2] / sha256

    # -- the ObjectStore interface (library/stores.py): one vocabulary for every store ----------
    def contains(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def stored_size(self, sha256: str) -> int | None:
        try:
            return self.path(sha256).stat().st_size
        except FileNotFoundError:
            return None

    # -- writing -------------------------------------------------------------------------------
    def put(self, data, sha256: str | None = None, trusted: bool = False, elide=None) -> "StoredBlob":
        """Store `data` (canonical bytes) as a compact container leaving out the `elide` ranges.

        The ranges must be zero in `data` (checked: nothing is lost). `sha256`, the content
        address of `data`, is checked against the bytes unless `trusted` (the caller hashed
        them just now). An intact copy already stored is not rewritten. Returns what the index
        records: address, sizes, and the chunk digests of the stored bytes.
        """
        view = memoryview(data).cast("B")
        if trusted and sha256 is not None:
            digest = check_sha(sha256)
        else:
            digest = hashlib.sha256(view).hexdigest()
            if sha256 is not None and sha256 != digest:
                raise BlobCorrupt(f"blob bytes hash to {digest}, not the declared {sha256}")
        try:
            c = container.make(len(view), elide)
            container.check_zero(view, c)
        except ValueError as exc:
            raise LibraryError(f"blob {digest[:16]}...: {exc}") from exc
        parts = container.pieces(view, c)
        chunks = _digest_pieces(parts)
        return self._store(digest, parts, len(view), c.stored_size, chunks)

    def put_container(self, sha256: str, stored: bytes, size: int, chunks: bytes | None = None) -> "StoredBlob":
        """Store a container exactly as given: one write, one pass of chunk digests (none when the
        caller computed `chunks` from these very bytes). The caller has checked that it decodes to
        canonical bytes hashing to `sha256` (`size` of them) and that its elided ranges are the ones
        `put` would write (so both give the same file)."""
        check_sha(sha256)
        view = memoryview(stored).cast("B")
        return self._store(sha256, [view], size, len(view), chunks if chunks is not None else chunk_digests(view))

    def _store(self, digest: str, parts: list, size: int, stored_size: int, chunks: bytes) -> "StoredBlob":
        """Write `parts` (the stored bytes) as the blob `digest`, unless an intact copy is there."""
        final = self.path(digest)
        if final.is_file() and (kept := self._intact_copy(digest, chunks)) is not None:
            return StoredBlob(digest, False, size, *kept)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{digest}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with open(tmp, "xb") as fh:
                for part in parts:
                    fh.write(part)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            _fsync_dir(final.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StorageFull(
                    f"disk full while writing blob {digest[:16]}... ({stored_size:,} bytes); nothing was stored"
                ) from exc
            raise LibraryError(f"could not write blob {digest[:16]}...: {exc.strerror or exc}") from exc
        return StoredBlob(digest, True, size, stored_size, chunks)

    def _intact_copy(self, sha256: str, chunks: bytes) -> tuple[int, bytes] | None:
        """(stored size, chunk digests) of the stored file when it holds the blob intact, from one
        read of it; None when it must be rewritten (damaged, unreadable, or gone meanwhile).

        The same bytes as `chunks` describe are intact as they are. Another form (a plain
        pre-compaction file of the same bytes, other ranges) is kept when its canonical bytes hash
        to the address: replacing it would pull it from under readers holding its chunk digests."""
        try:
            raw, c = self._read_stored(sha256)
        except (BlobMissing, BlobCorrupt, BlobUnreadable):
            return None
        digests = chunk_digests(raw)
        if digests == chunks or _canonical_sha256(raw, c) == sha256:
            return len(raw), digests
        return None

    # -- reading -------------------------------------------------------------------------------
    def _open(self, sha256: str) -> int:
        try:
            return os.open(self.path(sha256), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise BlobMissing(f"blob {sha256} is missing from {self.root}") from exc
        except OSError as exc:
            raise unreadable(sha256, exc) from exc

    def _read_stored(
        self, sha256: str, expected_size: int | None = None
    ) -> tuple[bytearray, container.Container | None]:
        """The blob's file as stored, read whole, and its container header (None: a plain file),
        after checking the canonical size against `expected_size`. Nothing is hashed here."""
        fd = self._open(sha256)
        try:
            file_size = os.fstat(fd).st_size
            c = read_header(fd, sha256, file_size)
            size = c.size if c is not None else file_size
            if expected_size is not None and size != expected_size:
                raise BlobCorrupt(f"blob {sha256} holds {size:,} bytes, the index says {expected_size:,}")
            raw = bytearray(file_size)
            pread_all(fd, [memoryview(raw)], 0, sha256)
        except OSError as exc:
            raise unreadable(sha256, exc) from exc
        finally:
            os.close(fd)
        return raw, c

    def read_verified(self, sha256: str, expected_size: int | None = None) -> bytearray:
        """The blob's canonical bytes, after checking size and SHA-256. Raises BlobMissing /
        BlobCorrupt, or BlobUnreadable for an OS error while reading (not damage)."""
        raw, c = self._read_stored(sha256, expected_size)
        buf = raw if c is None else container.decode(raw, c)
        if hashlib.sha256(buf).hexdigest() != sha256:
            raise BlobCorrupt(f"blob {sha256} does not match its SHA-256 (damaged or tampered)")
        return buf

    def read_chunked(self, sha256: str, expected_size: int, chunks: bytes, into: bytearray | None = None):
        """The blob's canonical bytes, read and checked chunk by chunk on two threads.

        `chunks` are the SHA-256 digests of each CHUNK of the *stored* bytes. A compact blob's live
        runs are read straight into their places in the output (one copy, by the kernel) and its
        elided ranges are zero-filled; the container header is hashed with chunk 0, so the map
        used to place the bytes is the one that was checked. With `into` (a reusable buffer at
        least that large) the bytes land there and a memoryview of exactly the blob's size is
        returned: a large fresh allocation costs a page fault per 4 KB page on first touch.
        Every read into the buffer has finished when this returns or raises."""
        fd = self._open(sha256)
        try:
            file_size = os.fstat(fd).st_size
            c = read_header(fd, sha256, file_size)
            size = c.size if c is not None else file_size
            if size != expected_size:
                raise BlobCorrupt(f"blob {sha256} holds {size:,} bytes, the index says {expected_size:,}")
            n_chunks = (file_size + CHUNK - 1) // CHUNK
            if len(chunks) != 32 * n_chunks:
                raise BlobCorrupt(
                    f"blob {sha256}: the index holds {len(chunks) // 32} chunk digests for {n_chunks} chunks"
                )
            if into is not None and len(into) >= size:
                buf = view = memoryview(into)[:size]
            else:
                buf = bytearray(size)
                view = memoryview(buf)
            plan = ReadPlan(view, c, file_size)
            results = _run_all(lambda i: plan.read_chunk(fd, i, chunks[32 * i : 32 * i + 32]), range(n_chunks))
        except OSError as exc:
            raise unreadable(sha256, exc) from exc
        finally:
            os.close(fd)  # after every read: _run_all waits for all of them, failed or not
        if not all(results) or (c is not None and bytes(plan.header_copy) != c.header):
            raise BlobCorrupt(f"blob {sha256} does not match its SHA-256 (damaged or tampered)")
        if c is not None:  # only a header that was checked decides where zeros go
            _run_all(plan.zero_fill, range(2))
        return buf

    def stored_bytes(self, sha256: str) -> bytes:
        """The blob's file exactly as stored (container or plain), unchecked: for packs."""
        return self.path(sha256).read_bytes()

    def get_stored(self, sha256: str, limit: int | None = None) -> bytes:
        size = self.stored_size(sha256)
        if limit is not None and size is not None and size > limit:
            raise BlobCorrupt(f"blob {sha256[:16]}... is {size:,} bytes, more than the {limit:,} declared")
        try:
            return self.stored_bytes(sha256)
        except FileNotFoundError as exc:
            raise BlobMissing(f"blob {sha256} is missing from {self.root}") from exc
        except OSError as exc:
            raise unreadable(sha256, exc) from exc

    def add_stored(self, sha256: str, data: bytes) -> bool:
        """Store a container as it is, once it decodes to bytes hashing to its address."""
        canonical, _ = container.decode_checked(data, sha256)
        return self.put_container(sha256, data, len(canonical)).written

    def _file_digests(self, path: Path) -> bytes:
        out = []
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(CHUNK):
                out.append(hashlib.sha256(chunk).digest())
        return b"".join(out)

    def stored_digests(self, sha256: str) -> bytes:
        """Chunk digests of the stored file as it is now (for fsck's comparison with the index)."""
        return self._file_digests(self.path(sha256))

    def verify(self, sha256: str) -> str | None:
        """None when the blob is intact, else a short reason: "missing", "hash mismatch",
        "corrupt: ..." (damaged another way: truncated, a bad header), or "unreadable: ..." (an OS
        error this time, BlobUnreadable: not damage)."""
        if not self.path(sha256).is_file():
            return "missing"
        try:
            self.read_verified(sha256)
        except BlobMissing:
            return "missing"
        except BlobUnreadable as exc:
            return f"unreadable: {exc}"
        except BlobCorrupt as exc:
            return "hash mismatch" if "SHA-256" in str(exc) else f"corrupt: {exc}"
        return None

    # -- listing and removal -------------------------------------------------------------------
    def iter_shas(self) -> Iterator[str]:
        for sub in sorted(self.root.iterdir()):
            if sub.is_dir() and len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    if _SHA.match(f.name) and f.name[:2] == sub.name:
                        yield f.name

    def iter_temp(self) -> Iterator[TempFile]:
        for sub in sorted(self.root.iterdir()):
            if sub.is_dir():
                for f in sub.iterdir():
                    m = _TMP.match(f.name)
                    if m:
                        try:
                            mtime = f.stat().st_mtime
                        except FileNotFoundError:
                            continue
                        yield TempFile(f, m.group(1), int(m.group(2)), mtime)

    def delete(self, sha256: str) -> bool:
        path = self.path(sha256)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        _fsync_dir(path.parent)
        return True


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    written: bool  # False: an intact copy was already there
    size: int  # canonical bytes (what a graft reads)
    stored_size: int  # bytes on disk
    chunks: bytes  # SHA-256 of each CHUNK of the stored bytes


def _run_all(fn, items) -> list:
    """`fn` over `items` on the pool. Returns or raises only once every call has finished (a
    worker may be writing into a caller's buffer through a caller's fd); then the first error, in
    item order, is raised."""
    futures = []
    try:
        for item in items:
            futures.append(_POOL.submit(fn, item))
    finally:
        wait(futures)
    return [f.result() for f in futures]


def _canonical_sha256(stored, c: container.Container | None) -> str:
    """The content address of a stored file held in memory (a container is decoded first)."""
    return hashlib.sha256(stored if c is None else container.decode(stored, c)).hexdigest()


def _digest_pieces(parts: list[memoryview]) -> bytes:
    """Chunk digests of the concatenation of `parts`, without concatenating them."""
    out, h, filled = [], hashlib.sha256(), 0
    for part in parts:
        pos = 0
        while pos < len(part):
            take = min(CHUNK - filled, len(part) - pos)
            h.update(part[pos : pos + take])
            pos += take
            filled += take
            if filled == CHUNK:
                out.append(h.digest())
                h, filled = hashlib.sha256(), 0
    if filled:
        out.append(h.digest())
    return b"".join(out)


def chunk_digests(data) -> bytes:
    """SHA-256 of each CHUNK-sized piece of `data`, concatenated."""
    return _digest_pieces([memoryview(data).cast("B")])
