"""Ed25519 signatures over a pack's manifest (which fixes every blob's SHA-256).

A signed pack holds `signature.json` next to `manifest.json`:
    {"algorithm": "ed25519", "public_key": <base64 raw 32 bytes>, "key_id": <sha256(public key)[:16] hex>,
     "signature": <base64 signature of the exact manifest.json bytes>}
Needs the optional `cryptography` package (pip install 'kvgraft[sign]'); without it, signed packs
cannot be made or checked, and `--require-signed` refuses everything.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import LibraryError

SIGNATURE = "signature.json"


class SigningError(LibraryError):
    """A key or signature problem: missing package, bad key file, a signature that does not verify."""


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    except ImportError as exc:
        raise SigningError(
            "pack signing needs the optional 'cryptography' package: pip install 'kvgraft[sign]'"
        ) from exc
    return Ed25519PrivateKey, Ed25519PublicKey, serialization, InvalidSignature


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


@dataclass(frozen=True)
class Signer:
    key_id: str
    public_key_b64: str


def generate_key(path: Path) -> Signer:
    """Write a new private key (PEM, mode 0600) to `path` and return its public identity."""
    priv_cls, _, ser, _ = _crypto()
    key = priv_cls.generate()
    pem = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return public_identity(path)


def _load_private(path: Path):
    _, _, ser, _ = _crypto()
    try:
        return ser.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SigningError(f"cannot load the private key {path}: {exc}") from exc


def public_identity(path: Path) -> Signer:
    _, _, ser, _ = _crypto()
    raw = _load_private(path).public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    return Signer(key_id(raw), base64.b64encode(raw).decode())


def sign_manifest(manifest_bytes: bytes, private_key_path: Path) -> bytes:
    """The signature.json member for these exact manifest bytes."""
    _, _, ser, _ = _crypto()
    key = _load_private(private_key_path)
    raw = key.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    sig = key.sign(manifest_bytes)
    return json.dumps(
        {
            "algorithm": "ed25519",
            "public_key": base64.b64encode(raw).decode(),
            "key_id": key_id(raw),
            "signature": base64.b64encode(sig).decode(),
        },
        sort_keys=True,
    ).encode()


def verify_signature(manifest_bytes: bytes, signature_member: bytes) -> Signer:
    """Check signature.json against the manifest bytes; return the signer or raise SigningError."""
    _, pub_cls, _, invalid = _crypto()
    try:
        sig = json.loads(signature_member.decode("utf-8"))
        if not isinstance(sig, dict) or sig.get("algorithm") != "ed25519":
            raise ValueError("algorithm must be ed25519")
        raw = base64.b64decode(sig["public_key"], validate=True)
        signature = base64.b64decode(sig["signature"], validate=True)
        public = pub_cls.from_public_bytes(raw)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise SigningError(f"signature.json is malformed: {type(exc).__name__}: {str(exc)[:200]}") from exc
    try:
        public.verify(signature, manifest_bytes)
    except invalid as exc:
        raise SigningError("the pack's signature does not verify: the manifest was changed after signing") from exc
    return Signer(key_id(raw), base64.b64encode(raw).decode())


class TrustStore:
    """Trusted signer keys: `<data dir>/trusted_keys.json` = {key_id: {"name", "public_key"}}."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> dict:
        """The trusted keys; a missing file is an empty list, a corrupt one an error (never silently empty)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise SigningError(f"the trusted-keys file {self.path} is unreadable: {exc}") from exc
        if not isinstance(data, dict):
            raise SigningError(f"the trusted-keys file {self.path} is not a JSON object")
        return data

    def _save(self, keys: dict) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as fh:
            fh.write(json.dumps(keys, indent=1, sort_keys=True))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def trusts(self, signer: Signer) -> bool:
        """The signer's whole public key (not only its short id) is in the list."""
        entry = self.load().get(signer.key_id)
        return bool(entry) and entry.get("public_key") == signer.public_key_b64

    def trust(self, public_key_b64: str, name: str) -> str:
        try:
            raw = base64.b64decode(public_key_b64, validate=True)
        except ValueError as exc:
            raise SigningError(f"not a base64 public key: {exc}") from exc
        if len(raw) != 32:
            raise SigningError("an Ed25519 public key is 32 bytes")
        keys = self.load()
        kid = key_id(raw)
        keys[kid] = {"name": name, "public_key": base64.b64encode(raw).decode()}
        self._save(keys)
        return kid

    def untrust(self, kid: str) -> bool:
        keys = self.load()
        if keys.pop(kid, None) is None:
            return False
        self._save(keys)
        return True

    def name_of(self, kid: str) -> str | None:
        entry = self.load().get(kid)
        return entry["name"] if entry else None
