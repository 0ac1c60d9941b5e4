"""Engine commands: `doctor` and `selftest`."""

from __future__ import annotations

import sys

import click

from kvgraft.app.cli.common import EXIT_CHECK_FAILED, cli_home, emit_json, engine_options, handle_errors
from kvgraft.app.core.words import counted
from kvgraft.app.maintain.doctor import doctor_report
from kvgraft.app.maintain.graft_checks import check_words, record_selftest
from kvgraft.app.maintain.selftest import run_selftest, summary_line
from kvgraft.engine.cpu_backend import CpuBackend
from kvgraft.engine.exactness import ExactnessRecord


def invariance_words(inv: dict) -> str:
    """What the probe found about batching, in words (the doctor's line)."""
    if inv["invariant"]:
        words = f"yes: {inv['splits']} splits into decode calls gave the one-call bits"
    else:
        words = f"no: {', '.join(inv['differ'])} gave other bits (exact paths keep their recorded schedules)"
    return words + ("; n_threads decides the bits" if inv["threads_decide_bits"] else "")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@engine_options
@handle_errors
def doctor(state, as_json: bool) -> None:
    """Versions, backend, GPU offload support, model, data dir and engine fingerprint."""
    report = doctor_report(state.engine(), cli_home())
    if as_json:
        emit_json(report.as_dict())
        return
    m, cfg = report.model, report.config
    lines = [
        f"kvgraft           {report.kvgraft} (python {report.python})",
        f"llama-cpp-python  {report.packages['llama-cpp-python']}",
        f"backend           {report.backend} (GPU offload supported: "
        f"{'yes' if report.gpu_offload_supported else 'no'})",
        f"cpu backend       {CpuBackend.from_dict(report.cpu_backend).describe()}",
        f"model             {m['name']} ({m['architecture']}, {m['n_layer']} layers, sliding window {m['n_swa']})",
        f"model file        {m['path']}",
        f"model sha256      {m['sha256']}",
        f"context           n_ctx {cfg['n_ctx']}, flash attention {'on' if cfg['flash_attn'] else 'off'}, "
        f"KV {cfg['type_k']}/{cfg['type_v']}, {cfg['n_threads']} threads",
        f"KV bytes/token    {report.kv_bytes_per_token:,}",
        "compaction        "
        + (
            f"on: window-layer cells {report.compaction['n_swa']:,} or more behind are stored as zero runs"
            if report.compaction["active"]
            else "off (no standard sliding window)"
        ),
        f"data dir          {report.data_dir}",
        f"model cache       {report.model_dir}",
        f"fingerprint       {report.fingerprint}",
        f"batch-invariant   {invariance_words(report.batch_invariance)}",
        "to migrate        "
        + (
            f"{counted(report.to_migrate, 'entry')} made under this engine's earlier fingerprint (kvgraft migrate)"
            if report.to_migrate
            else "nothing"
        ),
        "window libraries  "
        + (
            "all found"
            if not report.window_libraries
            else f"missing {', '.join(sorted(report.window_libraries))}: sudo apt-get install "
            + " ".join(sorted(set(report.window_libraries.values())))
        ),
    ]
    words = check_words(report.graft_check)
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

    def progress(i: int, n: int, d: ExactnessRecord) -> None:
        mark = "equal" if d.sha256_equal and d.tokens_equal else f"DIFFERENT (max |diff| {d.max_abs_diff:.3g})"
        click.echo(f"[{i}/{n}] prefix {d.prefix_tokens:>5} tokens: {mark}", err=True)

    result = run_selftest(engine, samples, seed=seed, on_sample=progress)
    record_selftest(engine, result.as_dict())  # `kvgraft doctor` reports it
    if as_json:
        emit_json(result.as_dict())
    else:
        click.echo(summary_line(result))
    if not result.exact:
        sys.exit(EXIT_CHECK_FAILED)
