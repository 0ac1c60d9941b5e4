"""`kvgraft bench`: kvgraft against the peers, side by side, with receipts."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvgraft.app.cli.common import emit_json, engine_options, handle_errors
from kvgraft.app.lab.bench import run_bench
from kvgraft.app.lab.bench_report import markdown_table, plot


@click.command()
@click.option("--quick", is_flag=True, help="512/1,024/2,048 tokens, fewer runs (under 3 minutes on 2 cores).")
@click.option("--json", "as_json", is_flag=True, help="Print the results JSON on stdout.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Also write bench.json, bench.md and bench.png (matplotlib: the `plot` extra) there.",
)
@engine_options
@handle_errors
def bench(state, quick, as_json, out_dir) -> None:
    """Time to first token for stored prefixes: fresh, kvgraft, llama-cpp-python's state paths, the floor.

    Also the graft alone vs prefilling, decode-token economy, lookup latency by library size, and
    blob bytes per token for f16 and q8_0 KV. Ratios are measured side by side in one run; the
    machine's noise applies to all methods alike.
    """
    engine = state.engine()
    res = run_bench(engine, quick, say=lambda m: click.echo(m, err=True))
    table = markdown_table(res)
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench.json").write_text(json.dumps(res, indent=1) + "\n")
        (out_dir / "bench.md").write_text(table + "\n")
        if not plot(res, out_dir / "bench.png"):
            click.echo("no plot: matplotlib is not installed (pip install 'kvgraft[plot]')", err=True)
    if as_json:
        emit_json(res)
    else:
        click.echo(table)
