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

import ctypes
import errno
import hashlib
import os
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from . import container
from .errors import BlobCorrupt, BlobMissing, LibraryError, StorageFull

CHUNK = 2 << 20
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvgraft-blob")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_TMP = re.compile(r"^\.tmp-([0-9a-f]{64})-(\d+)-[0-9a-f]+$")
READ_CHUNK = 8 << 20
_IOV_MAX = 1024


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


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        check_sha(sha256)
        return self.root / sha256[:2] / sha256

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def size(self, sha256: str) -> int | None:
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
        final = self.path(digest)
        if final.is_file():
            if final.stat().st_size == c.stored_size and self._file_digests(final) == chunks:
                return StoredBlob(digest, False, len(view), c.stored_size, chunks)
            if self.verify(digest) is None:
                # intact in another form (a plain pre-compaction file of the same bytes, or other ranges):
                # keep it. Replacing it would pull it from under readers holding its chunk digests.
                return StoredBlob(digest, False, len(view), final.stat().st_size, self._file_digests(final))
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
                raise StorageFull(f"disk full while writing blob {digest[:16]}... ({c.stored_size:,} bytes); nothing was stored") from exc
            raise LibraryError(f"could not write blob {digest[:16]}...: {exc.strerror or exc}") from exc
        return StoredBlob(digest, True, len(view), c.stored_size, chunks)

    # -- reading -------------------------------------------------------------------------------
    def _open(self, sha256: str) -> int:
        try:
            return os.open(self.path(sha256), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise BlobMissing(f"blob {sha256} is missing from {self.root}") from exc

    def header(self, sha256: str) -> container.Container | None:
        """The compact container header of a stored blob, or None for a plain (pre-compaction) blob."""
        fd = self._open(sha256)
        try:
            return _read_header(fd, sha256, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def read_verified(self, sha256: str, expected_size: int | None = None) -> bytearray:
        """The blob's canonical bytes, after checking size and SHA-256. Raises BlobMissing / BlobCorrupt."""
        fd = self._open(sha256)
        try:
            file_size = os.fstat(fd).st_size
            c = _read_header(fd, sha256, file_size)
            size = c.size if c is not None else file_size
            if expected_size is not None and size != expected_size:
                raise BlobCorrupt(f"blob {sha256} holds {size:,} bytes, the index says {expected_size:,}")
            try:
                if c is None:
                    buf = bytearray(size)
                    _pread_all(fd, [memoryview(buf)], 0, sha256)
                else:
                    raw = bytearray(file_size)
                    _pread_all(fd, [memoryview(raw)], 0, sha256)
                    buf = container.decode(raw, c)
            except OSError as exc:
                raise BlobCorrupt(f"blob {sha256} cannot be read: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
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
        returned: a large fresh allocation costs a page fault per 4 KB page on first touch."""
        fd = self._open(sha256)
        try:
            file_size = os.fstat(fd).st_size
            c = _read_header(fd, sha256, file_size)
            size = c.size if c is not None else file_size
            if size != expected_size:
                raise BlobCorrupt(f"blob {sha256} holds {size:,} bytes, the index says {expected_size:,}")
            n_chunks = (file_size + CHUNK - 1) // CHUNK
            if len(chunks) != 32 * n_chunks:
                raise BlobCorrupt(f"blob {sha256}: the index holds {len(chunks) // 32} chunk digests for {n_chunks} chunks")
            if into is not None and len(into) >= size:
                buf = view = memoryview(into)[:size]
            else:
                buf = bytearray(size)
                view = memoryview(buf)
            plan = _ReadPlan(view, c, file_size)
            try:  # every read finishes before fd closes
                results = list(_POOL.map(lambda i: plan.read_chunk(fd, i, chunks[32 * i : 32 * i + 32]), range(n_chunks)))
            except OSError as exc:
                raise BlobCorrupt(f"blob {sha256} cannot be read: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        if not all(results) or (c is not None and bytes(plan.header_copy) != c.header):
            raise BlobCorrupt(f"blob {sha256} does not match its SHA-256 (damaged or tampered)")
        if c is not None:  # only a header that was checked decides where zeros go
            list(_POOL.map(plan.zero_fill, range(2)))
        return buf

    def stored_bytes(self, sha256: str) -> bytes:
        """The blob's file exactly as stored (container or plain), unchecked: for packs."""
        return self.path(sha256).read_bytes()

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
        """None when the blob is intact, else a short reason ("missing", "hash mismatch", ...)."""
        if not self.path(sha256).is_file():
            return "missing"
        try:
            self.read_verified(sha256)
        except BlobMissing:
            return "missing"
        except BlobCorrupt as exc:
            return "hash mismatch" if "SHA-256" in str(exc) else f"unreadable: {exc}"
        return None

    # -- listing and removal -------------------------------------------------------------------
    def iter_blobs(self) -> Iterator[str]:
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


def _pread_all(fd: int, views: list[memoryview], offset: int, sha256: str) -> None:
    """Fill `views` from the file at `offset` (preadv, at most IOV_MAX buffers a call, short reads resumed)."""
    views = [v for v in views if len(v)]
    i = 0
    while i < len(views):
        batch = views[i : i + _IOV_MAX]
        want = sum(len(v) for v in batch)
        got = os.preadv(fd, batch, offset)
        if got == want:
            i += len(batch)
            offset += got
            continue
        if got <= 0:
            raise BlobCorrupt(f"blob {sha256} ended early (truncated file)")
        offset += got
        while got >= len(views[i]):  # drop what was filled, keep the rest of a partly filled view
            got -= len(views[i])
            i += 1
        views[i] = views[i][got:]


def _read_header(fd: int, sha256: str, file_size: int) -> container.Container | None:
    try:
        head = os.pread(fd, 4096, 0)
        if not container.is_container(head):
            return None
        return container.parse_header(head, lambda off, n: os.pread(fd, n, off), stored_size=file_size)
    except OSError as exc:
        raise BlobCorrupt(f"blob {sha256} cannot be read: {exc.strerror or exc}") from exc


class _ReadPlan:
    """Where each stored chunk of a blob lands in the output buffer (see BlobStore.read_chunked).

    A chunk of few live runs is read with one preadv straight into its places and hashed from
    there. A chunk of many small runs (a transposed V tensor's rows: 1 KB each for Gemma 3) is
    read into a 2 MiB scratch buffer and hashed in one call (hashlib drops the GIL only for large
    updates), then scattered with one strided numpy copy per run of equal pieces."""

    MANY = 32

    def __init__(self, view: memoryview, c: container.Container | None, file_size: int) -> None:
        self.view, self.c, self.file_size = view, c, file_size
        if c is not None:
            self.header_copy = bytearray(c.header_size)
            self.canon, self.length, self.stored = c.live_segments()
            self.arr = np.frombuffer(view, dtype=np.uint8)

    def pieces(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(output offset, length) of the live bytes stored at lo..hi (past the header), in order."""
        lo = max(lo, self.c.header_size)
        if lo >= hi or not len(self.stored):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        j0 = max(0, int(np.searchsorted(self.stored, lo, side="right")) - 1)
        j1 = int(np.searchsorted(self.stored, hi, side="left"))
        s, n, a = self.stored[j0:j1], self.length[j0:j1], self.canon[j0:j1]
        a0, a1 = np.maximum(s, lo), np.minimum(s + n, hi)
        keep = a1 > a0
        return (a + (a0 - s))[keep], (a1 - a0)[keep]

    def read_chunk(self, fd: int, i: int, digest: bytes) -> bool:
        lo, hi = i * CHUNK, min((i + 1) * CHUNK, self.file_size)
        try:
            if self.c is None:
                view = self.view[lo:hi]
                _pread_all(fd, [view], lo, "")
                return hashlib.sha256(view).digest() == digest
            dest, length = self.pieces(lo, hi)
            head = [memoryview(self.header_copy)[lo : min(hi, self.c.header_size)]] if lo < self.c.header_size else []
            if len(dest) <= self.MANY:
                views = head + [self.view[d : d + n] for d, n in zip(dest.tolist(), length.tolist())]
                _pread_all(fd, list(views), lo, "")
                h = hashlib.sha256()
                for v in views:
                    h.update(v)
                return h.digest() == digest
            scratch = bytearray(hi - lo)
            _pread_all(fd, [memoryview(scratch)], lo, "")
            if hashlib.sha256(scratch).digest() != digest:
                return False
        except BlobCorrupt:
            return False
        src = np.frombuffer(scratch, dtype=np.uint8)
        pos = 0
        if head:
            head[0][:] = scratch[: len(head[0])]
            pos = len(head[0])
        for start, count, stride, n in _strided_groups(np.stack([dest, length], axis=1)):
            if start + (count - 1) * stride + n > len(self.arr):
                raise BlobCorrupt("a live run lies outside the blob")
            block = src[pos : pos + count * n].reshape(count, n)
            if count == 1:
                self.arr[start : start + n] = block[0]
            else:
                np.lib.stride_tricks.as_strided(self.arr[start:], shape=(count, n), strides=(stride, 1))[...] = block
            pos += count * n
        return True

    def zero_fill(self, part: int) -> None:
        """Zero the elided ranges, half of the bytes for each of two workers. Runs of ranges of one
        length at one stride (a transposed V tensor's rows) are filled with one strided numpy
        assignment; single ranges with memset. Both drop the GIL."""
        groups = _strided_groups(self.c.ranges)
        if not groups:
            return
        sizes = np.cumsum([g[1] * g[3] for g in groups])
        split = int(np.searchsorted(sizes, sizes[-1] // 2))
        sel = groups[: split + 1] if part == 0 else groups[split + 1 :]
        arr = np.frombuffer(self.view, dtype=np.uint8)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.view))
        limit = len(self.view)
        for start, count, stride, length in sel:
            if start + (count - 1) * stride + length > limit:
                raise BlobCorrupt("an elided range lies outside the blob")
            if count == 1:
                ctypes.memset(base + start, 0, length)
            else:
                np.lib.stride_tricks.as_strided(arr[start:], shape=(count, length), strides=(stride, 1))[...] = 0


def _strided_groups(ranges: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(start, count, stride, length) runs covering sorted (offset, length) pairs: consecutive
    pairs of one length whose offsets are evenly spaced form one run."""
    if not len(ranges):
        return []
    starts, lens = ranges[:, 0].astype(np.int64), ranges[:, 1].astype(np.int64)
    d = np.diff(starts)
    brk = np.ones(len(starts), dtype=bool)
    brk[1:] = lens[1:] != lens[:-1]
    brk[2:] |= d[1:] != d[:-1]
    firsts = np.flatnonzero(brk)
    counts = np.diff(np.append(firsts, len(starts)))
    strides = np.where(counts > 1, np.append(d, 0)[firsts], 0)
    return list(zip(starts[firsts].tolist(), counts.tolist(), strides.tolist(), lens[firsts].tolist()))


def chunk_digests(data) -> bytes:
    """SHA-256 of each CHUNK-sized piece of `data`, concatenated (hashed on two threads)."""
    view = memoryview(data).cast("B")
    n = (len(view) + CHUNK - 1) // CHUNK
    return b"".join(_POOL.map(lambda i: hashlib.sha256(view[i * CHUNK : (i + 1) * CHUNK]).digest(), range(n)))
