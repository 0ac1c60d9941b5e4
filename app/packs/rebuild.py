"""`kvgraft import --rebuild`: a pack for another model or fingerprint, its texts imported and their
states computed here. All or nothing, like every import: each entry's state (and a solution's
answer-ready state) is computed and staged as a pending blob first (library/entry_writes.py,
`Library.entry_batch`), then every entry is committed in one transaction. A failure, or a Cancelled
raised from the progress callback, before that commit leaves the library as it was (the staged blobs
are reclaimed by gc).
"""

from __future__ import annotations

import logging

from kvgraft.app.core.progress import Progress
from kvgraft.app.packs.results import PackImport
from kvgraft.app.proof.receipt import ANSWER_READY_PROBE, Receipt
from kvgraft.app.proof.replay import schedule_of
from kvgraft.app.proof.solution_format import entry_tokens
from kvgraft.app.service import LibraryService, model_record
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.errors import Cancelled, EngineError
from kvgraft.library.errors import LibraryError
from kvgraft.library.manifest import PackEntry
from kvgraft.library.pack import PackError, PackReader
from kvgraft.library.records import LOCAL, PACK_KINDS, Entry
from kvgraft.library.tokens import tokens_sha256

log = logging.getLogger(__name__)


def rebuild_pack(service: LibraryService, reader: PackReader, progress: Progress) -> PackImport:
    """Import the pack's texts with states computed on this engine, in one transaction."""
    engine, lib = service.engine, service.library
    entries = reader.manifest.entries
    limit = engine.config.n_ctx - 64
    tokens = []
    for i, e in enumerate(entries):  # everything checked before the first state is computed
        if not e.text.strip():
            raise PackError(f"entry {i} has an empty text: nothing to rebuild")
        t = entry_tokens(engine.model, e.kind, e.text)
        if len(t) > limit:
            raise PackError(
                f"entry {i} is {len(t):,} tokens here, more than this context holds ({limit:,}); raise --n-ctx"
            )
        tokens.append(t)
    mains = []  # the batch position of each pack entry (its answer-ready state follows it)
    with lib.entry_batch() as batch:
        for i, (e, t) in enumerate(zip(entries, tokens, strict=True)):
            here = lib.find_same(tokens_sha256(t), engine.fingerprint, e.kind, e.question, e.answer)
            mains.append(batch.size)
            if here is not None and here.damaged is None and here.proven:
                batch.keep(here)  # already here and proven: nothing to compute
            else:
                for state in entry_states(service, e, t):
                    batch.add(**state)
            progress("rebuild", i + 1, len(entries))
        done = batch.commit()
    imported = sum(done[k][1] for k in mains)
    return PackImport(
        file=str(reader.path),
        imported=imported,
        skipped=len(entries) - imported,
        rebuilt=imported,
        signed_by=reader.signer.key_id if reader.signer else None,
    )


def rebuild_entries(service: LibraryService, ids: list[int], progress: Progress) -> dict:
    """Entries made under other settings (another fingerprint), computed again here from their texts, in
    one transaction, proof `local` (a fresh run compared with a graft, as a deposit makes one): what
    Ask offers when such entries hold the question. The old entries stay (the other settings still graft
    them). A Cancelled from `progress` before the commit leaves the library as it was."""
    engine, lib = service.engine, service.library
    entries = [lib.get(i) for i in ids]
    missing = [i for i, e in zip(ids, entries, strict=True) if e is None]
    if missing:
        raise LibraryError(f"no entry #{missing[0]} in this library")
    limit = engine.config.n_ctx - 64
    tokens = []
    for e in entries:
        if e.kind not in PACK_KINDS:
            raise LibraryError(f"entry #{e.id} is a {e.kind}: only knowledge entries are rebuilt")
        t = entry_tokens(engine.model, e.kind, e.text)
        if len(t) > limit:
            raise LibraryError(f"entry #{e.id} is {len(t):,} tokens here, more than this context holds ({limit:,})")
        tokens.append(t)
    kept = 0
    with lib.entry_batch() as batch:
        mains = []
        for i, (e, t) in enumerate(zip(entries, tokens, strict=True)):
            here = lib.find_same(tokens_sha256(t), engine.fingerprint, e.kind, e.question, e.answer)
            mains.append(batch.size)
            if here is not None and here.damaged is None and here.proven:
                batch.keep(here)
                kept += 1
            else:
                for state in entry_states(service, e, t):
                    batch.add(**state)
            progress("rebuild", i + 1, len(entries))
        done = batch.commit()
    made = [done[k][0].id for k in mains]
    return {"rebuilt": len(entries) - kept, "already_here": kept, "ids": made, "from": list(ids)}


def entry_states(service: LibraryService, e: PackEntry | Entry, tokens: list[int]) -> list[dict]:
    """`Library.stage_entry` keywords for a pack entry's state computed here as a deposit computes it (a
    fresh run, its receipt compared with a graft), then for a solution its answer-ready state. The
    answer is stated (nobody here vouched for it); the checker is the pack's."""
    engine = service.engine
    ref = service.reference_run(tokens, e.kind, e.question, None, answer_ready=e.kind == "solution", text=e.text)
    shared = dict(
        text=e.text,
        fingerprint=engine.fingerprint,
        model=model_record(engine),
        title=e.title or _title(e.text, e.question),
        question=e.question,
        answer=e.answer,
        checker=e.checker,
        proof=LOCAL,
    )
    states = [
        dict(
            kind=e.kind,
            tokens=tokens,
            blob=ref.snap.data,
            blob_sha256=ref.snap.sha256,
            receipt=ref.receipt.as_dict(),
            elided=ref.snap.elided,
            schedule=schedule_of(engine),
            **shared,
        )
    ]
    if ref.ready_snap is not None:
        try:
            states.append(_answer_ready(service, ref, shared))
        except Cancelled:
            raise
        except (LibraryError, EngineError, OSError) as exc:  # an optimisation, as in a deposit: the solution stands
            log.warning("%s: its answer-ready state was not made (%s); it is answered the slower way", e.title, exc)
    return states


def _answer_ready(service: LibraryService, ref, shared: dict) -> dict:
    """The answer-ready state of a rebuilt solution and its receipt (as `LibraryService` deposits one)."""
    snap, probe = ref.ready_snap, ref.probe
    with service.session() as g:
        g.graft(snap, bytes_verified=True)
        g.prefill(probe[-1:])
        graft_sha = logits_sha256(g.logits())
    receipt = Receipt.compared(ANSWER_READY_PROBE, probe[-1:], ref.receipt.fresh_logits_sha256, graft_sha, [1])
    return dict(
        kind="answer",
        tokens=list(snap.tokens),
        blob=snap.data,
        blob_sha256=snap.sha256,
        receipt=receipt.as_dict(),
        elided=snap.elided,
        schedule={**schedule_of(service.engine), "then": [len(probe) - 1]},
        **shared,
    )


def _title(text: str, question: str | None) -> str:
    src = (question or text).strip().splitlines()[0] if (question or text).strip() else ""
    return src[:80] + ("..." if len(src) > 80 else "")
