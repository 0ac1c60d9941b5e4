"""What the pack use cases return: `export_pack`/`build_pack` a `PackExport`, `import_pack` a `PackImport`.
`as_dict()` is the JSON shape (the CLI's contract); the CLI turns them into JSON, nothing below it does."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PackExport:
    """A pack written: its file, how many entries and blobs it holds, its size and SHA-256, its signer."""

    file: str
    entries: int
    blobs: int
    bytes: int
    sha256: str
    signed_by: str | None  # the signing key's id; None: unsigned

    def as_dict(self) -> dict:
        return {
            "file": self.file,
            "entries": self.entries,
            "blobs": self.blobs,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "signed_by": self.signed_by,
        }


@dataclass(frozen=True)
class PackImport:
    """A pack imported: counts, the signer, and how each entry's state is known.

    A rebuild (`proof` None) computed every state here, so it has no proof counts, replays or signer trust."""

    file: str
    imported: int
    skipped: int
    rebuilt: int
    signed_by: str | None  # the key id the pack is signed with (trusted or not); None: unsigned
    signer_trusted: bool = False
    proof: dict[str, int] | None = None  # entries by proof (replayed, signed:<name>, unproven, ...)
    replayed: int = 0
    replay_tokens: int = 0
    replay_s: float = 0.0

    @property
    def unproven(self) -> int:
        return (self.proof or {}).get("unproven", 0)

    def as_dict(self) -> dict:
        out = {
            "file": self.file,
            "imported": self.imported,
            "skipped": self.skipped,
            "rebuilt": self.rebuilt,
            "signed_by": self.signed_by,
        }
        if self.proof is not None:
            out |= {
                "signer_trusted": self.signer_trusted,
                "proof": dict(self.proof),
                "replayed": self.replayed,
                "replay_tokens": self.replay_tokens,
                "replay_s": self.replay_s,
            }
        return out
