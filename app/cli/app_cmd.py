"""`kvgraft app`: start the desktop window (the same as double-clicking kvgraft-app)."""

from __future__ import annotations

import sys

import click


@click.command(name="app")
def app_cmd() -> None:
    """Open the kvgraft desktop window."""
    from ui.main_window import run

    sys.exit(run(sys.argv[:1]))
