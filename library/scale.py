"""Bulk rows for the lookup-scale benchmark (app/lab/bench_scale.py, scripts/bench_lookup.py).

The rows name one shared blob and skip the deposit protocol on purpose: they measure the index
(exact question, longest prefix, full text) at 1K-100K entries, in a throwaway library.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .normalize import question_key
from .provenance import now
from .schema import insert_prefix_keys
from .tokens import pack_tokens, tokens_sha256


def insert_benchmark_entries(
    lib, rows: Iterable[tuple[str, str, str, Sequence[int], str]], blob_sha: str, fingerprint: str
) -> int:
    """Insert (title, question, text, tokens, answer) rows as proven local solutions in one
    transaction; returns how many. Never use it on a user's library."""
    t, n = now(), 0
    with lib.write() as db:
        for title, question, text, toks, answer in rows:
            packed = pack_tokens(toks)
            cur = db.conn.execute(
                "INSERT INTO entries (kind, title, question, question_key, text, tokens, n_tokens, tokens_sha256, "
                "answer, blob_sha256, blob_size, fingerprint, source, created_at, proof) "
                "VALUES ('solution', ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, 'local', ?, 'local')",
                [title, question, question_key(question), text, packed, len(toks), tokens_sha256(toks)]
                + [answer, blob_sha, fingerprint, t],
            )
            insert_prefix_keys(db, cur.lastrowid, packed, len(toks))
            n += 1
    return n
