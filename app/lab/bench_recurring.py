"""`kvgraft bench`: the recurring answer, as a user feels it.

For a stored solution of exactly L tokens and its own question: the time from the call to the first
answer token through the real ask path (lookup, graft of the answer-ready state, one decoded
token), against a fresh run of the same solution and question in the same decode schedule (the
text in n_batch chunks, the question suffix but its last token, then that token). `exact` compares
the two: every ask run's logits before the first answer token matched the receipt's, and this
run's fresh logits are that receipt's too. Beside them, the graft of the answer-ready state plus
one decode step alone (the bound the target is measured against).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from kvgraft.app.answer.ask import ask
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.lab.starter_problems import GENERATOR
from kvgraft.app.proof.receipt import Receipt
from kvgraft.app.proof.solution_format import entry_tokens, question_suffix, stored_text
from kvgraft.app.service import LibraryService
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.engine import Engine
from kvgraft.library.library import Library

QUESTION = "A depot starts with 900 crates and ships 40 each day for 10 days. How many crates are left?"
ANSWER = "500"


def recurring_table(rows: list[dict]) -> str:
    """The recurring-answer table: time to first token, fresh vs from the library, and the bound."""
    if not rows:
        return ""
    head = (
        "| recurring answer (time to first token) | "
        + " | ".join(f"{r['prefix_tokens']:,} tokens" for r in rows)
        + " |"
    )
    lines = [head, "| --- |" + " --- |" * len(rows)]
    for key, label, fmt in (
        ("fresh_median_s", "fresh: solution + question prefilled", "ms"),
        ("median_s", "kvgraft: lookup, graft answer-ready state, one token", "ms"),
        ("graft_plus_one_decode_s", "graft alone + one decode step", "ms"),
        ("ratio_fresh_vs_recurring", "fresh / kvgraft", "x"),
        ("vs_graft_plus_one_decode", "kvgraft / (graft + one decode)", "x"),
    ):
        cells = [f"{r[key] * 1e3:,.1f} ms" if fmt == "ms" else f"{r[key]:,.2f}x" for r in rows]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(
        "| exact (logits before the first answer token compared) | "
        + " | ".join("yes" if r["exact"] else "**no**" for r in rows)
        + " |"
    )
    return "\n".join(lines)


def solution_of(model, n_tokens: int) -> str:
    """A worked solution whose stored text (this model's format: app/proof/solution_format.py) is exactly
    `n_tokens` tokens."""

    def size(words: int, tail: str) -> int:
        text = stored_text(model, QUESTION, synthetic_text(words, seed=n_tokens) + tail, ANSWER)
        return len(entry_tokens(model, "solution", text))

    lo, hi = 1, max(8, n_tokens)
    while lo < hi:  # the most words that stay within n_tokens
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if size(mid, "") <= n_tokens else (lo, mid - 1)
    for words in (lo, lo - 1, lo - 2):
        for tail in ("", ".", " so", " and so", " and so on", " and so on.", " it is so", " it is so."):
            if words >= 1 and size(words, tail) == n_tokens:
                return synthetic_text(words, seed=n_tokens) + tail
    raise ValueError(f"no solution text of exactly {n_tokens} tokens found")


def recurring(engine: Engine, lib: Library, n: int, runs: int, say: Callable[[str], None]) -> dict:
    service = LibraryService(engine, lib)
    model = engine.model
    body = solution_of(model, n)
    entry = service.deposit_solution(QUESTION, body, ANSWER, vouched_by=GENERATOR).entry
    ready = service.answer_ready(entry)
    if ready is None:
        raise RuntimeError("the deposit made no answer-ready state")
    say(f"recurring answer: a {entry.n_tokens:,}-token solution, asked {runs} times")
    ttft, matches = [], []
    for _ in range(runs):
        r = ask(service, QUESTION)
        if r.entry_id != entry.id or r.tokens_restored != ready.n_tokens:
            raise RuntimeError(
                f"the recurring ask grafted entry #{r.entry_id} ({r.tokens_restored} tokens), not #{entry.id}"
            )
        ttft.append(r.ttft_ms / 1e3)
        matches.append(r.receipt_match is True and r.answer_ready)
    suffix = question_suffix(model, entry.text, QUESTION)[1]
    fresh_s, fresh_shas = [], []
    for _ in range(max(1, runs // 2)):
        with service.session() as s:
            t0 = time.perf_counter()
            s.prefill(entry.tokens)
            s.prefill(suffix[:-1])
            s.prefill(suffix[-1:])
            int(np.argmax(s.logits()))
            fresh_s.append(time.perf_counter() - t0)
            fresh_shas.append(logits_sha256(s.logits()))
    alone = []
    for _ in range(runs):
        with service.session() as s:
            t0 = time.perf_counter()
            service.graft(s, ready)
            s.prefill(suffix[-1:])
            int(np.argmax(s.logits()))
            alone.append(time.perf_counter() - t0)
    fresh_match = set(fresh_shas) == {Receipt.read(entry.receipt).fresh_logits_sha256}
    service.close()
    return {
        "method": "kvgraft_recurring",
        "prefix_tokens": entry.n_tokens,
        "answer_ready_tokens": ready.n_tokens,
        "median_s": statistics.median(ttft),
        "fresh_median_s": statistics.median(fresh_s),
        "graft_plus_one_decode_s": statistics.median(alone),
        "ratio_fresh_vs_recurring": statistics.median(fresh_s) / statistics.median(ttft),
        "vs_graft_plus_one_decode": statistics.median(ttft) / statistics.median(alone),
        "exact": all(matches) and fresh_match,
        "runs": runs,
        "ready_blob_bytes": ready.blob_size,
        "ready_blob_stored_bytes": lib.blobs.stored_size(ready.blob_sha256),
    }
