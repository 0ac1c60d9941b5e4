"""`kvgraft cache list|unpin`: the server's named cache pins (library/cache_pins.py, docs/server.md)."""

from __future__ import annotations

import time

import click

from kvgraft.app.cli.common import EXIT_INPUT, cli_home, emit_json, handle_errors
from kvgraft.app.service import open_library


@click.group()
def cache() -> None:
    """The prefixes clients pinned in `kvgraft serve`'s prompt cache (cache_control, prompt_cache_key)."""


@cache.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print [{name, n_tokens, state, entry_id, expires_in_s}].")
@handle_errors
def cache_list(as_json) -> None:
    """Every named pin: its tokens, whether its state is stored (pinned) or not yet (pending), when it ends."""
    with open_library(cli_home()) as lib:
        pins = lib.cache.cache_pins()
    rows = [
        {
            "name": p.name,
            "n_tokens": p.n_tokens,
            "state": p.state,
            "entry_id": p.entry_id,
            "expires_in_s": max(0, round(p.expires_at - time.time())),
        }
        for p in pins
    ]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no pins: a request with cache_control or prompt_cache_key makes one (docs/server.md)")
    for r in rows:
        entry = f"entry {r['entry_id']}" if r["entry_id"] is not None else "not stored yet"
        ends = f"{r['expires_in_s'] / 3600:.1f} h left" if r["state"] != "expired" else "expired"
        click.echo(f"{r['name']}\t{r['n_tokens']} tokens\t{r['state']}\t{entry}\t{ends}")


@cache.command(name="unpin")
@click.argument("name")
@handle_errors
def cache_unpin(name) -> None:
    """End a pin now: its state becomes an ordinary cache state (evicted least recently used past the budget)."""
    with open_library(cli_home()) as lib:
        gone = lib.cache.unpin(name)
    if not gone:
        click.echo(f"no pin named {name!r} (kvgraft cache list)", err=True)
        raise SystemExit(EXIT_INPUT)
    click.echo(f"unpinned {name}")
