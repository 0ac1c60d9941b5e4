"""Pack commands: export, import, build."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvgraft.engine.errors import EngineError
from kvgraft.library.errors import LibraryError

from ..library_service import LibraryService, open_library
from ..packs import build_pack, export_pack, import_pack
from .common import EXIT_CHECK_FAILED, emit_json, engine_options, handle_errors, stage_progress
from .keys_cmds import resolve_key


@click.command()
@click.argument("entry_ids", type=int, nargs=-1)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The .kvpack file to write."
)
@click.option("--query", help="Export the entries a full-text search finds.")
@click.option("--all", "all_", is_flag=True, help="Export every entry.")
@click.option(
    "--sign",
    "sign",
    metavar="KEY",
    help="Sign the pack with this key (a name from `kvgraft keys list`, or a key file).",
)
@click.option("--json", "as_json", is_flag=True, help="Print file, entries, blobs, bytes and sha256 as JSON.")
@handle_errors
def export(entry_ids, output, query, all_, sign, as_json) -> None:
    """Write entries (by id, by --query, or --all) to a solution pack (proven entries only)."""
    if sum(bool(x) for x in (entry_ids, query, all_)) != 1:
        raise click.UsageError("choose the entries: IDs, --query TEXT or --all (exactly one)")
    with open_library() as lib:
        if all_:
            entries = lib.entries()
        elif query:
            entries = lib.search(query, limit=1_000_000)
        else:
            entries = [lib.get(i) for i in entry_ids]
        res = export_pack(lib, entries, output, sign_key=resolve_key(sign) if sign else None)
    if as_json:
        emit_json(res)
    else:
        click.echo(
            f"wrote {res['file']}: {res['entries']} entries, {res['blobs']} blobs, {res['bytes'] / 1e6:.1f} MB, "
            f"sha256 {res['sha256']}" + (f", signed by {res['signed_by']}" if res["signed_by"] else ", unsigned")
        )


@click.command(name="import")
@click.argument("files", type=click.Path(dir_okay=False, path_type=Path), nargs=-1, required=True)
@click.option(
    "--rebuild",
    is_flag=True,
    help="A pack for another model or fingerprint: import its texts and rebuild the blobs here.",
)
@click.option(
    "--require-signed", is_flag=True, help="Refuse packs that are not signed by a trusted key (kvgraft keys)."
)
@click.option(
    "--no-replay",
    is_flag=True,
    help="Do not replay unsigned entries: import them unproven (listed, never grafted until verify --replay).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print imported, skipped (counts) and refused [{file, reason}] as JSON."
)
@engine_options
@handle_errors
def import_(state, files, rebuild, require_signed, no_replay, as_json) -> None:
    """Import solution packs; each is checked completely, then imported whole or refused.

    A state is opaque, so its origin is proven before it can be grafted: entries of a pack signed
    by a key you trust are taken as signed; every other entry is replayed here (one prefill each)
    and must reproduce its blob's SHA-256, or the whole pack is refused, naming the entry.

    Exit 0 when every pack was imported (entries already in the library are skipped), 1 when any
    was refused; the library is unchanged by a refused pack.
    """
    engine = state.engine()
    imported = skipped = replayed = 0
    refused, replay_s = [], 0.0
    with open_library() as lib, LibraryService(engine, lib) as service:
        for f in files:
            try:
                res = import_pack(
                    service,
                    f,
                    rebuild=rebuild,
                    progress=stage_progress(f"import {Path(f).name}"),
                    require_signed=require_signed,
                    replay=not no_replay,
                )
            except (LibraryError, EngineError, OSError) as exc:  # refused: this pack only, the others go on
                refused.append({"file": str(f), "reason": str(exc)})
                if not as_json:
                    click.echo(f"refused {f}: {exc}", err=True)
                continue
            imported += res["imported"]
            skipped += res["skipped"]
            replayed += res.get("replayed", 0)
            replay_s += res.get("replay_s", 0.0)
            if not as_json:
                click.echo(
                    f"imported {f}: {res['imported']} entries"
                    + (f", {res['skipped']} already present" if res["skipped"] else "")
                    + (f" ({res['rebuilt']} rebuilt here)" if res["rebuilt"] else "")
                    + (
                        f", signed by {res['signed_by']}"
                        + ("" if res.get("signer_trusted") else " (not a key you trust)")
                        if res["signed_by"]
                        else ", unsigned"
                    )
                )
                if res.get("replayed"):
                    click.echo(
                        f"  proof: {res['replayed']} entries replayed here ({res['replay_tokens']:,} tokens "
                        "prefilled in "
                        f"{res['replay_s']:.1f} s), each reproduced its blob's SHA-256"
                    )
                if res.get("proof", {}).get("unproven"):
                    click.echo(
                        f"  {res['proof']['unproven']} entries unproven (never grafted; kvgraft verify --library "
                        "--replay "
                        "proves them)"
                    )
    if as_json:
        emit_json(
            {
                "imported": imported,
                "skipped": skipped,
                "refused": refused,
                "replayed": replayed,
                "replay_s": round(replay_s, 3),
            }
        )
    if refused:
        sys.exit(EXIT_CHECK_FAILED)


@click.command()
@click.argument("problems", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The .kvpack file to write."
)
@click.option("--json", "as_json", is_flag=True, help="Print the exported pack's summary as JSON.")
@engine_options
@handle_errors
def build(state, problems, output, as_json) -> None:
    """Deposit each {question, solution, answer} of a JSONL file and export exactly those as a pack."""
    engine = state.engine()
    with open_library() as lib, LibraryService(engine, lib) as service:
        res = build_pack(service, problems, output, progress=stage_progress("build"))
    if as_json:
        emit_json(res)
    else:
        click.echo(
            f"built {res['file']}: {res['entries']} entries, {res['bytes'] / 1e6:.1f} MB, sha256 {res['sha256']}"
        )


COMMANDS = [export, import_, build]
