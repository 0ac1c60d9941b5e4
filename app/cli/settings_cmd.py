"""`kvgraft settings`: the data dir's saved engine settings (app/core/settings_store.py), shown or saved."""

from __future__ import annotations

import click

from kvgraft.app.cli.common import cli_home, emit_json, engine_options, handle_errors
from kvgraft.app.core.settings_store import save_settings, saved_settings, settings_path


@click.command("settings")
@click.option("--save", is_flag=True, help="Save the settings shown (the options given over the saved ones).")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON on stdout.")
@engine_options
@handle_errors
def settings_cmd(state, save: bool, as_json: bool) -> None:
    """The engine settings this data dir uses: what the window saved (or `--save`), the options given here
    over them. Every command that runs the model, `kvgraft serve` and the window read the same file, so one
    library is filled under one engine configuration. Nothing is loaded."""
    home = cli_home()
    if save:
        save_settings(home, state.settings)
    where = settings_path(home)
    origin = "saved" if saved_settings(home) is not None else "built-in defaults (nothing saved)"
    if as_json:
        emit_json({"file": str(where), "saved": origin == "saved", "settings": state.settings.to_dict()})
        return
    click.echo(f"settings of {home} ({where}: {origin})")
    for key, value in state.settings.to_dict().items():
        click.echo(f"  {key:<13} {'embedded' if key == 'model' and value is None else value}")
