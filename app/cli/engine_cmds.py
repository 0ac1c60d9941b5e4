"""Engine commands: `doctor` and `selftest`."""

from __future__ import annotations

import sys

import click

from ..doctor import doctor_report
from ..graft_checks import check_words, record_selftest
from ..selftest import run_selftest, summary_line
from .common import EXIT_CHECK_FAILED, cli_home, emit_json, engine_options, handle_errors


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@engine_options
@handle_errors
def doctor(state, as_json: bool) -> None:
    """Versions, backend, GPU offload support, model, data dir and engine fingerprint."""
    report = doctor_report(state.engine(), cli_home())
    if as_json:
        emit_json(report)
        return
    m = report["model"]
    lines = [
        f"kvgraft           {report['kvgraft']} (python {report['python']})",
        f"llama-cpp-python  {report['packages']['llama-cpp-python']}",
        f"backend           {report['backend']} (GPU offload supported: "
        f"{'yes' if report['gpu_offload_supported'] else 'no'})",
        f"model             {m['name']} ({m['architecture']}, {m['n_layer']} layers, sliding window {m['n_swa']})",
        f"model file        {m['path']}",
        f"model sha256      {m['sha256']}",
        f"context           n_ctx {report['config']['n_ctx']}, flash attention "
        f"{'on' if report['config']['flash_attn'] else 'off'}, "
        f"KV {report['config']['type_k']}/{report['config']['type_v']}, {report['config']['n_threads']} threads",
        f"KV bytes/token    {report['kv_bytes_per_token']:,}",
        "compaction        "
        + (
            f"on: window-layer cells {report['compaction']['n_swa']:,} or more behind are stored as zero runs"
            if report["compaction"]["active"]
            else "off (no standard sliding window)"
        ),
        f"data dir          {report['data_dir']}",
        f"model cache       {report['model_dir']}",
        f"fingerprint       {report['fingerprint']}",
    ]
    words = check_words(report["graft_check"])
    lines += [f"{'graft check' if i == 0 else '':<18}{w}" for i, w in enumerate(words)]
    click.echo("\n".join(lines))


@click.command()
@click.option("--samples", type=click.IntRange(1), default=50, show_default=True, help="Number of random prefixes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the prefix lengths and texts.")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON on stdout.")
@engine_options
@handle_errors
def selftest(state, samples: int, seed: int, as_json: bool) -> None:
    """Graft vs fresh on random prefixes of 1..3,000 tokens: byte-equal logits and greedy tokens.

    Each sample prefills a prefix fresh, snapshots it, grafts the snapshot into a new context,
    then decodes the same probe continuation and 16 greedy tokens in both. Exit 0 only when every
    sample's logits are SHA-256-equal and its tokens equal. The outcome is kept in the model
    cache, per device and bit-deciding settings, for `kvgraft doctor` to report.
    """
    engine = state.engine()

    def progress(i: int, n: int, d: dict) -> None:
        mark = "equal" if d["sha256_equal"] and d["tokens_equal"] else f"DIFFERENT (max |diff| {d['max_abs_diff']:.3g})"
        click.echo(f"[{i}/{n}] prefix {d['prefix_tokens']:>5} tokens: {mark}", err=True)

    result = run_selftest(engine, samples, seed=seed, on_sample=progress)
    record_selftest(engine, result)  # `kvgraft doctor` reports it
    ok = result["sha256_equal"] == samples and result["tokens_equal"] == samples
    if as_json:
        emit_json(result)
    else:
        click.echo(summary_line(result))
    if not ok:
        sys.exit(EXIT_CHECK_FAILED)
