"""The remote tier: a library's knowledge in an S3 bucket (docs/remote-format.md).

Only the S3 API, through boto3 (credentials, region and profile from boto3's usual environment
variables and files), so AWS S3, MinIO, Ceph RGW or R2 need no other code; tested against
SeaweedFS 4.48. Under `s3://BUCKET/PREFIX/`:

    blobs/sha256/<hex>        a blob's compact container, written once (If-None-Match: *)
    manifests/<hex>.json      one push's entries: the pack manifest schema, named by its SHA-256
    manifests/<hex>.sig       its signature (the pack's signature.json), written before the manifest
    index.json                which manifests are published, replaced only with If-Match on its ETag

Every write is one single-part `put_object` carrying its condition, never boto3's transfer manager
(it switches to multipart above 8 MB, and a conditional CompleteMultipartUpload is not atomic on
every server). Blobs go first and the manifest last, so a manifest never names a blob the bucket
does not hold, whenever a push is killed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Iterator

from .errors import BlobCorrupt, BlobMissing, RemoteConflict, RemoteError
from .manifest import PackError, parse_manifest
from .signing import SigningError, verify_signature
from .stores import ObjectStore

INDEX_KIND = "kvgraft-remote-index"
INDEX_FORMAT = 1
MAX_INDEX_BYTES = 256 << 20
MAX_MANIFEST_BYTES = 256 << 20
_URL = re.compile(r"^s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?$")
_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class RemoteSpec:
    """Where a remote lives: a bucket, a key prefix ("" or ending in "/"), an optional endpoint."""

    name: str
    bucket: str
    prefix: str
    endpoint_url: str | None = None

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://BUCKET[/PREFIX]`; the prefix is normalized to end in "/"."""
    m = _URL.match(url or "")
    if not m:
        raise RemoteError(f"not an S3 URL: {url!r} (expected s3://BUCKET or s3://BUCKET/PREFIX)")
    prefix = (m.group(2) or "").strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise RemoteError(f"the prefix in {url!r} has an empty, '.' or '..' part")
    return m.group(1), prefix + "/" if prefix else ""


def _code(exc) -> tuple[str, int]:
    err = getattr(exc, "response", None) or {}
    return str(err.get("Error", {}).get("Code", "")), int(err.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _is_missing(exc) -> bool:
    """A key that is absent (never a missing bucket: that is an error to report, not an empty remote)."""
    code, status = _code(exc)
    return code != "NoSuchBucket" and (code in ("NoSuchKey", "404", "NotFound") or status == 404)


def _is_precondition(exc) -> bool:
    """412: the condition failed (the key exists, or its ETag changed)."""
    code, status = _code(exc)
    return code == "PreconditionFailed" or status == 412


def _is_conflict(exc) -> bool:
    """409: a conditional write raced another one still in flight; nothing is known yet."""
    code, status = _code(exc)
    return code == "ConditionalRequestConflict" or status == 409


def describe(exc, spec: RemoteSpec) -> RemoteError:
    """A boto3/botocore failure as one sentence a user can act on."""
    from botocore import exceptions as bx

    where = f"remote {spec.name!r} ({spec.url}" + (f" at {spec.endpoint_url}" if spec.endpoint_url else "") + ")"
    if isinstance(exc, bx.NoCredentialsError):
        return RemoteError(
            f"{where}: no S3 credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
        )
    if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ConnectionClosedError)):
        return RemoteError(f"{where}: cannot reach the endpoint ({exc})")
    if isinstance(exc, (bx.ReadTimeoutError, bx.ResponseStreamingError)):
        return RemoteError(f"{where}: the connection broke mid-transfer ({exc})")
    if isinstance(exc, bx.ClientError):
        code, status = _code(exc)
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403") or status == 403:
            return RemoteError(f"{where}: the server refused these credentials ({code or status})")
        if code == "NoSuchBucket" or (status == 404 and code in ("404", "NotFound", "")):
            return RemoteError(f"{where}: no such bucket {spec.bucket!r} (kvgraft never creates one)")
        return RemoteError(f"{where}: {code or status}: {exc}")
    if isinstance(exc, bx.BotoCoreError):
        return RemoteError(f"{where}: {exc}")
    return RemoteError(f"{where}: {type(exc).__name__}: {exc}")


_CLIENTS: dict[tuple, object] = {}
_CLIENTS_LOCK = threading.Lock()


def make_client(spec: RemoteSpec, max_pool: int = 10):
    """One boto3 client per endpoint and credentials in the environment, made once (a client takes
    ~0.15 s to build and is thread-safe)."""
    import os

    creds = tuple(
        os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN")
    )
    key = (spec.endpoint_url, max_pool, creds)
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = _new_client(spec, max_pool)
        return _CLIENTS[key]


def _new_client(spec: RemoteSpec, max_pool: int, attempts: int = 3, connect_s: float = 5, read_s: float = 30):
    import os

    import boto3
    from botocore.config import Config

    # no network but the endpoint: boto3 never asks the EC2 instance metadata service for credentials
    # unless the user says so (AWS_EC2_METADATA_DISABLED=false)
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

    cfg = Config(
        retries={"max_attempts": attempts, "mode": "standard"},
        connect_timeout=connect_s,
        read_timeout=read_s,
        max_pool_connections=max_pool,
        # the checksum boto3 adds by default is not understood by every S3 server; ask for it only when required
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", endpoint_url=spec.endpoint_url, config=cfg)


class S3BlobStore(ObjectStore):
    """`blobs/sha256/<hex>` under a remote's prefix: the remote tier of library/stores.py."""

    def __init__(self, spec: RemoteSpec, client=None) -> None:
        self.spec = spec
        self.client = client if client is not None else make_client(spec)

    def key(self, sha256: str) -> str:
        if not _HEX.match(sha256):
            raise RemoteError(f"not a SHA-256 hex digest: {sha256!r}")
        return f"{self.spec.prefix}blobs/sha256/{sha256}"

    def _call(self, fn, **kw):
        try:
            return fn(Bucket=self.spec.bucket, **kw)
        except Exception as exc:
            if _is_missing(exc) or _is_precondition(exc) or _is_conflict(exc):
                raise
            raise describe(exc, self.spec) from exc

    def stored_size(self, sha256: str) -> int | None:
        try:
            return int(self._call(self.client.head_object, Key=self.key(sha256))["ContentLength"])
        except RemoteError:
            raise
        except Exception as exc:
            if _is_missing(exc):
                return None
            raise describe(exc, self.spec) from exc

    def contains(self, sha256: str) -> bool:
        return self.stored_size(sha256) is not None

    def get_stored(self, sha256: str, limit: int | None = None) -> bytes:
        """The container as stored; BlobMissing when absent, BlobCorrupt when it is larger than
        `limit` (what its manifest declares: nothing larger is read)."""
        return self.get_key(self.key(sha256), what=f"blob {sha256[:16]}...", limit=limit)

    def add_stored(self, sha256: str, data: bytes) -> bool:
        return self.put_once(self.key(sha256), data)

    def iter_shas(self) -> Iterator[str]:
        base = f"{self.spec.prefix}blobs/sha256/"
        for key in self.list_keys(base):
            name = key[len(base) :]
            if _HEX.match(name):
                yield name

    # -- objects that are not blobs --------------------------------------------------------------
    def _get(self, key: str, limit: int | None, what: str) -> tuple[bytes, str]:
        """(body, ETag) of an object. BlobMissing when absent, BlobCorrupt when over `limit`."""
        try:
            resp = self._call(self.client.get_object, Key=key)
            return _read_bounded(resp, limit, what), resp["ETag"]
        except (RemoteError, BlobCorrupt):
            raise
        except Exception as exc:
            if _is_missing(exc):
                raise BlobMissing(f"{what} is not in remote {self.spec.name!r}") from exc
            raise describe(exc, self.spec) from exc

    def get_key(self, key: str, what: str | None = None, limit: int | None = None) -> bytes:
        return self._get(key, limit, what or key)[0]

    def get_with_etag(self, key: str, limit: int) -> tuple[bytes, str] | None:
        """(body, ETag), None when absent; an object over `limit` is an error (RemoteError)."""
        try:
            return self._get(key, limit, key)
        except BlobMissing:
            return None
        except BlobCorrupt as exc:
            raise RemoteError(f"remote {self.spec.name!r}: {exc}") from exc

    def put_once(self, key: str, data: bytes) -> bool:
        """One single-part put with If-None-Match: *; False when the key already exists. A 409 (another
        conditional write of the key still in flight) is retried: it says nothing about the outcome."""
        for attempt in range(6):
            try:
                self._call(self.client.put_object, Key=key, Body=data, IfNoneMatch="*", ContentMD5=content_md5(data))
                return True
            except RemoteError:
                raise
            except Exception as exc:
                if _is_precondition(exc):
                    return False
                if not _is_conflict(exc):
                    raise describe(exc, self.spec) from exc
                time.sleep(0.1 * 2**attempt)
        raise RemoteError(f"remote {self.spec.name!r}: {key} kept conflicting with another writer; try again")

    def remove_damaged(self, sha256: str, size: int) -> None:
        """Delete blob `sha256` if the remote holds it at a size other than `size` (a put cut off
        mid-body, on a server that kept what it got). Only for a blob no manifest names: a blob is
        otherwise never deleted or overwritten."""
        have = self.stored_size(sha256)
        if have is not None and have != size:
            self._call(self.client.delete_object, Key=self.key(sha256))

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> None:
        """Replace `key` only if its ETag is still `etag` (create it only if absent when None).
        Raises RemoteConflict when another writer got there first."""
        cond = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        try:
            self._call(
                self.client.put_object,
                Key=key,
                Body=data,
                ContentType="application/json",
                ContentMD5=content_md5(data),
                **cond,
            )
        except RemoteError:
            raise
        except Exception as exc:
            if _is_precondition(exc) or _is_conflict(exc) or (etag is not None and _is_missing(exc)):
                raise RemoteConflict(f"{key} changed while it was being updated") from exc
            raise describe(exc, self.spec) from exc

    def list_keys(self, prefix: str) -> Iterator[str]:
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.spec.bucket, Prefix=prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    yield obj["Key"]
        except RemoteError:
            raise
        except Exception as exc:
            raise describe(exc, self.spec) from exc

    def check_reachable(self) -> None:
        """The bucket exists and these credentials may read it (HEAD bucket, then a one-key list)."""
        try:
            self.client.head_bucket(Bucket=self.spec.bucket)
            self.client.list_objects_v2(Bucket=self.spec.bucket, Prefix=self.spec.prefix, MaxKeys=1)
        except Exception as exc:
            raise describe(exc, self.spec) from exc


class RemoteRepo:
    """A remote's manifests and index on top of its blob store."""

    def __init__(self, spec: RemoteSpec, client=None) -> None:
        self.spec = spec
        self.blobs = S3BlobStore(spec, client)

    @property
    def index_key(self) -> str:
        return f"{self.spec.prefix}index.json"

    def manifest_key(self, sha256: str) -> str:
        return f"{self.spec.prefix}manifests/{sha256}.json"

    def signature_key(self, sha256: str) -> str:
        return f"{self.spec.prefix}manifests/{sha256}.sig"

    def read_index(self) -> tuple[dict, str | None]:
        """(index, its ETag); an empty index and None where none was published yet."""
        got = self.blobs.get_with_etag(self.index_key, MAX_INDEX_BYTES)
        if got is None:
            return empty_index(), None
        raw, etag = got
        try:
            index = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise RemoteError(f"remote {self.spec.name!r}: index.json is not valid JSON ({exc})") from exc
        check_index(index, self.spec.name)
        return index, etag

    def update_index(self, change, attempts: int = 20) -> dict:
        """Read the index, apply `change(index)` (in place), write it back with If-Match on the
        ETag read; on a lost race read again and re-apply. Returns the index written."""
        for i in range(attempts):
            index, etag = self.read_index()
            change(index)
            body = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
            try:
                self.blobs.put_if_match(self.index_key, body, etag)
                return index
            except RemoteConflict:
                time.sleep(min(0.05 * 2**i, 1.0))
        raise RemoteError(f"remote {self.spec.name!r}: index.json kept changing; {attempts} attempts lost the race")

    def manifest_shas(self) -> list[str]:
        """Every manifest in the bucket, published in the index or not."""
        base = f"{self.spec.prefix}manifests/"
        out = []
        for key in self.blobs.list_keys(base):
            name = key[len(base) :]
            if name.endswith(".json") and _HEX.match(name[:-5]):
                out.append(name[:-5])
        return out

    def get_manifest(self, sha256: str) -> bytes:
        """A manifest's bytes, checked against its name."""
        data = self.blobs.get_key(
            self.manifest_key(sha256), what=f"manifest {sha256[:16]}...", limit=MAX_MANIFEST_BYTES
        )
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ManifestMismatch(f"manifest {sha256[:16]}... does not match its SHA-256 (damaged or tampered)")
        return data

    def read_manifest(self, sha256: str):
        """(its bytes, the parsed Manifest, the Signer or None when unsigned) of one manifest: fetched,
        checked against its name, parsed by the pack manifest's parser, its signature verified.
        Raises one of MANIFEST_ERRORS (SigningError: a signature present that does not verify)."""
        raw = self.get_manifest(sha256)
        try:
            m = parse_manifest(json.loads(raw))
        except (ValueError, RecursionError) as exc:
            raise PackError(f"manifest {sha256[:16]}... is not valid JSON: {type(exc).__name__}") from exc
        sig = self.get_signature(sha256)
        return raw, m, verify_signature(raw, sig) if sig is not None else None

    def get_signature(self, sha256: str) -> bytes | None:
        try:
            return self.blobs.get_key(self.signature_key(sha256), limit=64 << 10)
        except BlobMissing:
            return None


def _read_bounded(resp, limit: int | None, what: str) -> bytes:
    """An object's body, never more than `limit` bytes read (a larger one is BlobCorrupt, not read)."""
    body = resp["Body"]
    size = int(resp.get("ContentLength") or 0)
    if limit is None:
        return body.read()
    if size > limit:
        body.close()
        raise BlobCorrupt(f"{what} is {size:,} bytes on the remote, more than the {limit:,} allowed")
    data = body.read(limit + 1)
    if len(data) > limit:
        body.close()
        raise BlobCorrupt(f"{what} is more than the {limit:,} bytes allowed")
    return data


class ManifestMismatch(RemoteError):
    """A manifest object whose bytes are not the ones its name is the SHA-256 of."""


def empty_index() -> dict:
    return {"kind": INDEX_KIND, "format": INDEX_FORMAT, "manifests": {}}


def check_index(index, name: str) -> None:
    if not isinstance(index, dict) or index.get("kind") != INDEX_KIND:
        raise RemoteError(f"remote {name!r}: index.json is not a kvgraft remote index")
    if not isinstance(index.get("format"), int) or index["format"] > INDEX_FORMAT:
        raise RemoteError(f"remote {name!r}: index format {index.get('format')!r} is newer than this kvgraft reads")
    manifests = index.get("manifests")
    if not isinstance(manifests, dict) or not all(
        _HEX.match(k)
        and isinstance(v, dict)
        and isinstance(v.get("keys", []), list)
        and all(isinstance(x, str) and _HEX.match(x) for x in v.get("keys", []))
        for k, v in manifests.items()
    ):
        raise RemoteError(f"remote {name!r}: index.json's manifests are malformed")


def content_md5(data: bytes) -> str:
    """The Content-MD5 header of a put: a server that checks it refuses a body cut off on the way."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


def entry_key(fingerprint: str, kind: str, tokens_sha256: str, blob_sha256: str, question, answer) -> str:
    """What makes two entries the same knowledge: one key per entry in the index (push skips it)."""
    raw = json.dumps([fingerprint, kind, tokens_sha256, blob_sha256, question, answer], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


# what `RemoteRepo.read_manifest` raises for one bad manifest
MANIFEST_ERRORS = (ManifestMismatch, BlobMissing, BlobCorrupt, PackError, SigningError)
