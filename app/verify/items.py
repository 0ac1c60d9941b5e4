"""`kvgraft verify`: batch verification with receipts anyone can re-check.

Per entry (from packs or the library):
  1. blob: its bytes hash to the SHA-256 the manifest or index names;
  2. replay (--replay): prefill the entry's text fresh, the snapshot must have the same SHA-256
     (bit-identical reproduction; canonical, engine/compaction.py, unless the blob is from before
     compaction or a format 1 pack, which are compared as llama.cpp wrote them), and for K probe
     continuations the logits after grafting the blob equal the fresh ones (SHA-256, KL, argmax);
  3. answer: for a verified solution, graft it, ask its question, and the decoded answer must
     pass the entry's checker against the verified answer.
The receipts file records every input and output hash and the engine fingerprint;
`verify_receipts` re-runs the same checks and compares hash by hash. A receipt made before
compaction (receipts version 1) names blobs by the SHA-256 of their uncompacted bytes: the
re-check accepts the blob's recorded old address (`blob_aliases`) and the raw replay for those (as
for any result whose blob was not canonical when the receipt was made).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvgraft.app import __version__
from kvgraft.app.answer.ask import GRAFT_ANSWER_TOKENS
from kvgraft.app.proof.checkers import UnknownChecker, checker_for
from kvgraft.app.proof.receipt import Receipt, probe_for
from kvgraft.app.proof.replay import (
    engine_for,
    expected_tokens,
    prefill_in_schedule,
    signer_vouch,
)
from kvgraft.app.proof.solution_format import answer_decoding, checked_part, question_suffix
from kvgraft.app.service import LibraryService
from kvgraft.engine.compare import compare_logits
from kvgraft.engine.errors import EngineError
from kvgraft.engine.session import Snapshot
from kvgraft.library.pack import PackReader, pack_sha256
from kvgraft.library.records import REPLAYED, TRANSCRIPT_KINDS, UNPROVEN, Entry, signed_proof
from kvgraft.library.tokens import tokens_sha256

RECEIPTS_VERSION = 2


@dataclass
class Item:
    """One thing to verify: an entry's facts and a way to get its blob bytes (checked by the loader)."""

    ref: str  # "library#12" or "pack:<sha16>#3"
    kind: str
    text: str
    question: str | None
    answer: str | None
    checker: str | None
    n_tokens: int
    tokens_sha256: str
    blob_sha256: str
    fingerprint: str
    load_blob: Callable[[], bytes]
    canonical: bool = True  # False: the blob's address is of the bytes as llama.cpp wrote them
    aliases: tuple[str, ...] = ()  # addresses this blob had before compaction
    proof: str = UNPROVEN  # how the state is known (library/records.py); only a proven state is grafted
    model_sha256: str | None = None
    schedule: dict | None = None  # the decode schedule the state was made with (app/proof/replay.py)
    vouched_by: str | None = None
    entry_id: int | None = None  # a library entry: a replay that proves it records the proof
    stored_tokens: list[int] | None = None  # a session's transcript: token ids, not text to tokenize again

    @classmethod
    def of(cls, ref: str, e, fingerprint: str, load_blob: Callable[[], bytes], **facts) -> "Item":
        """The item of a library `Entry` or a pack's `PackEntry` (the fields they share, by name)."""
        shared = {k: getattr(e, k) for k in _SHARED}
        return cls(ref=ref, fingerprint=fingerprint, load_blob=load_blob, **shared, **facts)


_SHARED = ("kind", "text", "question", "answer", "checker", "n_tokens", "tokens_sha256", "blob_sha256")


def library_items(service: LibraryService, entries: list[Entry]) -> list[Item]:
    lib = service.library
    return [
        Item.of(
            f"library#{e.id}",
            e,
            e.fingerprint,
            lambda e=e: bytes(lib.read_blob(e)),
            canonical=lib.blob_is_canonical(e.blob_sha256) is not False,
            aliases=lib.blob_aliases(e.blob_sha256),
            proof=e.proof,
            model_sha256=e.model_sha256,
            schedule=e.schedule,
            vouched_by=e.vouched_by,
            entry_id=e.id,
            stored_tokens=e.tokens if e.kind in TRANSCRIPT_KINDS else None,
        )
        for e in entries
    ]


def pack_items(reader: PackReader, pack_sha: str, trusted_signer: str | None = None) -> list[Item]:
    """A pack's entries; proven only when `trusted_signer` (the name of a trusted key that signed a
    format 3 pack) vouches for them, else a replay has to prove them."""
    m = reader.manifest
    proof = signed_proof(trusted_signer) if trusted_signer and m.format_version >= 3 else UNPROVEN
    return [
        Item.of(
            f"pack:{pack_sha[:16]}#{e.position}",
            e,
            m.fingerprint,
            lambda s=e.blob_sha256: reader.read_blob(s),
            canonical=reader.compact,
            proof=proof,
            model_sha256=m.model_sha256,
            schedule=e.schedule,
            vouched_by=signer_vouch(trusted_signer, e.vouched_by)
            if proof != UNPROVEN and e.answer is not None
            else None,
        )
        for e in m.entries
    ]


def _probes(item: Item, model, samples: int) -> list[list[int]]:
    """Probe continuations: the entry's own question (or the document probe), then slices of its text."""
    probes = [probe_for(model, item.kind, item.question, item.text)[1]]
    words = item.text.split()
    for k in range(1, samples):
        start = (k * 7919) % max(1, len(words))
        piece = " ".join(words[start : start + 12]) or "and"
        probes.append(model.tokenize(" " + piece, add_bos=False))
    return probes


def verify_item(service: LibraryService, item: Item, replay: bool, samples: int) -> dict:
    engine = service.engine
    model = engine.model
    checks: dict = {"proof": item.proof}
    failures: list[str] = []
    try:
        data = item.load_blob()
        checks["blob_sha256"] = hashlib.sha256(data).hexdigest()
        checks["blob_ok"] = checks["blob_sha256"] == item.blob_sha256
    except Exception as exc:  # noqa: BLE001 (missing or corrupt, in any store: named by the loader)
        checks["blob_ok"] = False
        checks["blob_error"] = str(exc)
        data = None
    if not checks["blob_ok"]:
        failures.append("blob")
    if item.model_sha256 is not None and item.model_sha256 != model.info.sha256:
        checks["model_ok"] = False
        failures.append("model")
    if item.stored_tokens is not None:  # a chat session holds decoded reply tokens: its text is not its tokens
        tokens = list(item.stored_tokens)
    else:
        tokens = expected_tokens(model, item.kind, item.text, item.question)
    checks["tokens_ok"] = len(tokens) == item.n_tokens and tokens_sha256(tokens) == item.tokens_sha256
    if not checks["tokens_ok"]:
        failures.append("tokens")
    usable = data is not None and not failures
    same_fp = item.fingerprint == engine.fingerprint
    # a state is grafted here only when its origin is proven for this engine: by its proof, or by the replay below
    proven = usable and same_fp and item.proof != UNPROVEN
    snap = Snapshot(data, tuple(tokens), engine.fingerprint, item.blob_sha256) if usable else None

    if replay and snap is not None:
        try:
            eng = engine_for(engine, item.schedule)
        except (ValueError, EngineError) as exc:  # a schedule this engine cannot follow: no replay, no proof
            checks["replay_ok"], checks["replay_error"], checks["probes"] = False, str(exc), []
            eng = None
    if replay and snap is not None and eng is not None:
        if eng is not engine:  # the snapshot is grafted into contexts of the schedule's engine
            snap = Snapshot(data, tuple(tokens), eng.fingerprint, item.blob_sha256)
        probes = _probes(item, model, samples)
        records = []
        for k, probe in enumerate(probes):
            with eng.session() as fresh:  # the reference run: a new context
                prefill_in_schedule(fresh, tokens, item.schedule)
                if k == 0:
                    raw = fresh.snapshot(canonical=False).sha256
                    checks["replay_raw_sha256"] = raw
                    checks["replay_blob_sha256"] = fresh.snapshot().sha256 if item.canonical else raw
                    checks["replay_ok"] = checks["replay_blob_sha256"] == item.blob_sha256
                    if not checks["replay_ok"]:
                        break  # not the state of its text: never grafted
                fresh.prefill(probe)
                want = fresh.logits()
            with service.session() if eng is engine else eng.session() as g:
                g.graft(snap, bytes_verified=True)
                g.prefill(probe)
                cmp = compare_logits(want, g.logits())
            records.append(
                {
                    "probe_tokens_sha256": tokens_sha256(probe),
                    "fresh_logits_sha256": cmp.sha256_a,
                    "graft_logits_sha256": cmp.sha256_b,
                    "equal": cmp.sha256_equal,
                    "kl": cmp.kl,
                    "argmax_agree": cmp.argmax_agree,
                    "max_abs_diff": cmp.max_abs_diff,
                }
            )
        checks["probes"] = records
        if not checks["replay_ok"]:
            failures.append("replay")
        elif not all(r["equal"] for r in records):
            failures.append("probes")
        else:
            proven = True
            checks["proven_by_replay"] = item.proof == UNPROVEN or not same_fp
    if replay and checks.get("replay_ok") is False:
        if "replay" not in failures:
            failures.append("replay")
        proven = False
    elif not replay and not same_fp and snap is not None:
        checks["graftable"] = False
        failures.append("fingerprint")  # not shown to make this engine's bits: --replay can show it

    if item.kind == "solution" and item.question and item.answer is not None and snap is not None and proven:
        suffix = question_suffix(model, item.text, item.question)[1]
        budget, stop = answer_decoding(model, item.text, GRAFT_ANSWER_TOKENS)
        with service.session() as s:
            s.graft(Snapshot(data, tuple(tokens), engine.fingerprint, item.blob_sha256), bytes_verified=True)
            s.prefill(suffix)
            gen = s.generate(budget, stop=stop)
        decoded = gen.text.strip()
        part = checked_part(model, item.text, decoded)
        try:
            ok, unknown = part is not None and checker_for(item.checker)(part, item.answer), None
        except UnknownChecker as exc:  # an entry from a newer kvgraft: this entry fails, the batch goes on
            ok, unknown = False, str(exc)
        checks["answer"] = {
            "decoded": decoded,
            "expected": item.answer,
            "ok": ok,
            "decode_tokens": len(gen.tokens),
            "verified_by": item.vouched_by,
        }
        if unknown is not None:
            checks["answer"]["error"] = f"not checked: {unknown}"
            failures.append("checker")
        elif not ok:
            failures.append("answer")
    checks["proven"] = bool(proven)
    return {
        "ref": item.ref,
        "blob_sha256": item.blob_sha256,
        "blob_aliases": list(item.aliases),
        "blob_canonical": item.canonical,
        "tokens_sha256": item.tokens_sha256,
        "text_sha256": hashlib.sha256(item.text.encode("utf-8")).hexdigest(),
        "checks": checks,
        "failures": failures,
        "ok": not failures,
    }


def record_proof(service: LibraryService, item: Item, result: dict) -> bool:
    """A library entry that a replay just proved (it was unproven, or under an old-style fingerprint):
    record proof "replayed" and the receipt computed here. Returns whether it did. A proven entry
    whose replay here does not reproduce its state becomes unproven (never grafted again)."""
    c = result["checks"]
    if item.entry_id is None:
        return False
    if c.get("replay_ok") is False and item.proof != UNPROVEN and item.fingerprint == service.engine.fingerprint:
        service.library.set_proof(item.entry_id, UNPROVEN, item.fingerprint, None)
        return False
    if (
        not c.get("proven_by_replay")
        or not c.get("blob_ok")
        or not c.get("tokens_ok")
        or not all(p["equal"] for p in c.get("probes", []))
    ):
        return False
    first = c["probes"][0]
    probe_text, probe = probe_for(service.engine.model, item.kind, item.question, item.text)
    receipt = Receipt.compared(
        probe_text, probe, first["fresh_logits_sha256"], first["graft_logits_sha256"], computed="verify --replay"
    )
    service.library.set_proof(item.entry_id, REPLAYED, service.engine.fingerprint, receipt.as_dict())
    return True


def run_verify(
    service: LibraryService,
    items: list[Item],
    inputs: list[dict],
    replay: bool,
    samples: int,
    progress: Callable[[str, int, int], None] = lambda *a: None,
) -> dict:
    results, proven = [], []
    for i, item in enumerate(items):
        res = verify_item(service, item, replay, samples)
        if record_proof(service, item, res):
            proven.append(item.ref)
        if item.entry_id is not None:
            service.library.record_check(item.entry_id, not res["failures"])
        results.append(res)
        progress("verify", i + 1, len(items))
    failures = [{"entry": r["ref"], "check": f} for r in results for f in r["failures"]]
    return {
        "kind": "kvgraft-verify-receipts",
        "receipts_version": RECEIPTS_VERSION,
        "kvgraft_version": __version__,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": service.engine.fingerprint,
        "fingerprint_info": service.engine.fingerprint_info,
        "environment": service.engine.environment,
        "inputs": inputs,
        "options": {"replay": replay, "samples": samples},
        "ok": not failures,
        "entries": len(results),
        "failures": failures,
        "proven_by_replay": proven,  # library entries this run proved (now graftable)
        "unproven": sum(not r["checks"]["proven"] for r in results),
        "results": results,
    }


def pack_inputs(path: Path) -> tuple[dict, PackReader]:
    sha = pack_sha256(path)
    return {"type": "pack", "path": str(Path(path).resolve()), "sha256": sha}, PackReader(path)


# the output hashes a re-check must reproduce, per entry
def _hashes(result: dict) -> dict:
    c = result["checks"]
    return {
        "blob_sha256": c.get("blob_sha256"),
        "replay_blob_sha256": c.get("replay_blob_sha256"),
        "probes": [
            (p["probe_tokens_sha256"], p["fresh_logits_sha256"], p["graft_logits_sha256"]) for p in c.get("probes", [])
        ],
        "answer": (c.get("answer") or {}).get("decoded"),
    }


def compare_receipts(old: dict, new: dict) -> list[dict]:
    """Differences between two receipts of the same inputs: entry by entry, hash by hash."""
    diffs = []
    if old.get("fingerprint") != new.get("fingerprint"):
        diffs.append(
            {
                "entry": None,
                "check": "fingerprint",
                "detail": "the receipts were made under another engine fingerprint: "
                "its hashes are not expected to match here",
            }
        )
    new_by_ref = {r["ref"]: r for r in new["results"]}
    for r in old.get("results", []):
        other = new_by_ref.get(r["ref"])
        if other is None:
            diffs.append({"entry": r["ref"], "check": "missing", "detail": "not found in the re-run"})
            continue
        a, b = _hashes(r), _hashes(other)
        if r.get("blob_canonical") is not True:  # the receipt named this blob by its uncompacted bytes
            c = other["checks"]
            if a["blob_sha256"] in other.get("blob_aliases", []):
                b["blob_sha256"] = a["blob_sha256"]
            if a["replay_blob_sha256"] is not None and a["replay_blob_sha256"] == c.get("replay_raw_sha256"):
                b["replay_blob_sha256"] = a["replay_blob_sha256"]
        for key in a:
            if a[key] != b[key]:
                diffs.append({"entry": r["ref"], "check": key, "detail": f"recorded {a[key]!r}, now {b[key]!r}"})
    return diffs


def receipts_sha256(receipts: dict) -> str:
    return hashlib.sha256(json.dumps(receipts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
