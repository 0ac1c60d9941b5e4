"""Blob reads and writes on real files: every read ends before its fd closes, an I/O error is not
damage, and storing a blob already there reads its file once."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from kvgraft.library.blobread import CHUNK
from kvgraft.library.blobstore import BlobStore, chunk_digests
from kvgraft.library.errors import BlobCorrupt, BlobUnreadable, LibraryError
from kvgraft.library.library import Library
from kvgraft.library.maintenance import fsck

FP = "a" * 64


@pytest.fixture
def lib(tmp_path):
    with Library(tmp_path / "lib") as library:
        yield library


def _blob(n_chunks: float) -> bytes:
    return b"\x01" + os.urandom(int(n_chunks * CHUNK) - 1)  # never b"KVGC": a plain file of it stays plain


def _add(lib, blob: bytes):
    return lib.add_entry(kind="document", text="doc", tokens=[1, 2, 3], blob=blob, fingerprint=FP)[0]


def _rchar() -> int:
    """Bytes this process has read through read/pread syscalls, all threads together."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


# -- 1. every chunk read finishes before the fd is closed --------------------------------------------
@pytest.mark.parametrize("into", [False, True])
def test_read_chunked_waits_for_every_read_before_closing(tmp_path, monkeypatch, into):
    store = BlobStore(tmp_path / "blobs")
    data = _blob(2.5)  # three chunks: two workers read chunks 0 and 1 at once
    stored = store.put(data)
    events: list[tuple] = []
    lock = threading.Lock()
    in_flight = {"n": 0, "fd": None}
    slow_done = threading.Event()
    real_preadv, real_close = os.preadv, os.close

    def preadv(fd, buffers, offset, *rest):
        if offset >= CHUNK and offset < 2 * CHUNK:  # chunk 1: slow, and still writing into the buffer
            with lock:
                in_flight["n"] += 1
                in_flight["fd"] = fd
                events.append(("read start", 1))
            try:
                time.sleep(0.4)
                return real_preadv(fd, buffers, offset, *rest)
            finally:
                with lock:
                    in_flight["n"] -= 1
                    events.append(("read end", 1))
                slow_done.set()
        if offset < CHUNK:  # chunk 0 fails at once
            time.sleep(0.05)  # let chunk 1 start first
            with lock:
                events.append(("read failed", 0))
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_preadv(fd, buffers, offset, *rest)

    def close(fd):
        with lock:
            if fd == in_flight["fd"]:
                events.append(("close", in_flight["n"]))
        return real_close(fd)

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "close", close)
    buf = bytearray(len(data) + 10) if into else None
    with pytest.raises(LibraryError) as info:
        store.read_chunked(stored.sha256, stored.size, stored.chunks, into=buf)
    at_raise = list(events)
    slow_done.wait(5)  # leave the shared pool idle for the next test, whatever happened
    assert ("close", 0) in at_raise, f"the fd was closed with a read still running: {at_raise}"
    assert at_raise.index(("read end", 1)) < at_raise.index(("close", 0))
    assert "Input/output error" in str(info.value)


def test_read_chunked_still_reads_every_chunk(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    data = bytearray(_blob(3.3))
    data[CHUNK : CHUNK + 5000] = bytes(5000)
    stored = store.put(bytes(data), elide=[(CHUNK, 5000)])
    assert bytes(store.read_chunked(stored.sha256, stored.size, stored.chunks)) == data
    into = bytearray(b"\xff" * (len(data) + 7))
    assert bytes(store.read_chunked(stored.sha256, stored.size, stored.chunks, into=into)) == data


# -- 2. an I/O error is BlobUnreadable, not damage ---------------------------------------------------
def _inject(monkeypatch, store: BlobStore, sha: str, where: str) -> None:
    path = str(store.path(sha))
    if where == "open":
        real_open = os.open

        def fake_open(p, *a, **kw):
            if str(p) == path:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
            return real_open(p, *a, **kw)

        monkeypatch.setattr(os, "open", fake_open)
    elif where == "header":

        def fake_pread(fd, n, off):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "pread", fake_pread)
    else:

        def fake_preadv(fd, buffers, off, *rest):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "preadv", fake_preadv)


@pytest.mark.parametrize("where", ["open", "header", "body"])
def test_io_error_is_unreadable_not_damage(lib, monkeypatch, where):
    blob = _blob(1.5)
    e = _add(lib, blob)
    why = "Permission denied" if where == "open" else "Input/output error"
    with monkeypatch.context() as m:
        _inject(m, lib.blobs, e.blob_sha256, where)
        with pytest.raises(BlobUnreadable, match=e.blob_sha256) as info:
            lib.read_blob(e)
        assert why in str(info.value)
        with pytest.raises(BlobUnreadable, match=e.blob_sha256):
            lib.blobs.read_verified(e.blob_sha256, e.blob_size)
        assert lib.blobs.verify(e.blob_sha256).startswith("unreadable: ")
        r = fsck(lib, repair=True)
        assert [p["kind"] for p in r["problems"]] == ["blob_unreadable"] and not r["ok"]
        assert r["problems"][0]["blob"] == e.blob_sha256 and why in r["problems"][0]["detail"]
    assert lib.get(e.id).damaged is None
    assert bytes(lib.read_blob(lib.get(e.id))) == blob  # it was never damaged: the next read works
    assert fsck(lib)["ok"]


def test_byte_flip_is_still_corrupt_and_marks_damage(lib):
    blob = _blob(1.5)
    e = _add(lib, blob)
    path = lib.blobs.path(e.blob_sha256)
    raw = bytearray(path.read_bytes())
    raw[CHUNK + 1234] ^= 0x40
    path.write_bytes(raw)
    assert lib.blobs.verify(e.blob_sha256) == "hash mismatch"
    with pytest.raises(BlobCorrupt, match=e.blob_sha256):
        lib.read_blob(e)
    assert lib.get(e.id).damaged == "blob hash mismatch"
    with pytest.raises(BlobCorrupt, match="SHA-256"):
        lib.blobs.read_verified(e.blob_sha256, e.blob_size)
    r = fsck(lib, repair=True)
    assert [p["kind"] for p in r["problems"]] == ["blob_hash_mismatch"]


# -- 3. putting a blob that is already there reads its file once -------------------------------------
@pytest.mark.parametrize("form", ["plain", "same", "other_ranges"])
def test_put_existing_reads_the_file_once(tmp_path, form):
    store = BlobStore(tmp_path / "blobs")
    data = bytearray(_blob(4.2))
    data[100_000:300_000] = bytes(200_000)
    data[CHUNK * 3 : CHUNK * 3 + 50_000] = bytes(50_000)
    data = bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    ranges = [(100_000, 200_000), (CHUNK * 3, 50_000)]
    path = store.path(sha)
    if form == "plain":  # a pre-compaction file of the same bytes
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
    else:
        store.put(data, elide=ranges if form == "same" else ranges[:1])
    on_disk = path.read_bytes()
    before = _rchar()
    stored = store.put(data, sha, trusted=True, elide=ranges)
    read = _rchar() - before
    assert not stored.written and path.read_bytes() == on_disk  # kept as it is
    assert stored.stored_size == len(on_disk) and stored.chunks == chunk_digests(on_disk)
    assert len(on_disk) <= read < len(on_disk) + 256 * 1024, f"read {read:,} bytes of a {len(on_disk):,}-byte file"


def test_put_replaces_a_damaged_copy(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    data = _blob(1.2)
    stored = store.put(data)
    path = store.path(stored.sha256)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(raw)
    again = store.put(data)
    assert again.written and again.chunks == stored.chunks and store.verify(stored.sha256) is None
