"""The one way in for states made elsewhere: a `.kvpack` import and a pull take this path.

    source (an ObjectStore: a pack, downloaded blobs) + its manifest's typed entries (PackEntry)
      1. tokens: each entry's text tokenized here gives its declared count and SHA-256;
      2. blobs: each distinct blob read ONCE through `source.read_checked` (size, SHA-256), its state
         layout walked against this model, its canonical form checked (or made: format 1), and kept
         as a `CheckedBlob` (library/admission.py) for the commit: nothing reads it again;
      3. proof: a trusted signer of this engine's bits vouches, or an equal proven entry is already
         here, or a replay here reproduces the blob's address (one prefill per distinct state);
      4. one commit (library/admission.py `commit_admission`): the checked buffers staged, every row
         in one transaction.

`strict` (an import): the first refusal refuses the whole source with a PackError naming the entry,
and nothing is written. Not strict (a pull): each refusal is recorded with its entry and the others go
on. The policy around it (model and fingerprint, --require-signed, trusted keys) is the caller's:
app/packs/imports.py for a pack, app/remote/pull.py for a remote.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.proof.checkers import UnknownChecker, check_name
from kvgraft.app.proof.receipt import probe_for
from kvgraft.app.proof.replay import replay as run_replay
from kvgraft.app.proof.replay import schedule_of, signer_vouch
from kvgraft.app.proof.solution_format import entry_tokens
from kvgraft.app.service import LibraryService, model_record
from kvgraft.engine.compaction import canonicalize, dead_ranges, is_canonical
from kvgraft.engine.state import parse_state
from kvgraft.library import container
from kvgraft.library.admission import (
    Admitted,
    CheckedBlob,
    EntryProof,
    HeldBlobs,
    SourceRecord,
    commit_admission,
)
from kvgraft.library.errors import LibraryError, StorageFull
from kvgraft.library.manifest import PackEntry
from kvgraft.library.pack import PackError
from kvgraft.library.records import REPLAYED, UNPROVEN, signed_proof
from kvgraft.library.staging import staged
from kvgraft.library.stores import ObjectStore
from kvgraft.library.tokens import tokens_sha256

log = logging.getLogger(__name__)


@dataclass
class Admission:
    """What one source's admission did."""

    imported: int = 0
    skipped: int = 0
    proofs: list[EntryProof] = field(default_factory=list)  # of the entries committed
    refused: list[tuple[PackEntry, str]] = field(default_factory=list)  # (entry, why), when not strict

    @property
    def proof_counts(self) -> dict:
        return dict(Counter(p.proof for p in self.proofs))

    @property
    def replayed(self) -> list[EntryProof]:
        return [p for p in self.proofs if p.replay_s is not None]


def state_size_limit(engine) -> int:
    """The largest whole-state snapshot the engine's context can produce (a bound for hostile sizes)."""
    return (engine.layout.bytes_per_token() + 64) * engine.config.n_ctx + (1 << 20)


def label(e: PackEntry) -> str:
    return repr((e.title or e.question or e.text.strip().splitlines()[0] if e.text.strip() else "")[:60])


def note_unknown_checkers(entries: Sequence[PackEntry]) -> list[str]:
    """The checker names of incoming entries that this kvgraft does not know (from a newer one), each
    logged once. Such entries come in (docs/pack-format.md): the name is kept, and only checking a
    decoded answer needs it (ask says "not checked", verify fails that entry's answer check)."""
    unknown = []
    for e in entries:
        if e.checker is None or e.checker in unknown:
            continue
        try:
            check_name(e.checker)
        except UnknownChecker as exc:
            unknown.append(e.checker)
            log.warning("an entry names a checker this kvgraft does not know (%s): its answers are not checked", exc)
    return unknown


class _Gate:
    """Refusals: raised at once when strict, else recorded against their entries."""

    def __init__(self, strict: bool, out: Admission) -> None:
        self.strict, self.out = strict, out

    def refuse(self, entries: Sequence[PackEntry], why: str) -> None:
        if self.strict:
            raise PackError(why)
        self.out.refused += [(e, why) for e in entries]


def admit(
    service: LibraryService,
    source: ObjectStore,
    entries: Sequence[PackEntry],
    record: SourceRecord,
    *,
    signer_name: str | None,
    replay: bool = True,
    strict: bool = True,
    progress: Progress = no_progress,
    source_fingerprint: str | None = None,
    budget: int | None = None,
) -> Admission:
    """Check, prove and commit `entries` (whose blobs `source` holds) in one transaction.

    `signer_name`: the trusted key that signed them under this engine's fingerprint (None: no signer
    vouches). `replay=False` leaves entries nothing proves "unproven" (under `source_fingerprint`):
    listed, never grafted, until `kvgraft verify --library --replay` proves them. `budget`: the checked
    bytes held in memory (library/admission.py `memory_budget` by default)."""
    engine, lib = service.engine, service.library
    out = Admission()
    gate = _Gate(strict, out)
    note_unknown_checkers(entries)
    tokens = _check_tokens(engine, entries, gate, progress)
    limit = state_size_limit(engine)
    live = []
    for e in entries:
        if e.position not in tokens:
            continue
        if e.blob_size > limit:
            size = f"a {e.blob_size:,}-byte blob; a state of this context is at most {limit:,}"
            gate.refuse([e], f"entry {e.position} declares {size}")
        else:
            live.append(e)
    names = {e.blob_sha256 for e in live}
    need = sum(source.stored_size(n) or 0 for n in names if not lib.blobs.contains(n))
    free = shutil.disk_usage(lib.root).free
    if need > free:
        raise StorageFull(f"the import needs {need / 1e6:,.0f} MB and the disk has {free / 1e6:,.0f} MB free")
    by_blob: dict[str, list[PackEntry]] = {}
    for e in live:
        by_blob.setdefault(e.blob_sha256, []).append(e)
    with staged(lib) as staging:
        held = HeldBlobs(staging, budget)
        for k, (name, naming) in enumerate(sorted(by_blob.items())):
            progress("blobs", k, len(by_blob))
            try:
                blob = check_blob(engine, source, name, naming[0].blob_size, limit)
            except (PackError, LibraryError) as exc:
                gate.refuse(naming, str(exc) if isinstance(exc, PackError) else f"blob {name[:16]}...: {exc}")
                continue
            wrong = [e for e in naming if not _matches(e, blob)]
            if wrong:
                declared = sorted({(e.n_tokens, e.blob_size) for e in naming})
                why = f"blob {name[:16]}... holds {blob.n_tokens} tokens in {blob.size:,} bytes; its entries declare "
                gate.refuse(wrong, why + ", ".join(f"{t} tokens in {b:,} bytes" for t, b in declared))
            held.keep(blob)
        progress("blobs", len(by_blob), len(by_blob))
        live = [e for e in live if e.blob_sha256 in held and _matches(e, held.by_name[e.blob_sha256])]
        proofs = _prove(service, live, tokens, held, signer_name, replay, source_fingerprint, gate, progress)
        admitted = [Admitted(e, tokens[e.position], proofs[e.position]) for e in live if e.position in proofs]
        if not admitted:  # nothing to commit: blobs staged past the memory budget go back to gc at once
            lib.clear_pending(staging.pending)
            return out
        done = commit_admission(
            lib, held, record, admitted, model_record(engine), on_progress=lambda d, t: progress("copy", d, t)
        )
        out.imported, out.skipped = done["imported"], done["skipped"]
    out.proofs = [a.proof for a in admitted]
    return out


def _matches(e: PackEntry, blob: CheckedBlob) -> bool:
    return e.n_tokens == blob.n_tokens and e.blob_size == blob.size


def _check_tokens(engine, entries: Sequence[PackEntry], gate: _Gate, progress: Progress) -> dict[int, list[int]]:
    """Each entry's tokens computed here, by position, where they are the ones it declares."""
    out = {}
    for k, e in enumerate(entries):
        t = entry_tokens(engine.model, e.kind, e.text)
        if len(t) != e.n_tokens:
            gate.refuse([e], f"entry {e.position}: its text is {len(t)} tokens here, the pack declares {e.n_tokens}")
        elif len(t) > engine.config.n_ctx:
            gate.refuse(
                [e],
                f"entry {e.position} holds {len(t):,} tokens, more than this context's {engine.config.n_ctx:,} "
                "(raise --n-ctx)",
            )
        elif tokens_sha256(t) != e.tokens_sha256:
            gate.refuse([e], f"entry {e.position}: its text does not give the token SHA-256 the pack declares")
        else:
            out[e.position] = t
        progress("tokens", k + 1, len(entries))
    return out


def check_blob(engine, source: ObjectStore, name: str, size: int, limit: int) -> CheckedBlob:
    """Read a blob once and check it: SHA-256 (the source's `read_checked`), a state of this model,
    canonical (a format 1 blob is made canonical here and gets the address of that form)."""
    stored, data, ranges = source.read_checked(name, size, limit)
    try:
        parsed = parse_state(data, engine.layout, max_cells=engine.config.n_ctx)
    except Exception as exc:  # SnapshotError: a valid hash of bytes that are no state for this model
        raise PackError(f"blob {name[:16]}... is not a valid state for this model: {exc}") from exc
    if ranges is None:  # format 1: the name is of llama.cpp's bytes; the address is of their canonical form
        data = bytearray(data)
        dead = canonicalize(data, parsed, engine.window)
        return CheckedBlob(name, hashlib.sha256(data).hexdigest(), len(data), parsed.n_tokens, dead, data)
    if not is_canonical(data, parsed, engine.window):
        raise PackError(
            f"blob {name[:16]}... is not in canonical form for this model (its dead window cells are not zero)"
        )
    dead = dead_ranges(parsed, engine.window)
    # the ranges stored are the model's dead cells, never the source's own: a container eliding exactly
    # those is written as it came (one pass), any other is written again from the canonical bytes
    as_is = np.array_equal(container.normalize_ranges(dead, len(data)), ranges)
    return CheckedBlob(
        name,
        name,
        len(data),
        parsed.n_tokens,
        dead,
        data,
        container=stored if as_is else None,
        chunks=source.known_chunks(name) if as_is else None,
    )


def _prove(
    service: LibraryService,
    entries: Sequence[PackEntry],
    tokens: dict[int, list[int]],
    held: HeldBlobs,
    signer_name: str | None,
    replay: bool,
    source_fingerprint: str | None,
    gate: _Gate,
    progress: Progress,
) -> dict[int, EntryProof]:
    """How each entry's state is known to be the state of its text, replaying where needed."""
    engine, lib = service.engine, service.library
    out: dict[int, EntryProof] = {}
    groups: dict[tuple, list[PackEntry]] = {}
    for e in entries:
        address = held.address(e.blob_sha256)
        if signer_name is not None:  # a trusted signer vouches for the states it signed, and for the answers it marks
            vouched = signer_vouch(signer_name, e.vouched_by)
            out[e.position] = EntryProof(signed_proof(signer_name), engine.fingerprint, e.receipt, vouched, e.schedule)
            continue
        here = lib.find_same(e.tokens_sha256, engine.fingerprint, e.kind, e.question, e.answer)
        if here is not None and here.proven and here.damaged is None and here.blob_sha256 == address:
            # the same text with the very same state is already here and proven: nothing to replay, nothing to add
            out[e.position] = EntryProof(
                here.proof, engine.fingerprint, here.receipt, here.vouched_by, here.schedule, existing_id=here.id
            )
        elif replay:
            # one replay per distinct (tokens, state, schedule): entries that share a text and its state (many
            # questions about one document) are proven together
            key = (e.tokens_sha256, address, json.dumps(e.schedule, sort_keys=True))
            groups.setdefault(key, []).append(e)
        else:
            fp = source_fingerprint or engine.fingerprint
            out[e.position] = EntryProof(UNPROVEN, fp, e.receipt, None, e.schedule)
    total = sum(len(tokens[g[0].position]) for g in groups.values())
    done, spent = 0, 0.0
    for k, members in enumerate(groups.values()):
        e = members[0]
        eta = f", about {spent / done * (total - done):.0f} s left" if done else ""
        progress(f"checking (replay{eta})", k, len(groups))
        t = tokens[e.position]
        r = run_replay(engine, t, e.kind, e.question, e.schedule, text=e.text)
        done, spent = done + len(t), spent + r.seconds
        address = held.address(e.blob_sha256)
        if r.sha256 != address:
            gate.refuse(
                members,
                f"entry {e.position} ({label(e)}): its blob is not the state of its text: a replay here gives "
                f"{r.sha256[:16]}..., the pack's blob is {address[:16]}...; nothing was imported",
            )
            continue
        for j in members:  # each gets the replay's receipt where its probe is the one replayed, else none
            same_probe = r.receipt.is_for(probe_for(engine.model, j.kind, j.question, j.text)[1])
            out[j.position] = EntryProof(
                REPLAYED,
                engine.fingerprint,
                r.receipt.as_dict() if same_probe else None,
                None,
                e.schedule or schedule_of(engine),
                replay_s=r.seconds if j is e else 0.0,
                replay_tokens=len(t) if j is e else 0,
            )
    if groups:
        progress("checking (replay)", len(groups), len(groups))
    return out
