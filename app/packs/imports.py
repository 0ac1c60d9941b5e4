"""Export, import and build `.kvpack` files (docs/pack-format.md).

Import checks everything before it changes anything: the archive and manifest (library/pack.py),
the model and fingerprint against the loaded engine, each entry's tokens (its text tokenized
here must give the declared token count and SHA-256), and every blob the manifest names, even
one the library already has (SHA-256, then the state layout walked against this model). Then
library/importer.py commits it in one transaction.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections import Counter
from pathlib import Path

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.packs.rebuild import rebuild_pack
from kvgraft.app.packs.results import PackImport
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.proof.checkers import UnknownChecker, check_name
from kvgraft.app.proof.receipt import probe_for
from kvgraft.app.proof.replay import parse_schedule, schedule_of, signer_vouch
from kvgraft.app.proof.replay import replay as run_replay
from kvgraft.app.proof.solution_format import entry_tokens
from kvgraft.app.service import LibraryService, model_record
from kvgraft.engine.compaction import canonicalize, is_canonical
from kvgraft.engine.state import parse_state
from kvgraft.library.errors import StorageFull
from kvgraft.library.importer import EntryProof, commit_pack
from kvgraft.library.pack import PackError, PackReader, pack_sha256
from kvgraft.library.records import REPLAYED, UNPROVEN, signed_proof
from kvgraft.library.signing import TrustStore
from kvgraft.library.tokens import tokens_sha256

log = logging.getLogger(__name__)


def state_size_limit(engine) -> int:
    """The largest whole-state snapshot the engine's context can produce (a bound for hostile sizes)."""
    return (engine.layout.bytes_per_token() + 64) * engine.config.n_ctx + (1 << 20)


def check_compatible(engine, reader: PackReader) -> bool:
    """Refuse a pack for another model, or a format 3 pack whose fingerprint (config and probe hashes)
    differs from this engine's. Returns whether the pack declares this engine's bits (format 3, equal
    fingerprint); format 1 and 2 packs carry an old-style fingerprint that only a replay can settle."""
    m = reader.manifest
    if m.model_sha256 != engine.model.info.sha256:
        raise PackError(
            f"the pack was made for model {m.model_name} (sha256 {m.model_sha256[:12]}...), the loaded model is "
            f"{engine.model.info.name} ({engine.model.info.sha256[:12]}...); load that model, or import with --rebuild"
        )
    if m.format_version < 3:
        return False
    if m.fingerprint != engine.fingerprint:
        raise PackError(
            f"the pack was made under engine fingerprint {m.fingerprint[:12]}..., this engine is "
            f"{engine.fingerprint[:12]}... "
            f"({fingerprint_difference(m.raw.get('engine'), engine.fingerprint_info)}); "
            "import with --rebuild to rebuild its blobs here"
        )
    return True


def fingerprint_difference(theirs, ours: dict) -> str:
    """In words: which bit-deciding fields or probe hashes differ."""
    if not isinstance(theirs, dict):
        return "the pack does not say what made it"
    keys = sorted(k for k in set(theirs) | set(ours) if k != "probe" and theirs.get(k) != ours.get(k))
    parts = [f"{k} {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in keys]
    if theirs.get("probe") != ours.get("probe"):
        parts.append("the probe hashes differ (another llama.cpp build or CPU/GPU arithmetic: other bits)")
    return "; ".join(parts) or "an unknown difference"


def validate_pack(
    service: LibraryService, reader: PackReader, progress: Progress = no_progress
) -> tuple[list[list[int]], dict]:
    """Everything but the proof and the commit: tokens, blob hashes and layouts. Returns the tokens of
    each entry and the content address (canonical SHA-256) of each blob, by its name in the pack."""
    engine = service.engine
    m = reader.manifest
    note_unknown_checkers(m.entries)
    tokens = []
    for i, e in enumerate(m.entries):
        t = entry_tokens(engine.model, e.kind, e.text)
        if len(t) != e.n_tokens:
            raise PackError(f"entry {i}: its text is {len(t)} tokens here, the pack declares {e.n_tokens}")
        if len(t) > engine.config.n_ctx:
            raise PackError(
                f"entry {i} holds {len(t):,} tokens, more than this context's {engine.config.n_ctx:,} (raise --n-ctx)"
            )
        tokens.append(t)
        progress("tokens", i + 1, len(m.entries))
    for i, (e, t) in enumerate(zip(m.entries, tokens, strict=True)):
        if tokens_sha256(t) != e.tokens_sha256:
            raise PackError(f"entry {i}: its text does not give the token SHA-256 the pack declares")
    limit = reader.max_blob_size = state_size_limit(engine)
    for i, e in enumerate(m.entries):
        if e.blob_size > limit:
            raise PackError(
                f"entry {i} declares a {e.blob_size:,}-byte blob; a state of this context is at most {limit:,}"
            )
    n_by_blob = {}
    for e in m.entries:
        n_by_blob.setdefault(e.blob_sha256, set()).add(e.n_tokens)
    shas = reader.blob_shas()
    address = {}
    for k, sha in enumerate(shas):
        data = reader.read_blob(sha)  # checks size and SHA-256
        try:
            parsed = parse_state(data, engine.layout, max_cells=engine.config.n_ctx)
        except Exception as exc:  # SnapshotError: a valid hash of bytes that are no state for this model
            raise PackError(f"blob {sha[:16]}... is not a valid state for this model: {exc}") from exc
        if n_by_blob[sha] != {parsed.n_tokens}:
            raise PackError(
                f"blob {sha[:16]}... holds {parsed.n_tokens} tokens, its entries declare {sorted(n_by_blob[sha])}"
            )
        if reader.compact and not is_canonical(data, parsed, engine.window):
            raise PackError(
                f"blob {sha[:16]}... is not in canonical form for this model (its dead window cells are not zero)"
            )
        if reader.compact:
            address[sha] = sha
        else:  # format 1: the name is of llama.cpp's bytes; the address is of their canonical form
            buf = bytearray(data)
            canonicalize(buf, parsed, engine.window)
            address[sha] = hashlib.sha256(buf).hexdigest()
        progress("blobs", k + 1, len(shas))
    return tokens, address


def note_unknown_checkers(entries) -> list[str]:
    """The checker names of a pack's entries that this kvgraft does not know (a pack from a newer one),
    each logged once. Such a pack imports (docs/pack-format.md): the name is kept, and only checking a
    decoded answer needs it (ask says "not checked", verify fails that entry's answer check)."""
    unknown = []
    for e in entries:
        if e.checker is None or e.checker in unknown:
            continue
        try:
            check_name(e.checker)
        except UnknownChecker as exc:
            unknown.append(e.checker)
            log.warning(
                "the pack names a checker this kvgraft does not know (%s): its answers are not checked here", exc
            )
    return unknown


def check_signature_policy(reader: PackReader, require_signed: bool, trust: TrustStore) -> str | None:
    """The signer's key id (None when unsigned); refuses what --require-signed does not allow."""
    signer = reader.signer
    if require_signed:
        if signer is None:
            raise PackError(f"the pack is not signed ({reader.signature_error}); --require-signed refuses it")
        if not trust.trusts(signer):
            raise PackError(
                f"the pack is signed by key {signer.key_id}, which is not in your trusted keys "
                "(kvgraft keys trust PUBLIC_KEY)"
            )
    return signer.key_id if signer else None


def trusted_name(reader: PackReader, trust: TrustStore) -> str | None:
    """The name of the trusted key that signed this pack (its key id if unnamed), or None."""
    if reader.signer is None or not trust.trusts(reader.signer):
        return None
    return trust.name_of(reader.signer.key_id) or reader.signer.key_id


def import_pack(
    service: LibraryService,
    path: Path,
    rebuild: bool = False,
    progress: Progress = no_progress,
    require_signed: bool = False,
    replay: bool = True,
) -> PackImport:
    """Import one pack: all of it or nothing. Raises PackError with the reason when refused.

    Proof of origin (docs/exact-graft.md): a format 3 pack signed by a trusted key and made under this
    engine's fingerprint is taken as the signer vouches ("signed:<key name>"). Every other entry is
    replayed here before anything is written (one prefill per entry, `replay=True`): a replay that
    does not reproduce the blob's address refuses the whole pack, naming the entry. With
    `replay=False` such entries are imported "unproven": listed, never grafted, until
    `kvgraft verify --library --replay` proves them.
    """
    path = Path(path)
    with PackReader(path) as reader:
        trust = trust_store(service.library.root)
        signer = check_signature_policy(reader, require_signed, trust)
        m = reader.manifest
        engine = service.engine
        if rebuild and not (
            m.format_version >= 3 and m.fingerprint == engine.fingerprint and m.model_sha256 == engine.model.info.sha256
        ):
            note_unknown_checkers(m.entries)
            return rebuild_pack(service, reader, progress)
        same_bits = check_compatible(engine, reader)
        tokens, address = validate_pack(service, reader, progress)
        signer_name = trusted_name(reader, trust)
        proofs = prove_entries(service, reader, tokens, address, signer_name if same_bits else None, replay, progress)
        need = sum(
            reader.members[f"blobs/{s}"].file_size
            for s in reader.blob_shas()
            if not service.library.blobs.exists(address[s])
        )
        free = shutil.disk_usage(service.library.root).free
        if need > free:
            raise StorageFull(f"the pack needs {need / 1e6:,.0f} MB and the disk has {free / 1e6:,.0f} MB free")
        res = commit_pack(
            service.library,
            reader,
            tokens,
            pack_sha256(path),
            model_record(engine),
            signer=signer,
            on_progress=lambda d, t: progress("copy", d, t),
            canonicalize=canonicalizer(engine),
            proofs=proofs,
        )
    replayed = [p for p in proofs if p.replay_s is not None]
    return PackImport(
        file=str(path),
        imported=res["imported"],
        skipped=res["skipped"],
        rebuilt=0,
        signed_by=signer,
        signer_trusted=signer_name is not None,
        proof=dict(Counter(p.proof for p in proofs)),
        replayed=len(replayed),
        replay_tokens=sum(p.replay_tokens for p in replayed),
        replay_s=round(sum(p.replay_s for p in replayed), 3),
    )


def prove_entries(
    service: LibraryService,
    reader: PackReader,
    tokens: list[list[int]],
    address: dict,
    signer_name: str | None,
    replay: bool,
    progress: Progress,
) -> list[EntryProof]:
    """How each entry's state is known to be the state of its text, replaying where needed."""
    engine, lib, m = service.engine, service.library, reader.manifest
    out: list[EntryProof | None] = [None] * len(m.entries)
    todo = []
    for i, e in enumerate(m.entries):
        schedule = _schedule(m.raw["entries"][i].get("schedule"))
        if signer_name is not None:  # a trusted signer vouches for the states it signed, and for the answers it marks
            vouched = m.raw["entries"][i].get("verified_by")
            out[i] = EntryProof(
                signed_proof(signer_name), engine.fingerprint, e.receipt, signer_vouch(signer_name, vouched), schedule
            )
            continue
        here = lib.find_same(e.tokens_sha256, engine.fingerprint, e.kind, e.question, e.answer)
        if here is not None and here.proven and here.damaged is None and here.blob_sha256 == address[e.blob_sha256]:
            # the same text with the very same state is already here and proven: nothing to replay, nothing to add
            out[i] = EntryProof(
                here.proof, engine.fingerprint, here.receipt, here.vouched_by, here.schedule, existing_id=here.id
            )
        elif replay:
            todo.append(i)
        else:
            out[i] = EntryProof(UNPROVEN, m.fingerprint, e.receipt, None, schedule)
    # one replay per distinct (tokens, state, schedule): entries that share a text and its state (many
    # questions about one document) are proven together; each gets the replay's receipt where its
    # probe is the one replayed, else none (its answers are then "not compared" until verify --replay)
    groups: dict[tuple, list[int]] = {}
    for i in todo:
        e = m.entries[i]
        key = (
            e.tokens_sha256,
            address[e.blob_sha256],
            json.dumps(_schedule(m.raw["entries"][i].get("schedule")), sort_keys=True),
        )
        groups.setdefault(key, []).append(i)
    total_tokens = sum(len(tokens[g[0]]) for g in groups.values())
    done_tokens, spent = 0, 0.0
    for k, members in enumerate(groups.values()):
        i = members[0]
        e = m.entries[i]
        eta = f", about {spent / done_tokens * (total_tokens - done_tokens):.0f} s left" if done_tokens else ""
        progress(f"checking (replay{eta})", k, len(groups))
        schedule = _schedule(m.raw["entries"][i].get("schedule"))
        r = run_replay(engine, tokens[i], e.kind, e.question, schedule, text=e.text)
        if r.sha256 != address[e.blob_sha256]:
            raise PackError(
                f"entry {i} ({_label(e)}): its blob is not the state of its text: a replay here gives "
                f"{r.sha256[:16]}..., the pack's blob is {address[e.blob_sha256][:16]}...; nothing was imported"
            )
        for j in members:
            same_probe = r.receipt.is_for(
                probe_for(engine.model, m.entries[j].kind, m.entries[j].question, m.entries[j].text)[1]
            )
            out[j] = EntryProof(
                REPLAYED,
                engine.fingerprint,
                r.receipt.as_dict() if same_probe else None,
                None,
                schedule or schedule_of(engine),
                replay_s=r.seconds if j == i else 0.0,
                replay_tokens=len(tokens[i]) if j == i else 0,
            )
        done_tokens += len(tokens[i])
        spent += r.seconds
    if groups:
        progress("checking (replay)", len(groups), len(groups))
    return out


def _schedule(raw) -> dict | None:
    """A pack entry's schedule: a chunked prefill only (`then` calls belong to answer-ready states,
    which packs never carry)."""
    if isinstance(raw, dict) and "then" in raw:
        raise PackError("manifest: an entry's schedule has 'then' calls; packs carry chunked prefills only")
    try:
        return parse_schedule(raw)
    except ValueError as exc:
        raise PackError(f"manifest: {exc}") from exc


def _label(e) -> str:
    return repr((e.title or e.question or e.text.strip().splitlines()[0] if e.text.strip() else "")[:60])


def canonicalizer(engine):
    """For a format 1 pack: zero a raw state's dead window cells in place (engine/compaction.py)."""

    def run(buf: bytearray):
        return canonicalize(buf, parse_state(buf, engine.layout, max_cells=engine.config.n_ctx), engine.window)

    return run
