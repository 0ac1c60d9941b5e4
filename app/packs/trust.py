"""Whose keys you trust, and how a pack's signature reads in words (the CLI's `show`, the window's table)."""

from __future__ import annotations

from pathlib import Path

from kvgraft.app.core.paths import data_dir
from kvgraft.library.signing import TrustStore
from kvgraft.library.views import TableRow


def trust_store(root: Path | None = None) -> TrustStore:
    """The trusted signer keys of a library (default: the data dir's)."""
    return TrustStore(data_dir(root) / "trusted_keys.json")


def keys_dir(home: Path | None = None) -> Path:
    return data_dir(home) / "keys"


def signer_words(signer: str | None, trust: TrustStore) -> str:
    """How a pack was signed, naming a key you trust (the CLI's `show` and the app's table say the same)."""
    if not signer:
        return "unsigned"
    name = trust.name_of(signer)
    return f"signed by {signer}" + (f" ({name})" if name else " (not in your trusted keys)")


def source_words(row: TableRow, trust: TrustStore) -> str:
    """The table's source column: "local", or the pack and how it was signed."""
    if row.pack_file is None:
        return row.source
    if not row.signer:
        return f"{row.pack_file} (unsigned)"
    name = trust.name_of(row.signer)
    return f"{row.pack_file} (signed {name})" if name else f"{row.pack_file} (signed, key not trusted here)"
