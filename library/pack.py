"""The `.kvpack` container: a zip of `manifest.json` and `blobs/<sha256>` (stored, uncompressed).

Format 3 adds what the fingerprint stands for (`engine`: the bit-deciding config and the probe
hashes, engine/probe.py) and, per entry, how the exporter knew its state (`proof`), who vouched
for its answer (`verified_by`) and its decode `schedule`; an importer trusts none of these unless a
key it trusts signed them. Format 2 stores each blob as a compact container (library/container.py)
named by the SHA-256 of its canonical bytes, with `blob_stored_size` in the manifest; format 1 stored the bytes as they
were. Both are read: `read_checked` always returns the bytes the name is the SHA-256 of.

Reading validates the archive and the manifest completely before anything else looks at them;
every failure is a PackError whose message names the problem. The format is written down in
docs/pack-format.md; FORMAT_VERSION goes up with any change a reader of the old version could
misread.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import Callable, Iterable

from . import container
from .errors import BlobCorrupt
from .manifest import (  # noqa: F401 (re-exported: the pack's names for callers)
    _BLOB_MEMBER,
    _SHA,
    FORMAT_VERSION,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    MAX_MEMBERS,
    MAX_TEXT_CHARS,
    Manifest,
    PackEntry,
    PackError,
    _fail,
    build_manifest,
    parse_manifest,
)
from .signing import SIGNATURE, Signer, SigningError, sign_manifest, verify_signature
from .stores import ObjectStore


class PackReader(ObjectStore):
    """An opened, structurally validated pack, read as a read-only object store (as dulwich reads its
    pack files). Use as a context manager."""

    def __init__(self, path: Path, max_blob_size: int | None = None) -> None:
        self.path = Path(path)
        self.max_blob_size = max_blob_size  # canonical bytes a blob may decode to (the app sets it from the engine)
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise _fail(f"cannot read {self.path}: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise _fail(f"{self.path} is not a regular file")
        self.archive_size = st.st_size
        try:
            self.zip = zipfile.ZipFile(self.path)
        except zipfile.BadZipFile as exc:
            raise _fail(f"{self.path.name} is not a valid zip archive (truncated or corrupt): {exc}") from exc
        except OSError as exc:
            raise _fail(f"cannot read {self.path.name}: {exc}") from exc
        except Exception as exc:  # e.g. a member name flagged UTF-8 that is not
            raise _fail(f"{self.path.name} is not a valid zip archive: {type(exc).__name__}: {exc}") from exc
        try:
            self.members = self._check_members()
            self.manifest = parse_manifest(self._read_manifest())
            self._check_blobs_match_manifest()
            self._sizes = {e.blob_sha256: e.blob_size for e in self.manifest.entries}
            self.signer, self.signature_error = self._check_signature()
        except BaseException:
            self.zip.close()
            raise

    def close(self) -> None:
        self.zip.close()

    def __enter__(self) -> "PackReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_members(self) -> dict[str, zipfile.ZipInfo]:
        infos = self.zip.infolist()
        if len(infos) > MAX_MEMBERS:
            raise _fail(f"the archive has {len(infos):,} members, more than {MAX_MEMBERS:,}")
        members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            name = info.filename
            if name in members:
                raise _fail(f"duplicate member {name!r} in the archive")
            if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or "\\" in name:
                raise _fail(f"member {name!r} has an absolute or non-portable path")
            if any(part in ("..", ".") for part in name.split("/")):
                raise _fail(f"member {name!r} tries to leave the pack ('..' in its path)")
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise _fail(f"member {name!r} is a symbolic link")
            if info.is_dir():
                raise _fail(f"member {name!r} is a directory; packs hold only files")
            if info.flag_bits & 0x1:
                raise _fail(f"member {name!r} is encrypted")
            if name not in (MANIFEST, SIGNATURE) and not _BLOB_MEMBER.match(name):
                raise _fail(
                    f"member {name!r} is not part of the pack format (only manifest.json, signature.json and "
                    "blobs/<sha256>)"
                )
            if info.compress_size > self.archive_size:
                raise _fail(
                    f"member {name!r} declares {info.compress_size:,} bytes but the archive is {self.archive_size:,}"
                )
            if _BLOB_MEMBER.match(name):
                if info.compress_type != zipfile.ZIP_STORED:
                    raise _fail(f"blob member {name!r} is compressed; blobs must be stored uncompressed")
                if info.file_size != info.compress_size:
                    raise _fail(
                        f"blob member {name!r} declares {info.file_size:,} bytes but stores {info.compress_size:,}"
                    )
            members[name] = info
        if MANIFEST not in members:
            raise _fail("the archive has no manifest.json")
        return members

    def _read_manifest(self) -> dict:
        info = self.members[MANIFEST]
        if info.file_size > MAX_MANIFEST_BYTES:
            raise _fail(f"manifest.json declares {info.file_size:,} bytes, more than {MAX_MANIFEST_BYTES:,}")
        try:
            with self.zip.open(info) as fh:
                data = fh.read(MAX_MANIFEST_BYTES + 1)
        except Exception as exc:  # BadZipFile, OSError, EOFError, zlib.error, NotImplementedError...
            raise _fail(f"manifest.json cannot be read: {exc}") from exc
        if len(data) > MAX_MANIFEST_BYTES:
            raise _fail("manifest.json is larger than it declares (zip bomb?)")
        self.manifest_bytes = data
        try:
            return json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, absurd numbers, absurd nesting
            raise _fail(f"manifest.json is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}") from exc

    def _check_blobs_match_manifest(self) -> None:
        named, canonical = {}, {}
        for i, e in enumerate(self.manifest.entries):
            prev = named.get(e.blob_sha256)
            if prev is not None and prev != e.blob_stored_size:
                raise _fail(
                    f"manifest: entry {i} gives blob {e.blob_sha256[:16]}... a size that another entry contradicts"
                )
            named[e.blob_sha256] = e.blob_stored_size
            if canonical.setdefault(e.blob_sha256, e.blob_size) != e.blob_size:
                raise _fail(
                    f"manifest: entry {i} gives blob {e.blob_sha256[:16]}... a size that another entry contradicts"
                )
            if self.manifest.format_version < 2 and e.blob_size != e.blob_stored_size:
                raise _fail(f"manifest: entry {i} gives blob {e.blob_sha256[:16]}... two sizes in a format 1 pack")
        present = {m.group(1): info for name, info in self.members.items() if (m := _BLOB_MEMBER.match(name))}
        for sha, size in named.items():
            info = present.get(sha)
            if info is None:
                raise _fail(f"manifest names blob {sha[:16]}... but the archive does not hold it")
            if info.file_size != size:
                raise _fail(
                    f"blob {sha[:16]}... is {info.file_size:,} bytes in the archive, the manifest says {size:,}"
                )
        extra = sorted(set(present) - set(named))
        if extra:
            raise _fail(f"the archive holds blob {extra[0][:16]}... that the manifest does not name")
        total = sum(named.values())
        if total > self.archive_size:
            raise _fail(f"the blobs declare {total:,} bytes in all but the archive is {self.archive_size:,}")

    def _check_signature(self) -> tuple[Signer | None, str | None]:
        """(signer, None) for a pack whose signature verifies; (None, why) when it cannot be checked.

        A signature that is present and does not verify is refused outright (PackError)."""
        info = self.members.get(SIGNATURE)
        if info is None:
            return None, "unsigned"
        if info.file_size > 64 << 10:
            raise _fail("signature.json is larger than a signature can be")
        try:
            member = self.zip.read(info)
        except Exception as exc:
            raise _fail(f"signature.json cannot be read: {exc}") from exc
        try:
            return verify_signature(self.manifest_bytes, member), None
        except SigningError as exc:
            if "needs the optional" in str(exc):
                return None, str(exc)
            raise _fail(str(exc)) from exc

    def blob_shas(self) -> list[str]:
        return sorted({e.blob_sha256 for e in self.manifest.entries})

    @property
    def compact(self) -> bool:
        return self.manifest.format_version >= 2

    # -- the ObjectStore interface (library/stores.py): a pack is a read-only store ----------------
    def contains(self, sha256: str) -> bool:
        return f"blobs/{sha256}" in self.members

    def stored_size(self, sha256: str) -> int | None:
        info = self.members.get(f"blobs/{sha256}")
        return None if info is None else info.file_size

    def get_stored(self, sha256: str, limit: int | None = None) -> bytes:
        info = self.members.get(f"blobs/{sha256}")
        if info is not None and limit is not None and info.file_size > limit:
            raise _fail(f"blob {sha256[:16]}... is {info.file_size:,} bytes, more than the {limit:,} declared")
        return self._read_member(sha256)

    def add_stored(self, sha256: str, data: bytes) -> bool:
        raise PackError("a pack is read-only: blobs are added by writing a new pack (write_pack)")

    def iter_shas(self):
        return iter(self.blob_shas())

    def read_checked(self, sha256: str, expected_size: int | None = None, max_size: int | None = None):
        """(the member's bytes, canonical bytes, elided ranges; None in a format 1 pack), after checking
        the canonical size (the manifest's, and at most `max_size` or the reader's `max_blob_size`) and
        that the canonical bytes hash to the name. One read of the member, one SHA-256 pass."""
        stored = self.get_stored(sha256)
        expected = self._sizes.get(sha256) if expected_size is None else expected_size
        limit = self.max_blob_size if max_size is None else max_size
        if not self.compact:  # format 1: the member is the bytes as llama.cpp wrote them
            if limit is not None and len(stored) > limit:
                raise _fail(f"blob {sha256[:16]}... is {len(stored):,} bytes, more than a state of this context")
            if hashlib.sha256(stored).hexdigest() != sha256:
                raise _fail(f"blob {sha256[:16]}... does not match its SHA-256 (damaged or tampered)")
            return stored, stored, None
        try:
            data, ranges = container.decode_checked(stored, sha256, expected, limit)
        except container.ContainerError as exc:  # a bad header, or sizes other than declared
            said = str(exc)
            what = said if said.startswith("blob ") else f"blob {sha256[:16]}... is not a valid compact blob: {said}"
            raise _fail(what) from exc
        except BlobCorrupt as exc:  # its canonical bytes do not hash to its name
            raise _fail(str(exc)) from exc
        return stored, data, ranges

    def read_blob(self, sha256: str) -> bytes | bytearray:
        """The blob's canonical bytes (format 1: llama.cpp's), checked against its name and sizes."""
        return self.read_checked(sha256)[1]

    def _read_member(self, sha256: str) -> bytes:
        info = self.members.get(f"blobs/{sha256}")
        if info is None:
            raise _fail(f"the archive does not hold blob {sha256[:16]}...")
        try:
            with self.zip.open(info) as fh:
                data = fh.read(info.file_size + 1)
        except Exception as exc:  # BadZipFile (bad CRC, truncation), OSError, EOFError...
            raise _fail(f"blob {sha256[:16]}... cannot be read (truncated archive?): {exc}") from exc
        if len(data) != info.file_size:
            raise _fail(f"blob {sha256[:16]}... is {len(data):,} bytes, the archive declares {info.file_size:,}")
        return data


def write_pack(
    path: Path, manifest: dict, blobs: Iterable[tuple[str, Callable[[], bytes]]], sign_key: Path | None = None
) -> int:
    """Write a pack atomically (temp file, fsync, rename); return its size. Blobs are stored
    uncompressed, as the loaders give them (compact containers in format 2). With `sign_key` (an
    Ed25519 private key file) the manifest bytes are signed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    signature = sign_manifest(manifest_bytes, sign_key) if sign_key is not None else None
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
            z.writestr(
                zipfile.ZipInfo(MANIFEST, date_time=(2000, 1, 1, 0, 0, 0)),
                manifest_bytes,
                compress_type=zipfile.ZIP_DEFLATED,
            )
            if signature is not None:
                z.writestr(zipfile.ZipInfo(SIGNATURE, date_time=(2000, 1, 1, 0, 0, 0)), signature)
            seen = set()
            for sha, load in blobs:
                if sha in seen:
                    continue
                seen.add(sha)
                info = zipfile.ZipInfo(f"blobs/{sha}", date_time=(2000, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_STORED
                z.writestr(info, load())
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def pack_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()
