"""The team library: `kvgraft remote add|list|rm`, `kvgraft push`, `kvgraft pull` (docs/remote-format.md)."""

from __future__ import annotations

import sys

import click

from kvgraft.app.cli.common import EXIT_INPUT, cli_home, emit_json, engine_options, handle_errors, stage_progress
from kvgraft.app.cli.keys_cmds import resolve_key
from kvgraft.app.core.words import counted
from kvgraft.app.remote.manage import add_checked, forget, gc_cache_named, pull_named, push_named, remotes
from kvgraft.app.serve.run import parse_size
from kvgraft.app.service import LibraryService, open_library


@click.group()
def remote() -> None:
    """The S3 remotes this library pushes to and pulls from (credentials: boto3's environment and profiles)."""


@remote.command(name="add")
@click.argument("name")
@click.argument("url", metavar="s3://BUCKET[/PREFIX]")
@click.option("--endpoint-url", help="The S3 endpoint when it is not AWS (MinIO, Ceph RGW, R2, SeaweedFS).")
@click.option("--json", "as_json", is_flag=True, help="Print name, url, bucket, prefix, endpoint_url and reachable.")
@handle_errors
def remote_add(name, url, endpoint_url, as_json) -> None:
    """Name a bucket (and key prefix). The bucket must exist: it is checked, never created."""
    with open_library(cli_home()) as lib:
        spec = add_checked(lib, name, url, endpoint_url)
    if as_json:
        emit_json(spec)
    else:
        where = f" at {spec['endpoint_url']}" if spec["endpoint_url"] else ""
        click.echo(f"added remote {spec['name']}: {spec['url']}{where}")
        click.echo(f"bucket {spec['bucket']!r} is reachable with these credentials")


@remote.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print [{name, url, bucket, prefix, endpoint_url}].")
@handle_errors
def remote_list(as_json) -> None:
    """The remotes this library knows."""
    with open_library(cli_home()) as lib:
        specs = remotes(lib)
    if as_json:
        emit_json(specs)
    elif not specs:
        click.echo("no remotes yet: kvgraft remote add NAME s3://BUCKET[/PREFIX] [--endpoint-url URL]")
    for s in specs if not as_json else []:
        click.echo(f"{s['name']}\t{s['url']}" + (f"\t{s['endpoint_url']}" if s["endpoint_url"] else ""))


@remote.command(name="rm")
@click.argument("name")
@handle_errors
def remote_rm(name) -> None:
    """Forget a remote (the bucket and what it holds are left as they are)."""
    with open_library(cli_home()) as lib:
        forget(lib, name)
    click.echo(f"removed remote {name} (nothing in the bucket was touched)")


@click.command()
@click.argument("name")
@click.argument("entry_ids", type=int, nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Push every entry that may be pushed (proven knowledge).")
@click.option("--query", help="Push the entries a full-text search finds.")
@click.option(
    "--sign", metavar="KEY", help="Sign each manifest with this key (a name from `kvgraft keys list`, or a file)."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print pushed, skipped, bytes (and manifests, not_pushable) as JSON."
)
@handle_errors
def push(name, entry_ids, all_, query, sign, as_json) -> None:
    """Publish proven knowledge to a remote: blobs first, the manifest last, then the index.

    Entries the remote already holds are skipped. Only knowledge is pushed (solutions, documents,
    prefixes; never conversations, answer-ready or automatic states), and only proven entries:
    IDs that name anything else are refused; --all and --query leave such entries out and list them.
    """
    if sum(bool(x) for x in (entry_ids, query, all_)) != 1:
        raise click.UsageError("choose the entries: IDs, --query TEXT or --all (exactly one)")
    key = resolve_key(sign) if sign else None
    with open_library(cli_home()) as lib:
        res = push_named(lib, name, list(entry_ids), query, sign_key=key, progress=stage_progress("push"))
    if as_json:
        emit_json(res.as_dict())
        return
    click.echo(
        f"pushed {counted(res.pushed, 'entry')} to {name} ({res.bytes / 1e6:.1f} MB of blobs sent)"
        + (f", {res.skipped} already there" if res.skipped else "")
        + (f", {counted(len(res.manifests), 'manifest')}" if res.manifests else "")
        + (", signed" if key and res.manifests else "")
    )
    if res.recovered:
        click.echo(f"published {counted(len(res.recovered), 'manifest')} a stopped push had left unpublished")
    for n in res.not_pushable:
        click.echo(f"left out entry {n['entry']}: {n['reason']}", err=True)


@click.command()
@click.argument("name")
@click.option("--require-signed", is_flag=True, help="Refuse entries not signed by a key you trust (kvgraft keys).")
@click.option("--json", "as_json", is_flag=True, help="Print imported, skipped and refused [{entry, reason}] as JSON.")
@engine_options
@handle_errors
def pull(state, name, require_signed, as_json) -> None:
    """Import a remote's knowledge, proven as `kvgraft import` proves a pack.

    Every object is re-hashed as it is downloaded; entries signed by a key you trust (made under
    this engine's fingerprint) are taken as signed, every other one is replayed here. A refused
    entry is named with its reason and the others go on; a broken transfer imports nothing. Exit 0
    when nothing was refused, 3 otherwise.
    """
    with open_library(cli_home()) as lib:
        lib.remotes.get(name)  # an unknown name is refused before the model loads
        with LibraryService(state.engine(), lib) as service:
            res = pull_named(service, name, require_signed=require_signed, progress=stage_progress("pull"))
    if as_json:
        emit_json(res.as_dict())
    else:
        how = ", ".join(f"{n} {p}" for p, n in sorted(res.proof.items()))
        click.echo(
            f"pulled {counted(res.imported, 'entry')} from {name} ({res.bytes / 1e6:.1f} MB)"
            + (f" [{how}]" if how else "")
            + (f", {res.skipped} already here" if res.skipped else "")
            + (f", {len(res.refused)} refused" if res.refused else "")
        )
        for r in res.refused:
            click.echo(f"refused {r['entry']}: {r['reason']}", err=True)
    if res.refused:
        sys.exit(EXIT_INPUT)


@remote.command(name="gc")
@click.argument("name")
@click.option(
    "--cache-older-than",
    "older",
    default="7d",
    show_default=True,
    metavar="AGE",
    help="Remove the fleet's cache records written longer ago than AGE (e.g. 7d, 12h, 30m).",
)
@click.option(
    "--grace",
    default="1h",
    show_default=True,
    metavar="AGE",
    help="Keep a blob nothing names while it is younger than AGE (an upload writes its blob before its record).",
)
@click.option(
    "--cache-budget",
    "budget",
    default=None,
    metavar="SIZE",
    help="Also remove the oldest records past SIZE of the blobs they name (e.g. 500G).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
@handle_errors
def remote_gc(name, older, grace, budget, as_json) -> None:
    """Remove a fleet's old shared-cache states from remote NAME (`kvgraft serve --remote`): records older
    than --cache-older-than (and the oldest past --cache-budget), then blobs no record and no manifest
    names. Knowledge entries' blobs are never removed; safe beside instances uploading
    (docs/remote-format.md)."""
    try:
        older_s, grace_s = parse_age(older), parse_age(grace)
        budget_bytes = parse_size(budget) if budget is not None else None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    with open_library(cli_home()) as lib:
        out = gc_cache_named(lib, name, older_s, grace_s, budget_bytes)
    if as_json:
        emit_json(out)
    else:
        click.echo(
            f"remote {name}: {counted(out['records_removed'], 'cache record')} and "
            f"{counted(out['blobs_removed'], 'blob')} removed; {counted(out['blobs_in_grace'], 'blob')} "
            "nothing names kept for their grace period"
        )


def parse_age(text: str) -> float:
    """ "7d", "12h", "30m", "45s" (or a number of seconds) as seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise ValueError(f"{text!r} is not an age: a number with s, m, h or d (e.g. 7d)") from None


COMMANDS = [remote, push, pull]
