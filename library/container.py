"""The compact blob container: a blob's bytes with its known zero runs left out.

A blob's content address is the SHA-256 of its *canonical* bytes (for a KV snapshot: the
whole-state payload with dead sliding-window cells zeroed, engine/compaction.py). On disk and in
packs it is stored as a container that does not store the zero runs the writer declared:

    offset 0   4s  magic b"KVGC"
           4   u16 version (1)
           6   u16 flags (0)
           8   u64 canonical size
          16   u64 n_ranges
          24   n_ranges x (u64 offset, u64 length)   elided ranges of the canonical bytes:
                                                     sorted, non-empty, not touching, inside it
          ...  the canonical bytes outside those ranges, in order ("live" bytes)

Reading zero-fills the elided ranges. Decoding is a pure function of the container, so integrity
of the container bytes (chunk digests over them, or the SHA-256 of the decoded bytes) is
integrity of the canonical bytes. Blobs written before compaction are plain files (no magic);
their first bytes are a llama.cpp state header (u32 length <= 128), never b"KVGC".

This module is pure Python + numpy: no llama.cpp, no SQLite.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .errors import BlobCorrupt

MAGIC = b"KVGC"
VERSION = 1
_HEAD = struct.Struct("<4sHHQQ")
HEAD_SIZE = _HEAD.size  # 24
MAX_RANGES = 1 << 22
MAX_SIZE = 1 << 40
# A KV snapshot shrinks at most to the share of its layers without a window (Gemma 3: 1/6). A header
# that claims far more than that is refused before anything that size is allocated.
MAX_EXPANSION = 64


class ContainerError(BlobCorrupt):
    """Container bytes that do not describe a valid compact blob."""


def as_ranges(ranges) -> np.ndarray:
    """An (n, 2) uint64 array of (offset, length), whatever sequence it came from."""
    arr = np.asarray(ranges if ranges is not None and len(ranges) else np.zeros((0, 2)), dtype=np.uint64)
    return arr.reshape(-1, 2)


def normalize_ranges(ranges, size: int) -> np.ndarray:
    """Sort, drop empty and merge touching/overlapping ranges; raise ValueError past `size`."""
    arr = as_ranges(ranges)
    arr = arr[arr[:, 1] > 0]
    if not len(arr):
        return arr
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    ends = arr[:, 0] + arr[:, 1]
    if int(ends.max()) > size:
        raise ValueError(f"an elided range ends at {int(ends.max()):,}, past the blob's {size:,} bytes")
    # a range starts a new run unless it begins at or before the furthest end so far (touching merges)
    reach = np.maximum.accumulate(ends)
    first = np.ones(len(arr), dtype=bool)
    first[1:] = arr[1:, 0] > reach[:-1]
    at = np.flatnonzero(first)
    starts, run_ends = arr[at, 0], np.maximum.reduceat(ends, at)
    return np.stack([starts, run_ends - starts], axis=1).astype(np.uint64).reshape(-1, 2)


@dataclass(frozen=True)
class Container:
    """A parsed container header and the map from canonical offsets to stored offsets."""

    size: int  # canonical bytes
    ranges: np.ndarray  # (n, 2) uint64 elided (offset, length)
    header: bytes  # the header bytes exactly as stored

    @property
    def header_size(self) -> int:
        return len(self.header)

    @property
    def elided_bytes(self) -> int:
        return int(self.ranges[:, 1].sum()) if len(self.ranges) else 0

    @property
    def stored_size(self) -> int:
        return self.header_size + self.size - self.elided_bytes

    def live_segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(canonical offset, length, stored offset) of each live run, in order."""
        r = self.ranges.astype(np.int64)
        starts = np.concatenate(([0], r[:, 0] + r[:, 1]))
        ends = np.concatenate((r[:, 0], [self.size]))
        keep = ends > starts
        canon, length = starts[keep], (ends - starts)[keep]
        stored = self.header_size + np.concatenate(([0], np.cumsum(length)[:-1])) if len(length) else length
        return canon, length, stored


def _check_ranges(ranges: np.ndarray, size: int) -> None:
    """Sorted, non-empty, separate ranges inside `size`. Every value is bounded by `size` (<= 2**40)
    before any two are added, so no sum can wrap."""
    if not len(ranges):
        return
    offs, lens = ranges[:, 0], ranges[:, 1]
    if (lens == 0).any() or (offs > np.uint64(size)).any() or (lens > np.uint64(size)).any():
        raise ContainerError("compact blob range table has an empty range or one past the end")
    ends = offs + lens
    if (ends > np.uint64(size)).any():
        raise ContainerError("compact blob range table has a range past the end")
    if (offs[1:] <= ends[:-1]).any():
        raise ContainerError("compact blob ranges are not sorted, separate and non-touching")


def encode_header(size: int, ranges: np.ndarray) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, 0, size, len(ranges)) + np.ascontiguousarray(ranges, dtype="<u8").tobytes()


def make(size: int, ranges) -> Container:
    """The container for `size` canonical bytes with `ranges` elided (normalized). ValueError when
    it would break a limit a reader enforces (too many ranges, implausible expansion)."""
    arr = normalize_ranges(ranges, size)
    if len(arr) > MAX_RANGES:
        raise ValueError(f"{len(arr):,} elided ranges, more than {MAX_RANGES:,}")
    c = Container(size, arr, encode_header(size, arr))
    if size > MAX_EXPANSION * c.stored_size + (1 << 20):
        raise ValueError(f"eliding {c.elided_bytes:,} of {size:,} bytes is more than a reader accepts")
    return c


def is_container(prefix: bytes) -> bool:
    return bytes(prefix[:4]) == MAGIC


def parse_header(head: bytes, read_more=None, stored_size: int | None = None) -> Container:
    """Parse and validate a container header.

    `head` holds at least the first 24 bytes; `read_more(offset, n)` returns the range table when
    `head` is shorter than the whole header. With `stored_size`, it must equal the file's size.
    """
    if len(head) < HEAD_SIZE:
        raise ContainerError(f"compact blob truncated: {len(head)} bytes, the header alone is {HEAD_SIZE}")
    magic, version, flags, size, n = _HEAD.unpack_from(head, 0)
    if magic != MAGIC:
        raise ContainerError("not a compact blob (bad magic)")
    if version != VERSION or flags != 0:
        raise ContainerError(
            f"compact blob version {version} flags {flags} is not one this kvgraft reads ({VERSION}, 0)"
        )
    if not 1 <= size <= MAX_SIZE or n > MAX_RANGES:
        raise ContainerError(f"compact blob header out of range (size {size:,}, {n:,} ranges)")
    hsize = HEAD_SIZE + 16 * n
    if len(head) >= hsize:
        table = bytes(head[HEAD_SIZE:hsize])
    else:
        if read_more is None:
            raise ContainerError("compact blob truncated inside its range table")
        table = bytes(read_more(HEAD_SIZE, 16 * n))
        if len(table) != 16 * n:
            raise ContainerError("compact blob truncated inside its range table")
    ranges = np.frombuffer(table, dtype="<u8").astype(np.uint64).reshape(-1, 2)
    _check_ranges(ranges, size)
    c = Container(int(size), ranges, bytes(head[:HEAD_SIZE]) + table)
    if stored_size is not None and stored_size != c.stored_size:
        raise ContainerError(f"compact blob is {stored_size:,} bytes, its header implies {c.stored_size:,}")
    if c.size > MAX_EXPANSION * c.stored_size + (1 << 20):
        raise ContainerError(
            f"compact blob claims {c.size:,} bytes from {c.stored_size:,} stored: implausible, refused"
        )
    return c


def pieces(view: memoryview, c: Container) -> list[memoryview]:
    """The stored bytes as a list of views: the header, then each live run of `view`."""
    view = memoryview(view).cast("B")
    canon, length, _ = c.live_segments()
    return [memoryview(c.header)] + [view[a : a + n] for a, n in zip(canon.tolist(), length.tolist(), strict=True)]


def check_zero(view: memoryview, c: Container) -> None:
    """Raise ValueError unless every elided range of `view` really is zero (nothing is lost)."""
    arr = np.frombuffer(memoryview(view).cast("B"), dtype=np.uint8)
    for off, n in c.ranges.tolist():
        if arr[off : off + n].any():
            raise ValueError(f"bytes {off:,}..{off + n:,} were declared zero but are not")


def decode(stored, c: Container | None = None) -> bytearray:
    """The canonical bytes of a whole container held in memory (a pack member, say)."""
    stored = memoryview(stored).cast("B")
    if c is None:
        c = parse_header(stored, stored_size=len(stored))
    out = bytearray(c.size)
    canon, length, pos = c.live_segments()
    for a, n, s in zip(canon.tolist(), length.tolist(), pos.tolist(), strict=True):
        out[a : a + n] = stored[s : s + n]
    return out


def decode_checked(
    stored, sha256: str, expected_size: int | None = None, max_size: int | None = None
) -> tuple[bytearray, np.ndarray]:
    """(canonical bytes, elided ranges) of a whole container held in memory, after checking its
    header, its canonical size (against `expected_size`, and at most `max_size`) and that the
    canonical bytes hash to `sha256`. Raises ContainerError / BlobCorrupt naming the problem."""
    import hashlib

    c = parse_header(memoryview(stored).cast("B"), stored_size=len(stored))
    if expected_size is not None and c.size != expected_size:
        raise ContainerError(f"blob {sha256[:16]}... holds {c.size:,} bytes, {expected_size:,} were declared")
    if max_size is not None and c.size > max_size:
        raise ContainerError(f"blob {sha256[:16]}... decodes to {c.size:,} bytes, more than {max_size:,}")
    data = decode(stored, c)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise BlobCorrupt(f"blob {sha256[:16]}... does not match its SHA-256 (damaged or tampered)")
    return data, c.ranges
