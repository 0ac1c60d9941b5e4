"""The pack manifest (`manifest.json`): its schema, the parser every import runs, and the writer
every export runs, side by side so that they change together (docs/pack-format.md).

Parsing validates the whole manifest before anything else looks at it; every failure is a
PackError whose message names the problem. FORMAT_VERSION goes up with any change a reader of
the old version could misread.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Sequence

from .errors import LibraryError
from .records import PACK_KINDS as KINDS
from .records import Entry, ModelRecord
from .schedule import parse_pack_schedule

FORMAT_VERSION = 3
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 256 << 20
MAX_MEMBERS = 2_000_001
MAX_TEXT_CHARS = 50_000_000
_SHA = re.compile(r"^[0-9a-f]{64}$")
_BLOB_MEMBER = re.compile(r"^blobs/([0-9a-f]{64})$")


class PackError(LibraryError):
    """A pack is malformed, unsafe, from a newer format, or does not match what it declares."""


@dataclass(frozen=True)
class PackEntry:
    """One entry as a pack or a remote manifest declares it, parsed and checked once. Every field is a
    claim of whoever made the manifest until the import proves it (app/packs/admission.py): `proof`
    and `vouched_by` count only where a key this library trusts signed them."""

    position: int  # its place in the manifest's entry list
    blob_sha256: str  # the blob's name in the pack: its content address (format 1: of llama.cpp's bytes)
    blob_size: int  # the bytes the SHA-256 is of (canonical)
    blob_stored_size: int  # the member's size: a compact container in format 2, = blob_size in format 1
    kind: str
    title: str | None
    question: str | None
    text: str
    answer: str | None
    n_tokens: int
    tokens_sha256: str
    checker: str | None
    receipt: dict | None
    schedule: dict | None = None  # the chunked prefill that made the state (library/schedule.py)
    vouched_by: str | None = None  # who the exporter says vouched for the answer (`verified_by` on the wire)
    proof: str | None = None  # how the exporter says it knew the state


@dataclass(frozen=True)
class Manifest:
    format_version: int
    kvgraft_version: str
    model_sha256: str
    model_name: str
    model_architecture: str
    fingerprint: str
    entries: tuple[PackEntry, ...]
    raw: dict
    engine: dict | None = None  # format 3: what the fingerprint stands for (config and probe hashes)


def _fail(msg: str) -> PackError:
    return PackError(msg)


def _get(obj: dict, key: str, types, where: str, optional: bool = False):
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise _fail(f"manifest: {where} is missing '{key}'")
    value = obj[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise _fail(f"manifest: {where} '{key}' has the wrong type (bool)")
    if not isinstance(value, types):
        names = "/".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise _fail(f"manifest: {where} '{key}' must be {names}, got {type(value).__name__}")
    return value


def _sha(value: str, where: str) -> str:
    if not _SHA.match(value):
        raise _fail(f"manifest: {where} is not a SHA-256 hex digest")
    return value


def parse_manifest(raw: dict) -> Manifest:
    """Check the manifest's schema; unknown extra keys are ignored (forward compatibility)."""
    if not isinstance(raw, dict):
        raise _fail("manifest: the top level must be a JSON object")
    version = _get(raw, "format_version", int, "the pack")
    if version > FORMAT_VERSION:
        raise _fail(
            f"pack format version {version} is newer than this kvgraft reads ({FORMAT_VERSION}); upgrade kvgraft"
        )
    if version < 1:
        raise _fail(f"pack format version {version} is not valid")
    kv_version = _get(raw, "kvgraft_version", str, "the pack")
    model = _get(raw, "model", dict, "the pack")
    fingerprint = _sha(_get(raw, "fingerprint", str, "the pack"), "fingerprint")
    if version >= 3:
        _get(raw, "engine", dict, "the pack")  # what the fingerprint stands for: config and probe hashes
    items = _get(raw, "entries", list, "the pack")
    if not items:
        raise _fail("the pack is empty: its manifest lists no entries")
    entries = []
    for i, item in enumerate(items):
        where = f"entry {i}"
        if not isinstance(item, dict):
            raise _fail(f"manifest: {where} must be an object")
        kind = _get(item, "kind", str, where)
        if kind not in KINDS:
            raise _fail(f"manifest: {where} kind {kind!r} is not one of {', '.join(KINDS)}")
        size = _get(item, "blob_size", int, where)
        n_tokens = _get(item, "n_tokens", int, where)
        if size < 1 or n_tokens < 1:
            raise _fail(f"manifest: {where} has a non-positive blob_size or n_tokens")
        stored_size = _get(item, "blob_stored_size", int, where) if version >= 2 else size
        if stored_size < 1:
            raise _fail(f"manifest: {where} has a non-positive blob_stored_size")
        text = _get(item, "text", str, where)
        if len(text) > MAX_TEXT_CHARS:
            raise _fail(f"manifest: {where} text is longer than {MAX_TEXT_CHARS:,} characters")
        receipt = _get(item, "receipt", dict, where, optional=True)
        try:
            schedule = parse_pack_schedule(item.get("schedule"))
        except ValueError as exc:
            raise _fail(f"manifest: {where}: {exc}") from exc
        vouched = item.get("verified_by")
        entries.append(
            PackEntry(
                position=i,
                blob_sha256=_sha(_get(item, "blob_sha256", str, where), f"{where} blob_sha256"),
                blob_size=size,
                blob_stored_size=stored_size,
                kind=kind,
                text=text,
                n_tokens=n_tokens,
                title=_get(item, "title", str, where, optional=True),
                question=_get(item, "question", str, where, optional=True),
                answer=_get(item, "answer", str, where, optional=True),
                tokens_sha256=_sha(_get(item, "tokens_sha256", str, where), f"{where} tokens_sha256"),
                checker=_get(item, "checker", str, where, optional=True),
                receipt=receipt,
                schedule=schedule,
                vouched_by=vouched.strip() if isinstance(vouched, str) and vouched.strip() else None,
                proof=item.get("proof") if isinstance(item.get("proof"), str) else None,
            )
        )
    return Manifest(
        format_version=version,
        kvgraft_version=kv_version,
        model_sha256=_sha(_get(model, "sha256", str, "model"), "model sha256"),
        model_name=_get(model, "name", str, "model"),
        model_architecture=_get(model, "architecture", str, "model"),
        fingerprint=fingerprint,
        entries=tuple(entries),
        raw=raw,
        engine=raw.get("engine") if isinstance(raw.get("engine"), dict) else None,
    )


def build_manifest(
    entries: Sequence[Entry],
    model: ModelRecord,
    engine_info: dict,
    stored_sizes: dict[str, int | None],
    kvgraft_version: str,
) -> dict:
    """The manifest of an export of `entries` (one fingerprint, canonical blobs): what
    `parse_manifest` reads back. `engine_info` is the library's record of the engine the entries
    were made under ({"info", "environment"}); `stored_sizes` the pack member size of each blob."""
    return {
        "format_version": FORMAT_VERSION,
        "kvgraft_version": kvgraft_version,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {"sha256": model.sha256, "name": model.name, "architecture": model.architecture},
        "fingerprint": entries[0].fingerprint,
        "engine": engine_info["info"],
        "environment": engine_info["environment"],
        "entries": [
            {
                "blob_sha256": e.blob_sha256,
                "blob_size": e.blob_size,
                "blob_stored_size": stored_sizes[e.blob_sha256],
                "kind": e.kind,
                "title": e.title,
                "question": e.question,
                "text": e.text,
                "answer": e.answer,
                "n_tokens": e.n_tokens,
                "tokens_sha256": e.tokens_sha256,
                "checker": e.checker,
                "receipt": e.receipt,
                "proof": e.proof,
                "verified_by": e.vouched_by,
                "schedule": e.schedule,
            }
            for e in entries
        ],
    }
