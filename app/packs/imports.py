"""Import a `.kvpack` file: the policy around the one way in (app/packs/admission.py).

Here: the pack's model and fingerprint against the loaded engine, `--require-signed` and the trusted
keys, and `--rebuild` for a pack made elsewhere. The checks of every entry and blob, the proof and the
one-transaction commit are the admission's, the same for a pull from a remote.
"""

from __future__ import annotations

import logging
from pathlib import Path

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.packs.admission import admit, note_unknown_checkers
from kvgraft.app.packs.rebuild import rebuild_pack
from kvgraft.app.packs.results import PackImport
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.service import LibraryService
from kvgraft.library.admission import SourceRecord
from kvgraft.library.pack import PackError, PackReader, pack_sha256
from kvgraft.library.signing import Signer, TrustStore

log = logging.getLogger(__name__)


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
            f"({fingerprint_difference(m.engine, engine.fingerprint_info)}); "
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


def trusted_name(signer: Signer | None, trust: TrustStore) -> str | None:
    """The name of the trusted key that made this signature (its key id if unnamed), or None."""
    if signer is None or not trust.trusts(signer):
        return None
    return trust.name_of(signer.key_id) or signer.key_id


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
        record = SourceRecord(
            pack_sha256(path), path.name, m.format_version, m.kvgraft_version, signer, len(m.entries), m.model_sha256
        )
        signer_name = trusted_name(reader.signer, trust)
        done = admit(
            service,
            reader,
            m.entries,
            record,
            signer_name=signer_name if same_bits else None,
            replay=replay,
            progress=progress,
            source_fingerprint=m.fingerprint,
        )
    replayed = done.replayed
    return PackImport(
        file=str(path),
        imported=done.imported,
        skipped=done.skipped,
        rebuilt=0,
        signed_by=signer,
        signer_trusted=signer_name is not None,
        proof=done.proof_counts,
        replayed=len(replayed),
        replay_tokens=sum(p.replay_tokens for p in replayed),
        replay_s=round(sum(p.replay_s for p in replayed), 3),
    )
