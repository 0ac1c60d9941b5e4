"""The benchmark's KV-type rows: f16 against q8_0, each graft checked against its own fresh run."""

from __future__ import annotations

import tempfile
from pathlib import Path

from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.app.lab.bench_question import QUESTION
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.engine import Engine
from kvgraft.engine.session import Snapshot
from kvgraft.library.blobstore import BlobStore

KV_KINDS = (("f16", "f16", False), ("q8_0", "q8_0", True))


def kv_types(engine: Engine, say, n: int = 1024, kinds=KV_KINDS) -> list[dict]:
    """Per KV type (type_k, type_v, flash_attn), for a snapshot of `n` tokens: the whole-state bytes
    a graft restores (dead window cells included, as zeros), the bytes the blob store keeps (the
    compact container: those zero runs elided, header included), and whether grafting the stored
    blob, read back with its integrity check, gives the fresh run's logits (SHA-256) and 4 greedy
    tokens in the same decode schedule."""
    q = engine.model.tokenize(QUESTION, add_bos=False)[:16]
    prefix = prefix_tokens(engine.model, n, seed=n)
    out = []
    with tempfile.TemporaryDirectory(prefix="kvgraft-bench-kv-") as tmp:
        store = BlobStore(Path(tmp))
        for tk, tv, fa in kinds:
            say(f"KV {tk}/{tv}: bytes per token and exactness")
            e = engine.with_config(engine.config.replace(type_k=tk, type_v=tv, flash_attn=fa))
            with e.session() as s:
                s.prefill(prefix)
                snap = s.snapshot()
                s.prefill(q)
                fresh_sha, fresh_gen = logits_sha256(s.logits()), s.generate(4, stop_at_eog=False).tokens
            stored = store.put(snap.data, snap.sha256, trusted=True, elide=snap.elided)
            back = Snapshot.of(store.read_verified(snap.sha256), snap.tokens, snap.fingerprint)
            with e.session() as s:
                s.graft(back, bytes_verified=True)
                s.prefill(q)
                graft_sha, graft_gen = logits_sha256(s.logits()), s.generate(4, stop_at_eog=False).tokens
            elided = int(snap.elided[:, 1].sum()) if len(snap.elided) else 0
            out.append(
                {
                    "type_k": tk,
                    "type_v": tv,
                    "flash_attn": fa,
                    "prefix_tokens": n,
                    "state_bytes": len(snap.data),
                    "state_bytes_per_token": len(snap.data) / n,
                    "elided_bytes": elided,
                    "stored_bytes": stored.stored_size,
                    "stored_bytes_per_token": stored.stored_size / n,
                    "fresh_logits_sha256": fresh_sha,
                    "graft_logits_sha256": graft_sha,
                    "graft_exact": fresh_sha == graft_sha and fresh_gen == graft_gen,
                }
            )
    return out
