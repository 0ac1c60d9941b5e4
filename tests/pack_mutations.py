"""Build malformed variants of a valid .kvpack (for the refusal tests and the fuzz suite)."""

from __future__ import annotations

import json
import os
import stat
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Callable


def read_members(path: Path) -> tuple[dict, dict[str, bytes]]:
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        blobs = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
    return manifest, blobs


def write_zip(path: Path, members: list[tuple[str, bytes, int]], symlink: set[str] = frozenset()) -> Path:
    """members: (name, data, compress_type). Writes exactly what it is told, unsafe names included."""
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as z:
        warnings.simplefilter("ignore")  # duplicate names are written on purpose
        for name, data, ctype in members:
            info = zipfile.ZipInfo(name, date_time=(2000, 1, 1, 0, 0, 0))
            info.compress_type = ctype
            if name in symlink:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, data)
    return path


def rebuild(
    src: Path,
    dst: Path,
    edit_manifest: Callable[[dict], None] | None = None,
    extra: list[tuple[str, bytes, int]] = (),
    blob_ctype: int = zipfile.ZIP_STORED,
    rename: Callable[[str], str] | None = None,
    symlink: set[str] = frozenset(),
    replace_blob: Callable[[str, bytes], bytes] | None = None,
    drop: set[str] = frozenset(),
) -> Path:
    manifest, blobs = read_members(src)
    if edit_manifest:
        edit_manifest(manifest)
    members = [("manifest.json", json.dumps(manifest).encode(), zipfile.ZIP_DEFLATED)]
    for name, data in blobs.items():
        if name in drop:
            continue
        if replace_blob:
            data = replace_blob(name, data)
        members.append(((rename(name) if rename else name), data, blob_ctype))
    members += list(extra)
    return write_zip(dst, members, symlink)


def patch_declared_size(path: Path, member: str, size: int = 0xFFFFFFF0) -> Path:
    """Overwrite a member's sizes in the central directory (a header that lies)."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    sig = b"PK\x01\x02"
    i = data.find(sig)
    while i != -1:
        n_len = struct.unpack_from("<H", data, i + 28)[0]
        if data[i + 46 : i + 46 + n_len] == name:
            struct.pack_into("<II", data, i + 20, size, size)
            break
        i = data.find(sig, i + 4)
    path.write_bytes(bytes(data))
    return path


def truncate(src: Path, dst: Path, keep: float) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


def random_bytes(n: int, seed: int) -> bytes:
    import random

    return random.Random(seed).randbytes(n) if n else os.urandom(0)
