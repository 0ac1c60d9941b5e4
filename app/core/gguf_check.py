"""Checking a GGUF file's header before llama.cpp ever opens it.

The header is read here, by a small reader over the file (the `gguf` package's GGUFReader builds numpy
objects for every element of every array: 10 s for the 262,144-entry vocabulary of Gemma 3 270M, a window
frozen that long). It walks the whole metadata and tensor table, checks every tensor's data lies inside the
file (a truncated download is refused), and reads the few fields kvgraft needs.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

GGUF_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_STRING = 1 << 30  # a length past this is a broken header, not a string
# value type -> struct format of one element (8: string, 9: array are read on their own)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class NotAModel(Exception):
    """The file is not a GGUF model kvgraft can load."""


class _Header:
    """A forward reader over the file; every read past its end is a truncated header."""

    def __init__(self, fh, size: int, name: str) -> None:
        self.fh, self.size, self.name = fh, size, name

    def read(self, n: int) -> bytes:
        data = self.fh.read(n)
        if len(data) != n:
            raise NotAModel(f"{self.name} has a malformed GGUF header: it ends inside the header (truncated?)")
        return data

    def unpack(self, fmt: str):
        return struct.unpack("<" + fmt, self.read(struct.calcsize(fmt)))[0]

    def skip(self, n: int) -> None:
        if self.fh.tell() + n > self.size:
            raise NotAModel(f"{self.name} has a malformed GGUF header: it ends inside the header (truncated?)")
        self.fh.seek(n, 1)

    def string(self) -> bytes:
        n = self.unpack("Q")
        if n > MAX_STRING:
            raise NotAModel(f"{self.name} has a malformed GGUF header: a string of {n:,} bytes")
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
                for _ in range(count):
                    self.skip(self.unpack("Q"))
            else:
                raise NotAModel(f"{self.name} has a malformed GGUF header: an array of value type {etype}")
            return None
        raise NotAModel(f"{self.name} has a malformed GGUF header: unknown value type {vtype}")


def read_header(path: Path) -> tuple[dict, int]:
    """The scalar and string fields of a GGUF header ({key: (value type, value)}) and its tensor count;
    raises NotAModel with the reason."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    try:
        size = path.stat().st_size
        fh = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise NotAModel(f"cannot read {path.name}: {exc.strerror}") from exc
    with fh:
        h = _Header(fh, size, path.name)
        if fh.read(4) != b"GGUF":
            raise NotAModel(f"{path.name} is not a GGUF file (bad magic)")
        version = h.unpack("I")
        if version not in GGUF_VERSIONS:
            raise NotAModel(f"{path.name} has a malformed GGUF header: version {version} is not one kvgraft reads")
        n_tensors, n_kv = h.unpack("Q"), h.unpack("Q")
        fields: dict[str, tuple[int, object]] = {}
        for _ in range(n_kv):
            key = h.string().decode("utf-8", errors="replace")
            vtype = h.unpack("I")
            fields[key] = (vtype, h.value(vtype, keep=True))
        tensors, names = [], set()
        for _ in range(n_tensors):
            name = h.string()
            if name in names:
                raise NotAModel(f"{path.name} has a malformed GGUF header: tensor {name!r} twice")
            names.add(name)
            n_dims = h.unpack("I")
            if n_dims > 8:
                raise NotAModel(f"{path.name} has a malformed GGUF header: a tensor of {n_dims} dimensions")
            dims = [h.unpack("Q") for _ in range(n_dims)]
            ggml_type, offset = h.unpack("I"), h.unpack("Q")
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
            except (ValueError, KeyError) as exc:
                raise NotAModel(f"{path.name} has a malformed GGUF header: tensor type {ggml_type}") from exc
            tensors.append((offset, math.prod(dims) * type_size // block))
        alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in fields:
            vtype, alignment = fields["general.alignment"]
            if vtype != 4 or alignment == 0 or alignment & (alignment - 1):
                raise NotAModel(f"{path.name} has a malformed GGUF header: general.alignment {alignment!r}")
        data_start = -(-fh.tell() // alignment) * alignment
        for offset, n_bytes in tensors:
            if data_start + offset + n_bytes > size:
                raise NotAModel(f"{path.name} is cut short: its tensors need more bytes than the file holds")
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
        if vtype not in SCALARS:
            raise NotAModel(f"{path.name}: its {key} field is not an integer (value type {vtype})")
        try:
            return int(value)
        except (ValueError, OverflowError) as exc:
            raise NotAModel(f"{path.name}: its {key} field is not an integer ({exc})") from exc

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
