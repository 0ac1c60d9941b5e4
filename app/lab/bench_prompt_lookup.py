"""Prompt-lookup decoding against plain greedy decoding, side by side in one run (a benchmark, not a test).

Four sets, each answer decoded twice by the product's own paths (ask, chat) on two engines that share
one loaded model and differ only in `lookup` (0: one token per llama_decode call; k: up to k tokens
guessed from the context checked in each call), the order alternating from one item to the next:

    recurring  the demo's starter problems, asked again: the answer-ready state grafted (app/lab/demo.py)
    retrieved  questions whose document the library retrieves (scripts/qa_sets.py "easy"), by `ask`
    chat       a thread started from a deposited document, asked to repeat its first sentence
    fresh      the starter problems asked fresh, no library: nothing stored to copy from

Per set: decode tokens per llama_decode call, the median wall time per answer and decode tokens per
second of each mode, and how many answers differ in tokens from plain greedy's (an argmax near-tie can
differ between batch shapes: counted and shown, never hidden). scripts/prompt_lookup.py prints it.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable

from kvgraft.app.answer.ask import ask
from kvgraft.app.answer.chat import ChatService
from kvgraft.app.ingest.documents import deposit_file
from kvgraft.app.lab.starter_problems import GENERATOR, starter_problems
from kvgraft.app.packs.export import build_pack
from kvgraft.app.proof.problems import write_jsonl
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.engine import Engine

MODES = ("plain", "lookup")
SETS = ("recurring", "retrieved", "chat", "fresh")
CHAT_ASK = "Repeat the first sentence of the text above, word for word."


def _both(k: int, run: Callable[[str], dict]) -> dict:
    """`run(mode)` for both modes (plain first on even items, lookup first on odd ones): per mode its answer,
    decode tokens, decode calls and wall ms, and whether the answers differ."""
    out = {m: run(m) for m in (MODES if k % 2 == 0 else MODES[::-1])}
    out["differs"] = out["plain"]["answer"] != out["lookup"]["answer"]
    return out


def _summary(name: str, rows: list[dict]) -> dict:
    out = {"set": name, "answers": len(rows), "differ": sum(r["differs"] for r in rows)}
    for m in MODES:
        tokens = sum(r[m]["tokens"] for r in rows)
        calls = sum(r[m]["calls"] for r in rows)
        ms = [r[m]["ms"] for r in rows]
        decode_s = sum(r[m]["decode_ms"] for r in rows) / 1e3
        out[m] = {
            "tokens": tokens,
            "calls": calls,
            "tokens_per_call": round(tokens / calls, 2) if calls else None,
            "median_ms": round(statistics.median(ms), 1) if ms else None,
            "decode_tok_s": round(tokens / decode_s, 1) if decode_s else None,
        }
    p, q = out["plain"], out["lookup"]
    out["speedup_tok_s"] = round(q["decode_tok_s"] / p["decode_tok_s"], 2) if p["decode_tok_s"] else None
    out["speedup_wall"] = round(p["median_ms"] / q["median_ms"], 2) if q["median_ms"] else None
    out["differing"] = [
        {"item": i, "plain": r["plain"]["answer"], "lookup": r["lookup"]["answer"]}
        for i, r in enumerate(rows)
        if r["differs"]
    ]
    return out


def _asked(r) -> dict:
    decode_ms = r.wall_ms - (r.ttft_ms or 0.0)  # from the first answer token on: the decoding
    return {
        "answer": r.answer,
        "tokens": r.tokens_decoded,
        "calls": r.decode_calls or 0,
        "ms": r.wall_ms,
        "decode_ms": decode_ms,
        "source": r.source,
    }


def compare(
    engine: Engine,
    home: Path,
    docs: list[dict],
    say: Callable[[str], None],
    n_problems: int = 24,
    k: int = 8,
    fresh_budget: int = 48,
    only: tuple[str, ...] = SETS,
) -> dict:
    """The four sets in a library at `home`; `docs` ({"text", "question", ...}, scripts/qa_sets.py) for
    the retrieved and chat sets, as many fresh questions as documents."""
    engines = {
        "plain": engine.with_config(engine.config.replace(lookup=0)),
        "lookup": engine.with_config(engine.config.replace(lookup=k)),
    }
    sets = {}
    with open_library(home) as lib:
        services = {m: LibraryService(e, lib) for m, e in engines.items()}
        try:
            problems = starter_problems(n_problems)
            out_dir = home / "starter"
            out_dir.mkdir(parents=True, exist_ok=True)
            write_jsonl(problems, out_dir / "problems.jsonl")
            say(f"storing {len(problems)} starter problems (their answer-ready states)")
            if "recurring" in only:
                build_pack(
                    services["plain"], out_dir / "problems.jsonl", out_dir / "starter.kvpack", vouched_by=GENERATOR
                )
            files = home / "documents"
            files.mkdir(exist_ok=True)
            for i, d in enumerate(docs if {"retrieved", "chat"} & set(only) else []):
                f = files / f"doc{i:03d}.txt"
                f.write_text(d["text"], encoding="utf-8")
                d["entry_id"] = deposit_file(services["plain"], f).entries[0].id
            say(f"deposited {len(docs)} documents")

            def recurring(p):
                return lambda m: _asked(ask(services[m], p.question, retrieve=False))

            def retrieved(d):
                return lambda m: _asked(ask(services[m], d["question"], budget=16))

            def fresh(p):
                return lambda m: _asked(ask(services[m], p.question, budget=fresh_budget, use_library=False))

            def chat(d):
                def run(m):
                    chats = ChatService(services[m])
                    thread = chats.new_thread(from_entry=d["entry_id"])
                    t0 = time.perf_counter()
                    r = chats.say(thread.id, CHAT_ASK, max_tokens=64)
                    ms = (time.perf_counter() - t0) * 1e3
                    return {
                        "answer": r.reply,
                        "tokens": r.tokens_decoded,
                        "calls": r.decode_calls,
                        "ms": ms,
                        "decode_ms": r.decode_ms,
                        "source": "chat",
                    }

                return run

            for name, items, make in (
                ("recurring", problems, recurring),
                ("retrieved", docs, retrieved),
                ("chat", docs, chat),
                ("fresh", problems[: len(docs)], fresh),
            ):
                if name not in only:
                    continue
                rows = []
                for i, item in enumerate(items):
                    rows.append(_both(i, make(item)))
                say(f"{name}: {len(rows)} answers, both ways")
                sets[name] = _summary(name, rows)
        finally:
            for s in services.values():
                s.close()
    return {"k": k, "n_ctx": engine.config.n_ctx, "threads": engine.config.n_threads, "sets": list(sets.values())}


def call_costs(engine: Engine, sizes=(1, 2, 4, 8, 9), repeats: int = 7) -> list[dict]:
    """What one llama_decode call of n tokens costs after a 542-token context, median of `repeats`: with the
    logits at the last position only (a prefill chunk) and at every position (a verify call)."""
    from kvgraft.app.core.textgen import synthetic_text
    from kvgraft.engine.lookup_decode import feed

    toks = engine.model.tokenize(synthetic_text(400, seed=7))[:542]
    out = []
    with engine.session() as s:
        s.prefill(toks)
        n0 = s.n_past
        for n in sizes:
            fed = list(toks[1 : 1 + n])
            last, every = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                s.prefill(fed)
                last.append(time.perf_counter() - t0)
                s.trim(n0)
                t0 = time.perf_counter()
                feed(s, fed, keep=n)
                every.append(time.perf_counter() - t0)
                s.trim(n0)
            out.append(
                {"tokens": n, "last_ms": statistics.median(last) * 1e3, "every_ms": statistics.median(every) * 1e3}
            )
    return out


def table(result: dict) -> str:
    lines = [
        "| set | answers | tokens/call (lookup) | median ms plain | median ms lookup | tok/s plain | tok/s lookup "
        "| tok/s ratio | differ from plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["sets"]:
        p, q = s["plain"], s["lookup"]
        lines.append(
            f"| {s['set']} | {s['answers']} | {q['tokens_per_call']} | {p['median_ms']} | {q['median_ms']} | "
            f"{p['decode_tok_s']} | {q['decode_tok_s']} | {s['speedup_tok_s']}x | {s['differ']} |"
        )
    return "\n".join(lines)
