"""Deposit and graft: the services that join the engine and the library (shared by CLI and app)."""

from __future__ import annotations

import logging
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from kvgraft.app.core.paths import data_dir
from kvgraft.app.proof.checkers import check_name
from kvgraft.app.proof.receipt import ANSWER_READY_PROBE, Receipt, probe_for
from kvgraft.app.proof.replay import decode_in_calls, prefill_in_schedule, schedule_of
from kvgraft.app.proof.solution_format import entry_tokens, stored_text
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.engine import Engine
from kvgraft.engine.errors import EngineError, FingerprintMismatch
from kvgraft.engine.session import GraftResult, Session
from kvgraft.library.errors import LibraryError
from kvgraft.library.library import Library
from kvgraft.library.records import LOCAL, Entry, ModelRecord
from kvgraft.library.tokens import tokens_sha256

log = logging.getLogger(__name__)


class UnprovenState(EngineError):
    """An entry's state is not proven to be the state of its text (it is never grafted)."""


def open_library(home: Path | None = None) -> Library:
    """The library in `home` (default: app/paths.data_dir())."""
    return Library(data_dir(home))


def model_record(engine: Engine) -> ModelRecord:
    i = engine.model.info
    return ModelRecord(sha256=i.sha256, name=i.name, architecture=i.architecture, size_bytes=i.size_bytes)


@dataclass(frozen=True)
class DepositResult:
    entry: Entry
    created: bool
    prefill_s: float  # 0 when an identical entry already existed and nothing was computed

    def as_dict(self) -> dict:
        return {
            "id": self.entry.id,
            "created": self.created,
            "blob_sha256": self.entry.blob_sha256,
            "blob_size": self.entry.blob_size,
            "tokens": self.entry.n_tokens,
            "kind": self.entry.kind,
            "prefill_s": self.prefill_s,
        }


@dataclass(frozen=True)
class ReferenceRun:
    """What a deposit's one fresh run made: the state, the answer-ready state (solutions), the probe
    and the receipt."""

    snap: object
    ready_snap: object | None
    probe: list[int]
    receipt: Receipt
    prefill_s: float


class LibraryService:
    """Engine + library. Call from the one thread that owns the engine's sessions."""

    def __init__(self, engine: Engine, library: Library) -> None:
        self.engine = engine
        self.library = library
        self._graft_buf = bytearray(0)  # reused by every graft: no page faults for a fresh allocation
        self._warm: Session | None = None  # one context kept and cleared between uses (see `session`)
        self._warm_busy = False
        library.record_engine(engine.fingerprint, engine.fingerprint_info, engine.environment)
        self._relabel_legacy()

    def _relabel_legacy(self) -> None:
        """Entries made by kvgraft before the probe fingerprint, under this engine's old-style
        fingerprint, move to its probe fingerprint once one of them is shown to make this engine's
        bits: its blob grafted here gives the fresh logits its receipt recorded. Otherwise (no
        receipt to check, or a difference) they stay for `kvgraft verify --library --replay`."""
        lib, engine = self.library, self.engine
        samples = lib.legacy_samples(engine.legacy_fingerprint)
        if not samples:
            return
        e = samples[0]
        receipt = Receipt.read(e.receipt)
        if receipt is None:
            return
        _, probe = probe_for(engine.model, e.kind, e.question, e.text)
        if not receipt.is_for(probe):
            return
        try:
            data = lib.read_blob(e, into=None)
            with engine.session() as s:
                s.graft_bytes(data, e.tokens)
                decode_in_calls(s, probe, receipt.calls_for(probe))
                same = receipt.matches(probe, logits_sha256(s.logits()))
        except (EngineError, LibraryError) as exc:
            log.info("old-style entries not relabelled: entry #%d could not be checked (%s)", e.id, exc)
            return
        if not same:
            log.warning("old-style entries not relabelled: entry #%d gives other logits here than its receipt", e.id)
            return
        moved = lib.relabel_fingerprint(engine.legacy_fingerprint, engine.fingerprint)
        log.info("relabelled %d entries from this engine's old-style fingerprint to its probe fingerprint", moved)

    def deposit(
        self,
        text: str,
        question: str | None = None,
        answer: str | None = None,
        kind: str | None = None,
        title: str | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        checker: str | None = None,
        vouched_by: str | None = None,
    ) -> DepositResult:
        """Prefill `text`, snapshot it, and store blob + entry in one transaction.

        Depositing the same text (with the same question/answer) again returns the existing entry
        without computing anything. The entry's receipt records the logits SHA-256 after a probe
        (for a solution: the question asked after a graft) fresh and grafted. `vouched_by` names who
        vouched for `answer` (a checker, a generator, "you"); without it the answer is stated only.
        """
        checker = None if checker is None else check_name(checker)  # UnknownChecker before anything is computed
        if not text or not text.strip():
            raise EngineError("nothing to deposit: the text is empty")
        kind = kind or ("solution" if answer is not None else "document")
        tokens = entry_tokens(self.engine.model, kind, text)
        limit = self.engine.config.n_ctx - 64
        if len(tokens) > limit:
            raise EngineError(
                f"the text is {len(tokens):,} tokens; this context holds at most {limit:,} (raise --n-ctx)"
            )
        same = self.library.find_same(tokens_sha256(tokens), self.engine.fingerprint, kind, question, answer)
        if same is not None and same.damaged is None and same.proven:
            return DepositResult(same, False, 0.0)
        ref = self.reference_run(tokens, kind, question, on_progress, answer_ready=kind == "solution", text=text)
        entry, created = self.library.add_entry(
            kind=kind,
            text=text,
            tokens=tokens,
            blob=ref.snap.data,
            blob_sha256=ref.snap.sha256,
            fingerprint=self.engine.fingerprint,
            model=model_record(self.engine),
            title=title or _title(text, question),
            question=question,
            answer=answer,
            receipt=ref.receipt.as_dict(),
            checker=checker,
            elided=ref.snap.elided,
            proof=LOCAL,
            schedule=schedule_of(self.engine),
            vouched_by=vouched_by if answer is not None else None,
        )
        if ref.ready_snap is not None:
            try:
                self._store_answer_ready(entry, ref.ready_snap, ref.probe, ref.receipt.fresh_logits_sha256, vouched_by)
            except (LibraryError, EngineError, OSError) as exc:  # an optimisation: the solution itself is stored
                log.warning(
                    "entry #%d: its answer-ready state was not stored (%s); it is answered the slower way",
                    entry.id,
                    exc,
                )
        return DepositResult(entry, created, ref.prefill_s)

    def reference_run(
        self,
        tokens: list[int],
        kind: str,
        question: str | None,
        on_progress,
        answer_ready: bool = False,
        text: str | None = None,
        schedule: dict | None = None,
        computed: str = "deposit",
    ) -> "ReferenceRun":
        """Prefill `tokens` in a new context (never the warm one), snapshot it, decode the kind's probe,
        then graft the snapshot and decode the probe again: the receipt compares the two logits.
        `schedule`: prefill in that recorded schedule (app/proof/replay.py) instead of n_batch chunks;
        `computed`: what the receipt says made it."""
        limit = self.engine.config.n_ctx - 64
        probe_text, probe = probe_for(self.engine.model, kind, question, text)
        # a solution's question is decoded as [all but its last token], [its last token]: the state in
        # between is the answer-ready state (kind "answer"), and both receipts share the fresh logits
        ready = answer_ready and bool(question) and len(probe) >= 2 and len(tokens) + len(probe) <= limit
        calls = [len(probe) - 1, 1] if ready else [len(probe)]
        ready_snap = None
        with self.engine.session() as s:  # the reference run: always a new context, never the warm one
            t0 = time.perf_counter()
            prefill_in_schedule(s, tokens, schedule, on_progress=on_progress)
            prefill_s = time.perf_counter() - t0
            snap = s.snapshot()
            if ready:
                s.prefill(probe[:-1])
                ready_snap = s.snapshot()
                s.prefill(probe[-1:])
            else:
                s.prefill(probe)
            fresh_sha = logits_sha256(s.logits())
        with self.session() as g:  # the entry's receipt: its own graft, checked against fresh
            g.graft(snap, bytes_verified=True)
            decode_in_calls(g, probe, calls)
            graft_sha = logits_sha256(g.logits())
        receipt = Receipt.compared(probe_text, probe, fresh_sha, graft_sha, calls, computed=computed)
        if not receipt.equal:
            log.warning("deposit: grafted logits differ from fresh on this engine (%s)", self.engine.backend)
        return ReferenceRun(snap, ready_snap, probe, receipt, prefill_s)

    def document_state(self, text: str, tokens: list[int], title: str, on_progress=None) -> tuple[dict, float]:
        """A document's state computed here, as `Library.stage_entry` keywords (blob, receipt, proof
        local, schedule), and its prefill seconds: for deposits that commit several entries at once."""
        if len(tokens) > self.engine.config.n_ctx - 64:
            raise EngineError(
                f"the text is {len(tokens):,} tokens; this context holds at most {self.engine.config.n_ctx - 64:,}"
            )
        ref = self.reference_run(tokens, "document", None, on_progress)
        entry = dict(
            kind="document",
            text=text,
            tokens=tokens,
            blob=ref.snap.data,
            blob_sha256=ref.snap.sha256,
            model=model_record(self.engine),
            title=title,
            receipt=ref.receipt.as_dict(),
            elided=ref.snap.elided,
            proof=LOCAL,
            schedule=schedule_of(self.engine),
        )
        return entry, ref.prefill_s

    def _store_answer_ready(
        self, entry: Entry, snap, probe: list[int], fresh_sha: str, vouched_by: str | None
    ) -> Entry:
        """The answer-ready state of a solution: its text and all but the last token of its question
        suffix, decoded as [text in n_batch chunks], [suffix minus one]. Asking the question is then a
        graft and one decoded token, compared with the same fresh logits as the solution's receipt."""
        with self.session() as g:
            g.graft(snap, bytes_verified=True)
            g.prefill(probe[-1:])
            graft_sha = logits_sha256(g.logits())
        receipt = Receipt.compared(ANSWER_READY_PROBE, probe[-1:], fresh_sha, graft_sha, [1])
        schedule = {**schedule_of(self.engine), "then": [len(probe) - 1]}
        ready, _ = self.library.add_entry(
            kind="answer",
            text=entry.text,
            tokens=list(snap.tokens),
            blob=snap.data,
            blob_sha256=snap.sha256,
            fingerprint=self.engine.fingerprint,
            model=model_record(self.engine),
            title=entry.title,
            question=entry.question,
            answer=entry.answer,
            receipt=receipt.as_dict(),
            checker=entry.checker,
            elided=snap.elided,
            proof=LOCAL,
            schedule=schedule,
            vouched_by=vouched_by if entry.answer is not None else None,
        )
        return ready

    def answer_ready(self, entry: Entry, suffix: list[int] | None = None) -> Entry | None:
        """The graftable answer-ready state stored for a solution entry and the question suffix
        `suffix` (default: the entry's own question's), if any. It is found by its tokens, so a suffix
        asked in other words than the stored question finds none."""
        if entry.kind != "solution" or not entry.question:
            return None
        probe = (
            suffix if suffix is not None else probe_for(self.engine.model, entry.kind, entry.question, entry.text)[1]
        )
        if len(probe) < 2:
            return None
        ready = self.library.find_same(
            tokens_sha256(entry.tokens + probe[:-1]), self.engine.fingerprint, "answer", entry.question, entry.answer
        )
        return ready if ready is not None and ready.graftable(self.engine.fingerprint) else None

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A context to work in: the service's warm one, emptied (`Session.reset`), instead of a new
        context per question. A cleared context computes and grafts bit for bit like a new one
        (tests/test_warm_context.py). Not re-entrant: a nested use gets a fresh context."""
        if self._warm_busy:
            with self.engine.session() as s:
                yield s
            return
        if self._warm is None or self._warm.engine is not self.engine or self._warm.closed:
            self.close()
            self._warm = self.engine.session()
            # a service dropped without close() still frees its context (from its thread, or after it ended)
            self._finalizer = weakref.finalize(self, _close_quietly, self._warm)
        self._warm.reset(clear_data=False)
        self._warm_busy = True
        try:
            yield self._warm
        except BaseException:  # a failed decode, a cancel, a refused graft: start the next use from a new context
            self.close()
            raise
        finally:
            self._warm_busy = False

    def close(self) -> None:
        """Free the warm context (call from the thread that used the service, or after it ended)."""
        if self._warm is not None:
            self._warm.close()  # raises from a foreign live thread: then the finalizer still holds it
            self._finalizer.detach()
            self._warm = None

    def __enter__(self) -> "LibraryService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def deposit_solution(
        self,
        question: str,
        solution: str,
        answer: str,
        checker: str = "numeric",
        on_progress=None,
        vouched_by: str | None = None,
    ) -> DepositResult:
        """A solution stored in this model's format (app/proof/solution_format.py: the Q/A format a small
        base model copies, or an instruct model's chat template); its answer counts as verified only with
        `vouched_by`."""
        return self.deposit(
            stored_text(self.engine.model, question, solution, answer),
            question=question,
            answer=answer,
            kind="solution",
            title=question,
            on_progress=on_progress,
            checker=checker,
            vouched_by=vouched_by,
        )

    def reserve_graft_buffer(self, n_bytes: int) -> None:
        """Size the reused graft buffer now (a server at start), not on the first graft."""
        if len(self._graft_buf) < n_bytes:
            self._graft_buf = bytearray(n_bytes + n_bytes // 4)

    def graft(self, session: Session, entry: Entry) -> GraftResult:
        """Read the entry's blob (integrity-checked) and graft it into the empty `session`."""
        if entry.fingerprint != self.engine.fingerprint:
            raise FingerprintMismatch(
                f"entry #{entry.id} was made under another engine fingerprint; rebuild it from its text"
            )
        if not entry.proven:  # never restore a state whose origin is unproven (docs/exact-graft.md)
            raise UnprovenState(
                f"entry #{entry.id} is unproven: its state is not known to be the state of its text; "
                "run kvgraft verify --library --replay to prove it"
            )
        t0 = time.perf_counter()
        self.reserve_graft_buffer(entry.blob_size)
        buf = self.library.read_blob(entry, into=self._graft_buf)  # checked, our own buffer: grafted without a copy
        read_ms = (time.perf_counter() - t0) * 1e3
        g = session.graft_buffer(buf, entry.tokens)
        return GraftResult(g.n_tokens, g.validate_ms + read_ms, g.restore_ms)


def _close_quietly(session: Session) -> None:
    try:
        session.close()
    except EngineError as exc:  # another live thread owns it: nothing safe to do from here
        log.warning("a warm context was not freed: %s", exc)


def _title(text: str, question: str | None) -> str:
    src = (question or text).strip().splitlines()[0] if (question or text).strip() else ""
    return src[:80] + ("..." if len(src) > 80 else "")
