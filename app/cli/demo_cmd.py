"""`kvgraft demo`: the main job on the embedded model."""

from __future__ import annotations

import sys

import click

from kvgraft.app.cli.common import EXIT_CHECK_FAILED, cli_home, emit_json, engine_options, handle_errors
from kvgraft.app.lab.demo import format_demo, run_demo


@click.command()
@click.option(
    "--budget", type=click.IntRange(1), default=96, show_default=True, help="Decode-token budget per fresh answer."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result (the receipts) as JSON on stdout.")
@engine_options
@handle_errors
def demo(state, budget: int, as_json: bool) -> None:
    """The main job: recurring problems fresh vs from the library, prefill vs graft, all with receipts.

    Builds a starter pack of 24 verified problems in the data dir (once), answers each fresh within
    a token budget and then by graft, and times prefill against graft at about 1K, 2K and 3K tokens.
    Exit 0 only when every graft is byte-exact.
    """
    engine = state.engine()
    result = run_demo(engine, on_step=lambda m: click.echo(m, err=True), budget=budget, home=cli_home())
    if as_json:
        emit_json(result)
    else:
        click.echo(format_demo(result))
        click.echo(
            f"engine fingerprint {result['kvgraft_fingerprint'][:16]}...; every graft exact: "
            f"{'yes' if result['all_exact'] else 'NO'}"
        )
    if not result["all_exact"]:
        sys.exit(EXIT_CHECK_FAILED)
