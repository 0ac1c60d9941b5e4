"""Checking a GGUF file's header before llama.cpp ever opens it.

The header is read here, by a small reader over the file (the `gguf` package's GGUFReader builds numpy
objects for every element of every array: 10 s for the 262,144-entry vocabulary of Gemma 3 270M, a window
frozen that long). It walks the whole metadata and tensor table, checks every tensor's data lies inside the
file (a truncated download is refused), and reads the few fields kvgraft needs.
"""

from __future__ import annotations

import math
import stat
import struct
from pathlib import Path

GGUF_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_KEPT_STRING = 1 << 16  # a name or an architecture longer than this is a broken header
# value type -> struct format of one element (8: string, 9: array are read on their own)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
INTEGERS = {0, 1, 2, 3, 4, 5, 10, 11}


class NotAModel(Exception):
    """The file is not a GGUF model kvgraft can load."""


def kept(key: str) -> bool:
    """The fields kvgraft reads; every other value is skipped, never held in memory."""
    return key in ("general.architecture", "general.name", "general.alignment") or key.endswith(
        ".attention.sliding_window"
    )


class _Header:
    """A forward reader over the file; a read past its end is a truncated header, refused before any
    buffer is allocated for it."""

    def __init__(self, fh, size: int, name: str) -> None:
        self.fh, self.size, self.name = fh, size, name

    def malformed(self, why: str) -> NotAModel:
        return NotAModel(f"{self.name} has a malformed GGUF header: {why}")

    def left(self) -> int:
        return self.size - self.fh.tell()

    def _need(self, n: int) -> None:
        if n > self.left():
            raise self.malformed("it ends inside the header (truncated?)")

    def read(self, n: int) -> bytes:
        self._need(n)
        return self.fh.read(n)

    def unpack(self, fmt: str):
        return struct.unpack("<" + fmt, self.read(struct.calcsize(fmt)))[0]

    def skip(self, n: int) -> None:
        self._need(n)
        self.fh.seek(n, 1)

    def string(self) -> bytes:
        """A key, a tensor name or a kept value (skipped values are never read into memory)."""
        n = self.unpack("Q")
        if n > MAX_KEPT_STRING:
            raise self.malformed(f"a string of {n:,} bytes where at most {MAX_KEPT_STRING:,} were expected")
        return self.read(n)

    def value(self, vtype: int, keep: bool):
        """One value of `vtype`: its Python value where `keep`, else skipped (arrays are never kept)."""
        if vtype in SCALARS:
            v = self.unpack(SCALARS[vtype])
            return v if keep else None
        if vtype == 8:
            return self.string() if keep else self.skip(self.unpack("Q"))
        if vtype == 9:
            etype, count = self.unpack("I"), self.unpack("Q")
            if etype in SCALARS:
                self.skip(count * struct.calcsize(SCALARS[etype]))
            elif etype == 8:
                if count * 8 > self.left():  # each string has at least its 8-byte length
                    raise self.malformed(f"an array of {count:,} strings in {self.left():,} bytes")
                for _ in range(count):
                    self.skip(self.unpack("Q"))
            else:
                raise self.malformed(f"an array of value type {etype}")
            return None
        raise self.malformed(f"unknown value type {vtype}")


def read_header(path: Path) -> tuple[dict, int]:
    """The fields kvgraft reads ({key: (value type, value)}, see `kept`) and the tensor count of a GGUF
    file, after walking its whole header; raises NotAModel with the reason."""
    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise NotAModel(f"{path.name} is not a regular file")
        with open(path, "rb") as fh:
            return _walk(_Header(fh, st.st_size, path.name))
    except OSError as exc:
        raise NotAModel(f"cannot read {path.name}: {exc.strerror or exc}") from exc


def _walk(h: _Header) -> tuple[dict, int]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    if h.fh.read(4) != b"GGUF":
        raise NotAModel(f"{h.name} is not a GGUF file (bad magic)")
    version = h.unpack("I")
    if version not in GGUF_VERSIONS:
        raise h.malformed(f"version {version} is not one kvgraft reads")
    n_tensors, n_kv = h.unpack("Q"), h.unpack("Q")
    fields: dict[str, tuple[int, object]] = {}
    seen: set[bytes] = set()
    for _ in range(n_kv):
        raw = h.string()
        if raw in seen:
            raise h.malformed(f"the key {raw!r} twice")  # llama.cpp refuses it too
        seen.add(raw)
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise h.malformed(f"a key that is not UTF-8 ({raw[:40]!r})") from exc
        vtype = h.unpack("I")
        value = h.value(vtype, keep=kept(key))
        if kept(key):
            fields[key] = (vtype, value)
    tensors, names = [], set()
    for _ in range(n_tensors):
        name = h.string()
        if name in names:
            raise h.malformed(f"tensor {name!r} twice")
        names.add(name)
        n_dims = h.unpack("I")
        if n_dims > MAX_DIMS:
            raise h.malformed(f"a tensor of {n_dims} dimensions")
        dims = [h.unpack("Q") for _ in range(n_dims)]
        ggml_type, offset = h.unpack("I"), h.unpack("Q")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError) as exc:
            raise h.malformed(f"tensor type {ggml_type}") from exc
        tensors.append((offset, math.prod(dims) * type_size // block))
    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in fields:
        vtype, alignment = fields["general.alignment"]
        if vtype != 4 or alignment == 0 or alignment & (alignment - 1):
            raise h.malformed(f"general.alignment {alignment!r}")
    data_start = -(-h.fh.tell() // alignment) * alignment
    for offset, n_bytes in tensors:
        if data_start + offset + n_bytes > h.size:
            raise NotAModel(f"{h.name} is cut short: its tensors need more bytes than the file holds")
    return fields, n_tensors


def inspect_gguf(path: Path) -> dict:
    """Architecture, name, tensor count and sliding window from the header; raises NotAModel with the reason."""
    path = Path(path)
    fields, n_tensors = read_header(path)

    def text(key: str) -> str | None:
        """A string field, or None where the header has none; one of another type is a malformed header."""
        if key not in fields:
            return None
        vtype, value = fields[key]
        if vtype != 8:
            raise NotAModel(f"{path.name}: its {key} field is not a string")
        return value.decode("utf-8", errors="replace")

    def integer(key: str) -> int:
        """An integer field; 0 only where the header has none (no sliding window). A field that is there
        but is no integer is a malformed header, never a default."""
        if key not in fields:
            return 0
        vtype, value = fields[key]
        if vtype not in INTEGERS:  # llama.cpp refuses a float or a string here too
            raise NotAModel(f"{path.name}: its {key} field is not an integer (value type {vtype})")
        return int(value)

    arch = text("general.architecture")
    if not arch:
        raise NotAModel(f"{path.name} has no general.architecture: not a language model GGUF")
    return {
        "path": str(path.resolve()),
        "architecture": arch,
        "name": text("general.name") or path.stem,
        "tensors": n_tensors,
        "size_bytes": path.stat().st_size,
        # the sliding window llama.cpp reads too (0: none); canonicalization uses it without loading the model
        "sliding_window": integer(f"{arch}.attention.sliding_window"),
    }
