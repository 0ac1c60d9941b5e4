"""The one receipt type: what a stored state was shown to do, in hashes anyone can re-check.

A receipt names a probe (the continuation decoded after the state: a solution's question suffix,
the document probe, the last token of an answer-ready state's suffix, a thread's new segment), the
SHA-256 of the probe's tokens, the decode calls it was decoded in, and the SHA-256 of the logits
after it in a fresh run; where the graft was compared too, the grafted logits' SHA-256 and whether
they were equal (`equal` is only ever that comparison). `computed` says which run made it: a deposit
("deposit"), an import's replay ("replay"), `verify --replay`, or a conversation turn ("chat").

Every maker builds one through `Receipt.compared` or `Receipt.fresh`; every reader goes through
`Receipt.read`, which also reads the shapes stored before this type (a thread's old
{logits_before_reply_sha256, format}, deposits without `computed`). `as_dict` is the stored shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvgraft.app.proof.prompts import DOCUMENT_PROBE
from kvgraft.app.proof.solution_format import question_suffix
from kvgraft.library.tokens import tokens_sha256

# the probe text an answer-ready state's receipt records: only the last token of the question suffix
# follows that state (the rest of the suffix is part of it)
ANSWER_READY_PROBE = "<the last token of the question suffix>"
SESSION_PROBE = "<the thread's new segment>"  # a conversation turn: the user's message as the format puts it
KINDS_OF_RUN = ("deposit", "replay", "verify --replay", "chat")


def probe_for(model, kind: str, question: str | None, text: str | None = None) -> tuple[str, list[int]]:
    """(the probe text a receipt records, its tokens) for an entry of `kind`: a solution's question
    suffix (for its stored `text`'s format, app/proof/solution_format.py; None: the Q/A format), an
    answer-ready state's last suffix token, else the document probe."""
    if kind in ("solution", "answer") and question:
        suffix, tokens = question_suffix(model, text if text is not None else "Q: ", question)
        return (ANSWER_READY_PROBE, tokens[-1:]) if kind == "answer" else (suffix, tokens)
    return DOCUMENT_PROBE, model.tokenize(DOCUMENT_PROBE, add_bos=False)


@dataclass(frozen=True)
class Receipt:
    probe: str
    probe_tokens_sha256: str | None  # None only in a thread's receipt stored before this type
    # the logits after the probe in the run that made the receipt: a fresh run for a deposit, a replay or
    # verify; for a conversation turn ("chat") the turn's own run (its state grafted from the previous
    # turn), stored as "logits_before_reply_sha256": what `chat say --check` compares with a replay
    fresh_logits_sha256: str
    graft_logits_sha256: str | None = None  # None: the graft was not compared when this receipt was made
    probe_calls: tuple[int, ...] | None = None  # the decode calls of the probe (None: one call)
    computed: str = "deposit"
    format: str | None = None  # a conversation turn's prompt format

    @property
    def equal(self) -> bool | None:
        """Whether the grafted logits equalled the fresh ones when this receipt was made; None: not compared."""
        return None if self.graft_logits_sha256 is None else self.graft_logits_sha256 == self.fresh_logits_sha256

    @classmethod
    def compared(
        cls,
        probe: str,
        probe_tokens: Sequence[int],
        fresh_sha256: str,
        graft_sha256: str,
        calls: Sequence[int] | None = None,
        computed: str = "deposit",
    ) -> "Receipt":
        """A receipt of a graft compared with a fresh run on the same probe."""
        return cls(probe, tokens_sha256(probe_tokens), fresh_sha256, graft_sha256, _calls(calls), computed)

    @classmethod
    def fresh(
        cls,
        probe: str,
        probe_tokens: Sequence[int],
        fresh_sha256: str,
        computed: str,
        calls: Sequence[int] | None = None,
        format: str | None = None,  # noqa: A002 (the stored key)
    ) -> "Receipt":
        """A receipt of a fresh run only (a replay, a conversation turn): graft not compared here."""
        return cls(probe, tokens_sha256(probe_tokens), fresh_sha256, None, _calls(calls), computed, format)

    @classmethod
    def read(cls, raw) -> "Receipt | None":
        """A stored receipt in any shape kvgraft has written; None for none or one that is not a receipt."""
        if not isinstance(raw, dict):
            return None
        fresh = raw.get("fresh_logits_sha256", raw.get("logits_before_reply_sha256"))
        if not _is_sha(fresh):
            return None
        chat = "logits_before_reply_sha256" in raw and "fresh_logits_sha256" not in raw
        calls = raw.get("probe_calls")
        ok_calls = isinstance(calls, list) and calls and all(type(c) is int and c >= 1 for c in calls)
        graft = raw.get("graft_logits_sha256")
        probe_sha = raw.get("probe_tokens_sha256")
        return cls(
            probe=str(raw.get("probe", SESSION_PROBE if chat else "")),
            probe_tokens_sha256=probe_sha if _is_sha(probe_sha) else None,
            fresh_logits_sha256=fresh,
            graft_logits_sha256=graft if _is_sha(graft) else None,
            probe_calls=tuple(calls) if ok_calls else None,
            computed=str(raw.get("computed", "chat" if chat else "deposit")),
            format=raw.get("format") if isinstance(raw.get("format"), str) else None,
        )

    def as_dict(self) -> dict:
        """The stored shape (JSON in the index and in pack manifests)."""
        logits_key = "logits_before_reply_sha256" if self.computed == "chat" else "fresh_logits_sha256"
        out = {
            "probe": self.probe,
            "probe_tokens_sha256": self.probe_tokens_sha256,
            logits_key: self.fresh_logits_sha256,
            "computed": self.computed,
        }
        if self.probe_calls is not None:
            out["probe_calls"] = list(self.probe_calls)
        if self.graft_logits_sha256 is not None:
            out["graft_logits_sha256"] = self.graft_logits_sha256
            out["equal"] = self.equal
        if self.format is not None:
            out["format"] = self.format
        return out

    def is_for(self, continuation: Sequence[int]) -> bool:
        """Whether `continuation` is this receipt's probe (its tokens' SHA-256)."""
        return self.probe_tokens_sha256 is not None and tokens_sha256(continuation) == self.probe_tokens_sha256

    def matches(self, continuation: Sequence[int], logits_sha256: str) -> bool | None:
        """True/False: logits after `continuation` compared with this receipt's fresh ones; None when
        `continuation` is not its probe (nothing to compare with)."""
        return logits_sha256 == self.fresh_logits_sha256 if self.is_for(continuation) else None

    def calls_for(self, continuation: Sequence[int]) -> list[int] | None:
        """The decode calls this receipt's probe was decoded in, when `continuation` is that probe (so a
        comparison runs the same schedule); None (one call) otherwise."""
        calls = self.probe_calls
        if calls is None or not self.is_for(continuation) or sum(calls) != len(continuation):
            return None
        return list(calls)


def _calls(calls: Sequence[int] | None) -> tuple[int, ...] | None:
    return tuple(int(c) for c in calls) if calls else None


def _is_sha(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
