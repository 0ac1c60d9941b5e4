"""Reading a stored blob into its canonical bytes: the plan behind `BlobStore.read_chunked`.

Pure Python + numpy + the standard library; see library/blobstore.py for the integrity rules.
"""

from __future__ import annotations

import ctypes
import hashlib
import os

import numpy as np

from . import container
from .errors import BlobCorrupt, BlobUnreadable

CHUNK = 2 << 20  # the unit of the chunk digests kept in the index
IOV_MAX = 1024


def pread_all(fd: int, views: list[memoryview], offset: int, sha256: str) -> None:
    """Fill `views` from the file at `offset` (preadv, at most IOV_MAX buffers a call, short reads resumed)."""
    views = [v for v in views if len(v)]
    i = 0
    while i < len(views):
        batch = views[i : i + IOV_MAX]
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


def unreadable(sha256: str, exc: OSError) -> BlobUnreadable:
    """The error for an OS error while reading a blob that is there: not damage (see BlobUnreadable)."""
    return BlobUnreadable(f"blob {sha256} could not be read (not marked damaged; it may read next time): {exc}")


def read_header(fd: int, sha256: str, file_size: int) -> container.Container | None:
    try:
        head = os.pread(fd, 4096, 0)
        if not container.is_container(head):
            return None
        return container.parse_header(head, lambda off, n: os.pread(fd, n, off), stored_size=file_size)
    except OSError as exc:
        raise unreadable(sha256, exc) from exc


class ReadPlan:
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
            groups = strided_groups(c.ranges)  # split once, by bytes, between the two zero-fill workers
            sizes = np.cumsum([g[1] * g[3] for g in groups]) if groups else np.zeros(0)
            split = int(np.searchsorted(sizes, sizes[-1] // 2)) + 1 if groups else 0
            self.zero_parts = (groups[:split], groups[split:])

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
                pread_all(fd, [view], lo, "")
                return hashlib.sha256(view).digest() == digest
            dest, length = self.pieces(lo, hi)
            head = [memoryview(self.header_copy)[lo : min(hi, self.c.header_size)]] if lo < self.c.header_size else []
            if len(dest) <= self.MANY:
                views = head + [self.view[d : d + n] for d, n in zip(dest.tolist(), length.tolist(), strict=True)]
                pread_all(fd, list(views), lo, "")
                h = hashlib.sha256()
                for v in views:
                    h.update(v)
                return h.digest() == digest
            scratch = bytearray(hi - lo)
            pread_all(fd, [memoryview(scratch)], lo, "")
            if hashlib.sha256(scratch).digest() != digest:
                return False
        except BlobCorrupt:
            return False
        src = np.frombuffer(scratch, dtype=np.uint8)
        pos = 0
        if head:
            head[0][:] = scratch[: len(head[0])]
            pos = len(head[0])
        for start, count, stride, n in strided_groups(np.stack([dest, length], axis=1)):
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
        sel = self.zero_parts[part]
        if not sel:
            return
        arr = self.arr
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.view))
        limit = len(self.view)
        for start, count, stride, length in sel:
            if start + (count - 1) * stride + length > limit:
                raise BlobCorrupt("an elided range lies outside the blob")
            if count == 1:
                ctypes.memset(base + start, 0, length)
            else:
                np.lib.stride_tricks.as_strided(arr[start:], shape=(count, length), strides=(stride, 1))[...] = 0


def strided_groups(ranges: np.ndarray) -> list[tuple[int, int, int, int]]:
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
    return list(zip(starts[firsts].tolist(), counts.tolist(), strides.tolist(), lens[firsts].tolist(), strict=True))
