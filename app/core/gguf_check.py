"""Checking a GGUF file's header with the `gguf` package before llama.cpp ever opens it."""

from __future__ import annotations

from pathlib import Path


class NotAModel(Exception):
    """The file is not a GGUF model kvgraft can load."""


def inspect_gguf(path: Path) -> dict:
    """Architecture, name, tensor count and sliding window from the header; raises NotAModel with the reason."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise NotAModel(f"{path.name} is not a GGUF file (bad magic)")
    except OSError as exc:
        raise NotAModel(f"cannot read {path.name}: {exc.strerror}") from exc
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 (the gguf package raises ValueError and friends on a malformed header)
        raise NotAModel(f"{path.name} has a malformed GGUF header: {exc}") from exc

    def raw(key: str):
        """A field's first value, or None where the header has no such key; a field that is there
        but unreadable is a malformed header, never a default."""
        f = reader.fields.get(key)
        if f is None or not f.data:
            return None
        try:
            return f.parts[f.data[0]]
        except (IndexError, TypeError) as exc:
            raise NotAModel(f"{path.name}: its {key} field cannot be read ({exc})") from exc

    def field(key: str) -> str | None:
        value = raw(key)
        return None if value is None else bytes(value).decode("utf-8", errors="replace")

    def int_field(key: str) -> int:
        """An integer field; 0 only where the header has none (no sliding window)."""
        value = raw(key)
        if value is None:
            return 0
        try:
            return int(value[0])
        except (IndexError, TypeError, ValueError, OverflowError) as exc:
            raise NotAModel(f"{path.name}: its {key} field is not an integer ({exc})") from exc

    arch = field("general.architecture")
    if not arch:
        raise NotAModel(f"{path.name} has no general.architecture: not a language model GGUF")
    return {
        "path": str(path.resolve()),
        "architecture": arch,
        "name": field("general.name") or path.stem,
        "tensors": len(reader.tensors),
        "size_bytes": path.stat().st_size,
        # the sliding window llama.cpp reads too (0: none); canonicalization uses it without loading the model
        "sliding_window": int_field(f"{arch}.attention.sliding_window"),
    }
