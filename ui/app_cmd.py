"""`kvgraft app`: start the desktop window (the same as double-clicking kvgraft-app).

Registered on the CLI group by kvgraft.entry, so that app/ never imports ui/.
"""

from __future__ import annotations

import sys

import click


@click.command(name="app")
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False))
def app_cmd(files) -> None:
    """Open the kvgraft desktop window; FILES (.kvpack, .jsonl, .txt, .md, .pdf, .gguf) are opened as if dropped
    on it."""
    from .main_window import run

    sys.exit(run(sys.argv[:1] + list(files)))
