"""The `kvgraft` command line: one click group, commands split into modules by concern."""

from __future__ import annotations

from pathlib import Path

import click

from kvgraft.app import __version__
from kvgraft.app.cli.answer_cmds import COMMANDS as ANSWER_COMMANDS
from kvgraft.app.cli.bench_cmd import bench
from kvgraft.app.cli.cache_cmds import cache
from kvgraft.app.cli.chat_cmds import chat
from kvgraft.app.cli.common import setup_logging
from kvgraft.app.cli.demo_cmd import demo
from kvgraft.app.cli.engine_cmds import doctor, selftest
from kvgraft.app.cli.keys_cmds import keys
from kvgraft.app.cli.library_cmds import COMMANDS as LIBRARY_COMMANDS
from kvgraft.app.cli.models_cmd import models
from kvgraft.app.cli.pack_cmds import COMMANDS as PACK_COMMANDS
from kvgraft.app.cli.remote_cmds import COMMANDS as REMOTE_COMMANDS
from kvgraft.app.cli.serve_cmd import serve_cmd
from kvgraft.app.cli.settings_cmd import settings_cmd
from kvgraft.app.cli.verify_cmd import verify


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvgraft")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for llama.cpp's own log).")
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="KVGRAFT_HOME",
    default=None,
    help="Data dir (library, keys, receipts). Default: $KVGRAFT_HOME, else the platform's user data dir.",
)
def cli(verbose: int, home: Path | None) -> None:
    """kvgraft: reuse a language model's KV cache as verified knowledge, byte-exactly."""
    setup_logging(verbose)


cli.add_command(doctor)
cli.add_command(selftest)
cli.add_command(demo)
cli.add_command(bench)
cli.add_command(keys)
cli.add_command(verify)
cli.add_command(chat)
cli.add_command(serve_cmd)
cli.add_command(cache)
cli.add_command(models)
cli.add_command(settings_cmd)
for _cmd in LIBRARY_COMMANDS + PACK_COMMANDS + REMOTE_COMMANDS + ANSWER_COMMANDS:
    cli.add_command(_cmd)


def main() -> None:
    """The CLI without the window's `app` command (kvgraft.entry adds it: app/ never imports ui/)."""
    cli(prog_name="kvgraft")
