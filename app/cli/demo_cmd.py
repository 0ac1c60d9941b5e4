"""`kvgraft demo`: the main job on the embedded model."""

from __future__ import annotations

import sys

import click

from ..demo import format_demo, run_demo
from .common import EXIT_CHECK_FAILED, emit_json, engine_options, handle_errors


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@engine_options
@handle_errors
def demo(state, as_json: bool) -> None:
    """Deposit documents of 1K/2K/3K tokens, graft them back, show exactness and prefill vs graft time."""
    engine = state.engine()
    result = run_demo(engine, on_step=lambda m: click.echo(m, err=True))
    if as_json:
        emit_json(result)
    else:
        click.echo(format_demo(result))
        click.echo(f"\nengine fingerprint {result['fingerprint'][:16]}...; every graft exact: {'yes' if result['all_exact'] else 'NO'}")
    if not result["all_exact"]:
        sys.exit(EXIT_CHECK_FAILED)
