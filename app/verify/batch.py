"""Verify packs or library entries, and re-check a receipts file: the use cases behind `kvgraft
verify` and the window's "Verify selected" (both call `verify_targets`).

The checks themselves (blob hash, bit-exact replay, graft vs fresh probes, answers) are in
app/verify/items.py; this module gathers what to check, runs it, and shapes the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.packs.admission import state_size_limit
from kvgraft.app.packs.imports import trusted_name
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.service import LibraryService
from kvgraft.app.verify.items import (
    compare_receipts,
    library_items,
    pack_inputs,
    pack_items,
    receipts_sha256,
    run_verify,
)
from kvgraft.library.errors import LibraryError
from kvgraft.library.records import Entry

RECEIPTS_KIND = "kvgraft-verify-receipts"


@dataclass(frozen=True)
class VerifyOutcome:
    receipts: dict  # the receipts document: inputs, options, per-entry results and hashes, failures

    @property
    def ok(self) -> bool:
        return bool(self.receipts["ok"])

    @property
    def entries(self) -> int:
        return self.receipts["entries"]

    @property
    def failures(self) -> list[dict]:
        return self.receipts["failures"]

    def as_dict(self, receipts_path: Path | None = None) -> dict:
        """The JSON contract of `kvgraft verify --json`."""
        return {
            "ok": self.ok,
            "entries": self.entries,
            "failures": self.failures,
            "fingerprint": self.receipts["fingerprint"],
            "receipts": str(receipts_path) if receipts_path else None,
            "receipts_sha256": receipts_sha256(self.receipts),
        }


@dataclass(frozen=True)
class RecheckOutcome:
    """`verify --receipts FILE --check`: the recorded run repeated and every hash compared."""

    entries: int
    differences: list[dict]  # hashes that did not reproduce
    recorded_failures: list[dict]  # checks the recorded run itself failed
    receipts_sha256: str

    @property
    def ok(self) -> bool:
        return not self.differences and not self.recorded_failures

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "entries": self.entries,
            "failures": self.differences,
            "recorded_failures": self.recorded_failures,
            "hashes_reproduced": not self.differences,
            "receipts_sha256": self.receipts_sha256,
        }


def verify_targets(
    service: LibraryService,
    *,
    packs: Sequence[Path] = (),
    entries: list[Entry] | None = None,
    replay: bool = False,
    samples: int = 1,
    progress: Progress = no_progress,
    expected_pack_sha: dict[str, str] | None = None,
) -> VerifyOutcome:
    """Verify each pack in `packs` and the library `entries` (None: no library input)."""
    lib, engine = service.library, service.engine
    readers = []
    try:
        items, inputs = [], []
        for p in packs:
            inp, reader = pack_inputs(p)
            readers.append(reader)
            reader.max_blob_size = state_size_limit(engine)
            if expected_pack_sha is not None and inp["sha256"] != expected_pack_sha.get(str(Path(p).resolve())):
                raise LibraryError(f"{p} is not the pack the receipts name (its SHA-256 changed)")
            inputs.append(inp)
            signer = trusted_name(reader.signer, trust_store(lib.root))
            items += pack_items(reader, inp["sha256"], trusted_signer=signer)
        if entries is not None:
            inputs.append({"type": "library", "path": str(lib.root), "entries": len(entries)})
            items += library_items(service, entries)
        if not items:
            raise LibraryError("nothing to verify: the library is empty")
        return VerifyOutcome(run_verify(service, items, inputs, replay, samples, progress=progress))
    finally:
        for r in readers:
            r.close()


def recheck_receipts(service: LibraryService, old: dict, progress: Progress = no_progress) -> RecheckOutcome:
    """Re-run what a receipts file records (the same packs, entries, options) and compare every hash."""
    packs = [Path(i["path"]) for i in old["inputs"] if i["type"] == "pack"]
    entries = None
    if any(i["type"] == "library" for i in old["inputs"]):
        refs = {r["ref"] for r in old["results"]}
        entries = [e for e in service.library.entries() if f"library#{e.id}" in refs]
    out = verify_targets(
        service,
        packs=packs,
        entries=entries,
        replay=old["options"]["replay"],
        samples=old["options"]["samples"],
        progress=progress,
        expected_pack_sha={i["path"]: i["sha256"] for i in old["inputs"] if i["type"] == "pack"},
    )
    recorded = old.get("failures") or ([{"entry": None, "check": "ok"}] if old.get("ok") is not True else [])
    return RecheckOutcome(len(old["results"]), compare_receipts(old, out.receipts), recorded, receipts_sha256(old))
