"""A fleet's shared prompt cache on a remote (docs/remote-format.md, "The shared prompt cache").

Under a remote's prefix, beside the knowledge entries' manifests and index:

    cache/<key>.json          one record per cache state: which blob, of which tokens, under which engine
    blobs/sha256/<hex>        the state's compact container (the same blob store as knowledge entries)

`key` = SHA-256 of "<engine fingerprint>:<SHA-256 of the prefix's token ids>" (library/tokens.py), so an
instance finds a state by computing the keys of its prompt's candidate boundaries and GETting them: no
listing, no index rewritten per state. A record is the canonical JSON of its fields, signed (Ed25519,
library/signing.py) by the instance that computed the state: a reader grafts it only when the signature
verifies with a key it trusts and the fingerprint is its own (app/serve/shared_cache.py). Written once
(If-None-Match: *), blob first and record last, so a record never names a blob the bucket lacks.

Lookups use their own S3 client: one attempt, short timeouts (the remote's client retries 3 times with
5 s / 30 s timeouts: right for a push, not for a lookup in a request's time to first token).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import BlobMissing, RemoteError
from .remote import RemoteSpec, S3BlobStore, _is_missing, _new_client, describe
from .signing import Signer, SigningError, sign_manifest, verify_signature

RECORD_KIND = "kvgraft-cache-record"
RECORD_FORMAT = 1
MAX_RECORD_BYTES = 64 << 10
_HEX = re.compile(r"^[0-9a-f]{64}$")


class RecordError(RemoteError):
    """A cache record that is malformed, unsigned, or signed by a key that does not verify."""


def cache_key(fingerprint: str, tokens_sha256: str) -> str:
    return hashlib.sha256(f"{fingerprint}:{tokens_sha256}".encode()).hexdigest()


@dataclass(frozen=True)
class CacheRecord:
    fingerprint: str
    tokens_sha256: str
    n_tokens: int
    blob_sha256: str  # of the canonical state
    blob_size: int  # canonical bytes
    stored_size: int  # the container's bytes on the remote (what a fetch moves)

    @property
    def key(self) -> str:
        return cache_key(self.fingerprint, self.tokens_sha256)

    def body(self) -> bytes:
        """What is signed: the canonical JSON of the fields (changing it changes every signature)."""
        return json.dumps({"kind": RECORD_KIND, "format": RECORD_FORMAT, **asdict(self)}, sort_keys=True).encode()


def signed_record(record: CacheRecord, private_key: Path) -> bytes:
    """The object written at cache/<key>.json: the record's body and its signature."""
    body = record.body()
    signature = json.loads(sign_manifest(body, private_key))
    return json.dumps({"record": body.decode(), "signature": signature}, sort_keys=True).encode()


def read_record(raw: bytes) -> tuple[CacheRecord, Signer]:
    """The record and who signed it; RecordError for anything malformed or a signature that does not verify."""
    try:
        outer = json.loads(raw)
        body = outer["record"].encode()
        fields = json.loads(body)
        if fields.pop("kind") != RECORD_KIND or fields.pop("format") != RECORD_FORMAT:
            raise ValueError("not a kvgraft cache record of a format this kvgraft reads")
        record = CacheRecord(**fields)
        hashes = (record.tokens_sha256, record.blob_sha256)
        sizes = (record.n_tokens, record.blob_size, record.stored_size)
        if not isinstance(record.fingerprint, str) or not all(isinstance(h, str) and _HEX.match(h) for h in hashes):
            raise ValueError("a hash that is not 64 hex digits")
        if not all(type(n) is int and n > 0 for n in sizes):
            raise ValueError("a count or size that is not a positive integer")
        signature = outer.get("signature")
        if not isinstance(signature, dict):
            raise RecordError("the record is not signed")
        signer = verify_signature(body, json.dumps(signature).encode())
    except RecordError:
        raise
    except SigningError as exc:
        raise RecordError(f"its signature does not verify ({exc})") from exc
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise RecordError(f"a malformed record ({type(exc).__name__}: {str(exc)[:120]})") from exc
    return record, signer


def lookup_client(spec: RemoteSpec, timeout_s: float):
    """An S3 client for lookups: one attempt, connect and read timeouts of `timeout_s`."""
    return _new_client(spec, max_pool=32, attempts=1, connect_s=timeout_s, read_s=timeout_s)


class RemoteCacheStore:
    """A remote's cache records, over its blob store (its own client: lookups, or uploads)."""

    def __init__(self, spec: RemoteSpec, client=None) -> None:
        self.spec = spec
        self.blobs = S3BlobStore(spec, client)

    def record_key(self, key: str) -> str:
        return f"{self.spec.prefix}cache/{key}.json"

    def get_record(self, key: str) -> bytes | None:
        """The record object at `key`, None when there is none (an error reaching the remote raises)."""
        try:
            return self.blobs.get_key(self.record_key(key), limit=MAX_RECORD_BYTES)
        except BlobMissing:
            return None

    def put(self, record: CacheRecord, signed: bytes, stored: bytes) -> bool:
        """Blob first, record last, each written once; False when the record was there already."""
        self.blobs.add_stored(record.blob_sha256, stored)
        return self.blobs.put_once(self.record_key(record.key), signed)

    def records(self) -> list[tuple[str, float]]:
        """(key, last modified as a Unix time) of every record."""
        base = f"{self.spec.prefix}cache/"
        out = []
        try:
            for page in self.blobs.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.spec.bucket, Prefix=base
            ):
                for obj in page.get("Contents", []):
                    name = obj["Key"][len(base) :]
                    if name.endswith(".json") and _HEX.match(name[:-5]):
                        out.append((name[:-5], obj["LastModified"].timestamp()))
        except Exception as exc:
            raise describe(exc, self.spec) from exc
        return out

    def blob_ages(self) -> dict[str, float]:
        """{blob SHA-256: last modified} of every blob."""
        base = f"{self.spec.prefix}blobs/sha256/"
        out = {}
        try:
            for page in self.blobs.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.spec.bucket, Prefix=base
            ):
                for obj in page.get("Contents", []):
                    name = obj["Key"][len(base) :]
                    if _HEX.match(name):
                        out[name] = obj["LastModified"].timestamp()
        except Exception as exc:
            raise describe(exc, self.spec) from exc
        return out

    def delete(self, key: str) -> None:
        try:
            self.blobs.client.delete_object(Bucket=self.spec.bucket, Key=key)
        except Exception as exc:
            if not _is_missing(exc):
                raise describe(exc, self.spec) from exc


def gc_cache(
    store: RemoteCacheStore,
    knowledge_blobs: set[str],
    older_than_s: float,
    grace_s: float = 3600.0,
    now: float | None = None,
    budget_bytes: int | None = None,
) -> dict:
    """Remove cache records older than `older_than_s` and, past `budget_bytes` of the blobs the rest name,
    the oldest of those too; then the blobs no record and no knowledge manifest names, once older than
    `grace_s` (an upload writes its blob before its record: a blob younger than the grace period may be
    one whose record is on its way). Never a blob a manifest names."""
    now = time.time() if now is None else now
    removed_records, kept = 0, []
    for key, modified in sorted(store.records(), key=lambda km: -km[1]):  # newest first
        if now - modified > older_than_s:
            store.delete(store.record_key(key))
            removed_records += 1
            continue
        raw = store.get_record(key)
        try:
            record, _ = read_record(raw) if raw is not None else (None, None)
        except RecordError:
            record = None  # a malformed record names nothing; it ages out like the rest
        if record is not None:
            kept.append((key, record))
    named, total = set(), 0
    for key, record in kept:  # newest first: the oldest go past the budget
        size = 0 if record.blob_sha256 in named else record.stored_size
        if budget_bytes is not None and total + size > budget_bytes:
            store.delete(store.record_key(key))
            removed_records += 1
            continue
        total += size
        named.add(record.blob_sha256)
    removed_blobs, kept_young = 0, 0
    for sha, modified in store.blob_ages().items():
        if sha in named or sha in knowledge_blobs:
            continue
        if now - modified <= grace_s:
            kept_young += 1
            continue
        store.delete(store.blobs.key(sha))
        removed_blobs += 1
    return {
        "records_removed": removed_records,
        "blobs_removed": removed_blobs,
        "blobs_in_grace": kept_young,
        "bytes_named": total,
    }
