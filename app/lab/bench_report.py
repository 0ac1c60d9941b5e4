"""The benchmark's results as text: the console table, the README's markdown table and the optional plot."""

from __future__ import annotations

from pathlib import Path

from kvgraft.app.lab.bench_recurring import recurring_table

METHODS = ["fresh", "kvgraft", "llama_cpp_python_state", "llama_cpp_python_disk_cache", "floor"]


EXACT_NOTE = (
    '"exact" comes from a logits comparison (blank: none ran): for fresh, its runs (same prompt, same decode '
    "schedule) gave logits SHA-256-equal to each other; for the others, every run's logits were SHA-256-equal "
    "to every fresh run of that stack."
)


def method_table(res: dict) -> str:
    """The TTFT table, one row per method present in `res["results"]`, and what its "exact" means."""
    lengths = sorted({r["prefix_tokens"] for r in res["results"]})
    by = {(r["method"], r["prefix_tokens"]): r for r in res["results"]}
    lines = ["| method | " + " | ".join(f"{n:,} tokens" for n in lengths) + " |", "| --- |" + " --- |" * len(lengths)]
    for m in METHODS:
        if not any((m, n) in by for n in lengths):
            continue
        cells = []
        for n in lengths:
            r = by.get((m, n))
            if r is None:
                cells.append("-")
                continue
            ex = "" if r["exact"] is None else (" exact" if r["exact"] else " **not exact**")
            cells.append(f"{r['median_s'] * 1e3:,.1f} ms{ex}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", EXACT_NOTE]
    return "\n".join(lines)


def markdown_table(res: dict) -> str:
    lengths = sorted({r["prefix_tokens"] for r in res["results"]})
    by = {(r["method"], r["prefix_tokens"]): r for r in res["results"]}
    lines = [method_table(res)]
    rat = res["ratios"]
    lines += ["", "| ratio | " + " | ".join(f"{n:,}" for n in lengths) + " |", "| --- |" + " --- |" * len(lengths)]
    for key, label in (
        ("graft_vs_prefill", "prefill the prefix / graft alone"),
        ("ttft_fresh_vs_kvgraft", "TTFT fresh / kvgraft"),
        ("peer_state_vs_kvgraft", "TTFT llama_cpp_python_state / kvgraft"),
        ("peer_disk_cache_vs_kvgraft", "TTFT llama_cpp_python_disk_cache / kvgraft"),
        ("graft_vs_floor", "graft alone / floor"),
    ):
        lines.append(f"| {label} | " + " | ".join(f"{rat[str(n)][key]:,.1f}x" for n in lengths) + " |")
    lines += ["", recurring_table(res.get("kvgraft_recurring") or [])]
    e = res["decode_economy"]
    lines += [
        "",
        (
            f"Decode-token economy ({e['problems']} starter problems): fresh {e['fresh_decode_tokens']} decode tokens, "
            f"{e['fresh_correct']}/{e['problems']} correct, {e['fresh_s']:.1f} s; from the library "
            f"{e['graft_decode_tokens']} tokens, "
            f"{e['graft_correct']}/{e['problems']} correct, {e['graft_s']:.1f} s: {e['token_ratio']:.0f}x fewer "
            "tokens, "
            f"{e['time_ratio']:.0f}x less time; {e['exact_grafts']}/{e['problems']} grafts exact."
        ),
    ]
    xs = {x["prefix_tokens"]: x for x in res["prefixes"]}
    if all("graft_alone_uncompacted_s" in xs[n] for n in lengths):
        lines += [
            "",
            "| compaction | " + " | ".join(f"{n:,}" for n in lengths) + " |",
            "| --- |" + " --- |" * len(lengths),
        ]
        for key, label, fmt in (
            ("bytes_per_token_uncompacted", "blob bytes/token, uncompacted", "{:,.0f}"),
            ("bytes_per_token_compacted", "blob bytes/token, compacted", "{:,.0f}"),
            ("graft_alone_uncompacted_s", "graft alone, uncompacted (ms)", "ms"),
            ("graft_alone_s", "graft alone, compacted (ms)", "ms"),
        ):
            cells = [f"{xs[n][key] * 1e3:,.1f}" if fmt == "ms" else fmt.format(xs[n][key]) for n in lengths]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        both = [(xs[n]["uncompacted_exact"], by[("kvgraft", n)]["exact"]) for n in lengths]
        lines.append(
            "| both exact | "
            + " | ".join(
                "yes" if a is True and b is True else "not compared" if None in (a, b) else "**no**" for a, b in both
            )
            + " |"
        )
    kv = ", ".join(
        f"{k['type_k']}/{k['type_v']}{' (flash attn)' if k['flash_attn'] else ''}: whole state "
        f"{k['state_bytes_per_token']:,.0f} B/token, stored (compacted) {k['stored_bytes_per_token']:,.0f} B/token, "
        f"graft {'exact' if k['graft_exact'] else 'NOT exact'}"
        for k in res["kv_types"]
    )
    kv_n = sorted({k["prefix_tokens"] for k in res["kv_types"]})
    lines += ["", f"KV cache types at {', '.join(f'{n:,}' for n in kv_n)} tokens: {kv}."]
    lines += [
        "",
        "Lookup latency: "
        + "; ".join(
            f"{r['entries']:,} entries: exact {r['exact_question_ms']:.3f} ms, longest prefix "
            f"{r['longest_prefix_hit_ms']:.3f} ms (miss {r['longest_prefix_miss_ms']:.3f} ms)"
            for r in res["library_scale"]
        ),
    ]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> bool:
    """TTFT vs prefix length per method (PNG). False when matplotlib (the `plot` extra) is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in ["fresh", "llama_cpp_python_disk_cache", "llama_cpp_python_state", "kvgraft", "floor"]:
        pts = sorted((r["prefix_tokens"], r["median_s"]) for r in res["results"] if r["method"] == m)
        ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], marker="o", label=m)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("stored prefix (tokens)")
    ax.set_ylabel("time to first token (ms); floor: read + memcpy")
    ax.set_title("kvgraft vs peers, CPU, median of runs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
