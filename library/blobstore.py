"""Content-addressed blob store: `<root>/<sha256[:2]>/<sha256>`.

Writes go to a temp file in the blob's own directory (`.tmp-<sha>-<pid>-<rand>`), are fsynced,
renamed into place and the directory fsynced: a reader never sees a partial blob, and a crash
leaves at most a temp file (reclaimable by gc). The same bytes are stored once.

Reads check integrity before the bytes go anywhere, into one buffer (no intermediate copies).
SHA-256 of the whole blob is the content address. A single SHA-256 pass is slower than reading a
blob from the page cache, so the store also keeps the SHA-256 of each 2 MiB chunk (computed from
the same bytes when the blob is stored, kept in the index next to the content address): the hot
read path reads and hashes the chunks on two threads at once (`os.preadv` and hashlib both release
the GIL) and compares each chunk digest; any flipped byte changes its chunk's digest.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import BlobCorrupt, BlobMissing, LibraryError, StorageFull

CHUNK = 2 << 20
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvgraft-blob")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_TMP = re.compile(r"^\.tmp-([0-9a-f]{64})-(\d+)-[0-9a-f]+$")
READ_CHUNK = 8 << 20


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
    def put(self, data, sha256: str | None = None, trusted: bool = False) -> tuple[str, bool]:
        """Store `data`; return (sha256, written). An intact copy already there is not rewritten.

        `sha256` is checked against the bytes unless `trusted` (the caller hashed them just now).
        """
        view = memoryview(data).cast("B")
        if trusted and sha256 is not None:
            digest = check_sha(sha256)
        else:
            digest = hashlib.sha256(view).hexdigest()
            if sha256 is not None and sha256 != digest:
                raise BlobCorrupt(f"blob bytes hash to {digest}, not the declared {sha256}")
        final = self.path(digest)
        if final.is_file() and final.stat().st_size == len(view) and self._hash_file(final) == digest:
            return digest, False
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{digest}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with open(tmp, "xb") as fh:
                fh.write(view)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            _fsync_dir(final.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StorageFull(f"disk full while writing blob {digest[:16]}... ({len(view):,} bytes); nothing was stored") from exc
            raise LibraryError(f"could not write blob {digest[:16]}...: {exc.strerror or exc}") from exc
        return digest, True

    # -- reading -------------------------------------------------------------------------------
    def read_verified(self, sha256: str, expected_size: int | None = None) -> bytearray:
        """The blob's bytes, after checking size and SHA-256. Raises BlobMissing / BlobCorrupt."""
        path = self.path(sha256)
        try:
            fh = open(path, "rb", buffering=0)
        except FileNotFoundError as exc:
            raise BlobMissing(f"blob {sha256} is missing from {self.root}") from exc
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if expected_size is not None and size != expected_size:
                raise BlobCorrupt(f"blob {sha256} is {size:,} bytes, the index says {expected_size:,}")
            buf = bytearray(size)
            view = memoryview(buf)
            h = hashlib.sha256()
            pos = 0
            while pos < size:
                n = fh.readinto(view[pos : pos + READ_CHUNK])
                if not n:
                    raise BlobCorrupt(f"blob {sha256} ended early at {pos:,} of {size:,} bytes")
                h.update(view[pos : pos + n])
                pos += n
        if h.hexdigest() != sha256:
            raise BlobCorrupt(f"blob {sha256} does not match its SHA-256 (damaged or tampered)")
        return buf

    def read_chunked(self, sha256: str, expected_size: int, chunks: bytes, into: bytearray | None = None):
        """The blob's bytes, read and checked chunk by chunk on two threads against `chunks`.

        With `into` (a reusable buffer at least that large) the bytes land there and a memoryview
        of exactly the blob's size is returned: a large fresh allocation costs a page fault per
        4 KB page on first touch, which a reused buffer does not pay again."""
        path = self.path(sha256)
        n_chunks = (expected_size + CHUNK - 1) // CHUNK
        if len(chunks) != 32 * n_chunks:
            raise BlobCorrupt(f"blob {sha256}: the index holds {len(chunks) // 32} chunk digests for {n_chunks} chunks")
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise BlobMissing(f"blob {sha256} is missing from {self.root}") from exc
        try:
            size = os.fstat(fd).st_size
            if size != expected_size:
                raise BlobCorrupt(f"blob {sha256} is {size:,} bytes, the index says {expected_size:,}")
            if into is not None and len(into) >= size:
                buf = view = memoryview(into)[:size]
            else:
                buf = bytearray(size)
                view = memoryview(buf)

            def one(i: int) -> bool:
                off = i * CHUNK
                part = view[off : off + CHUNK]
                got = 0
                while got < len(part):
                    r = os.preadv(fd, [part[got:]], off + got)
                    if r == 0:
                        return False
                    got += r
                return hashlib.sha256(part).digest() == chunks[32 * i : 32 * i + 32]

            try:
                results = list(_POOL.map(one, range(n_chunks)))  # every chunk read finished before fd closes
            except OSError as exc:
                raise BlobCorrupt(f"blob {sha256} cannot be read: {exc.strerror or exc}") from exc
            ok = all(results)
        finally:
            os.close(fd)
        if not ok:
            raise BlobCorrupt(f"blob {sha256} does not match its SHA-256 (damaged or tampered)")
        return buf

    def _hash_file(self, path: Path) -> str:
        h = hashlib.sha256()
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(READ_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def verify(self, sha256: str) -> str | None:
        """None when the blob is intact, else a short reason ("missing", "hash mismatch")."""
        path = self.path(sha256)
        if not path.is_file():
            return "missing"
        return None if self._hash_file(path) == sha256 else "hash mismatch"

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


def chunk_digests(data) -> bytes:
    """SHA-256 of each CHUNK-sized piece of `data`, concatenated (hashed on two threads)."""
    view = memoryview(data).cast("B")
    n = (len(view) + CHUNK - 1) // CHUNK
    return b"".join(_POOL.map(lambda i: hashlib.sha256(view[i * CHUNK : (i + 1) * CHUNK]).digest(), range(n)))
