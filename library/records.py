"""Plain records the library hands out (no SQLite types leak out of library/)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from .tokens import unpack_tokens

KINDS = ("solution", "document", "prefix", "answer", "session", "cache")
# what a pack may carry: an "answer" entry (a solution's answer-ready state: its text and all but the
# last token of its question suffix) is made where it is used, never exported
PACK_KINDS = ("solution", "document", "prefix")
# kinds that are not knowledge to answer from: an answer-ready state (its solution is the knowledge) and a
# session (a conversation's state, app/answer/chat.py), a cache state (the server's prompt cache, app/serve/);
# ask, search, the window's table and the library's token count skip them (SQL)
NOT_KNOWLEDGE = "('answer', 'session', 'cache')"
UNPROVEN = "unproven"
LOCAL = "local"
REPLAYED = "replayed"


def signed_proof(name: str) -> str:
    return f"signed:{name}"


# what makes an entry graftable besides its fingerprint (SQL over `entries e`; Entry.graftable in Python):
# intact, and a proof that Entry.proven accepts (local, replayed, signed:<name>)
GRAFTABLE = "e.damaged IS NULL AND (e.proof IN ('local', 'replayed') OR e.proof LIKE 'signed:_%')"


# kinds whose stored tokens are a transcript (decoded replies included), not their text tokenized again
TRANSCRIPT_KINDS = ("session", "cache")


@dataclass(frozen=True)
class ModelRecord:
    sha256: str
    name: str
    architecture: str
    size_bytes: int


@dataclass(frozen=True)
class Entry:
    id: int
    kind: str
    title: str | None
    question: str | None
    text: str
    n_tokens: int
    tokens_sha256: str
    answer: str | None
    blob_sha256: str
    blob_size: int
    fingerprint: str
    model_sha256: str | None
    source: str
    pack_id: int | None
    created_at: str
    verified_at: str | None
    damaged: str | None
    tokens_blob: bytes
    receipt: dict | None = None
    checker: str | None = None
    proof: str = "unproven"  # local / replayed / signed:<key name> / unproven (library/schema.py m007)
    schedule: dict | None = None  # None: one prefill of the text in chunks of n_batch from position 0
    vouched_by: str | None = None  # who vouched for the answer; None: stated, not verified
    checked_at: str | None = None  # when a verify run last checked it here (None: never; library/schema.py m016)
    check_ok: bool | None = None  # whether every check of that run passed

    @property
    def tokens(self) -> list[int]:
        return unpack_tokens(self.tokens_blob)

    @property
    def verified(self) -> bool:
        """The stored answer was vouched for (a checker, a trusted signer, or a person)."""
        return self.answer is not None and self.vouched_by is not None

    @property
    def proven(self) -> bool:
        """local, replayed or signed:<name>: any other value (unproven, empty, unknown) is not a proof."""
        return self.proof in (LOCAL, REPLAYED) or (self.proof.startswith("signed:") and len(self.proof) > 7)

    def graftable(self, fingerprint: str) -> bool:
        """This engine may graft the state: made under its fingerprint, intact, and of proven origin."""
        return self.fingerprint == fingerprint and self.damaged is None and self.proven

    def summary(self, fingerprint: str | None = None) -> dict:
        """The JSON shape `kvgraft list --json` prints (a contract: id, kind, question, tokens, blob_sha256)."""
        out = {
            "id": self.id,
            "kind": self.kind,
            "title": self.title,
            "question": self.question,
            "answer": self.answer,
            "tokens": self.n_tokens,
            "blob_sha256": self.blob_sha256,
            "blob_size": self.blob_size,
            "source": self.source,
            "created_at": self.created_at,
            "verified_at": self.verified_at,
            "damaged": self.damaged,
            "proof": self.proof,
            "verified": self.verified,
            "verified_by": self.vouched_by,
        }
        if fingerprint is not None:
            out["graftable"] = self.graftable(fingerprint)
        return out

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("tokens_blob")
        return d

    @classmethod
    def from_row(cls, row: dict) -> "Entry":
        return cls(
            id=row["id"],
            kind=row["kind"],
            title=row["title"],
            question=row["question"],
            text=row["text"],
            n_tokens=row["n_tokens"],
            tokens_sha256=row["tokens_sha256"],
            answer=row["answer"],
            blob_sha256=row["blob_sha256"],
            blob_size=row["blob_size"],
            fingerprint=row["fingerprint"],
            model_sha256=row["model_sha256"],
            source=row["source"],
            pack_id=row["pack_id"],
            created_at=row["created_at"],
            verified_at=row["verified_at"],
            damaged=row["damaged"],
            tokens_blob=row["tokens"],
            receipt=json.loads(row["receipt"]) if row.get("receipt") else None,
            checker=row.get("checker"),
            proof=row.get("proof") or UNPROVEN,
            schedule=json.loads(row["schedule"]) if row.get("schedule") else None,
            checked_at=row.get("checked_at"),
            check_ok=None if row.get("check_ok") is None else bool(row["check_ok"]),
            vouched_by=row.get("vouched_by"),
        )
