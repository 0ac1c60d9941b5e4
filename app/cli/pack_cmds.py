"""Pack commands: export, import, build."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvgraft.app.cli.common import EXIT_INPUT, cli_home, emit_json, engine_options, handle_errors, stage_progress
from kvgraft.app.cli.keys_cmds import resolve_key
from kvgraft.app.core.words import counted
from kvgraft.app.ingest.import_files import Refusal, import_files
from kvgraft.app.packs.export import build_pack, export_pack
from kvgraft.app.packs.results import PackImport
from kvgraft.app.service import LibraryService, open_library


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
    with open_library(cli_home()) as lib:
        if all_:
            entries = lib.entries()
        elif query:
            entries = lib.search(query, limit=1_000_000)
        else:
            entries = [lib.get(i) for i in entry_ids]
        res = export_pack(lib, entries, output, sign_key=resolve_key(sign) if sign else None)
    if as_json:
        emit_json(res.as_dict())
    else:
        click.echo(
            f"wrote {res.file}: {counted(res.entries, 'entry')}, {counted(res.blobs, 'blob')}, "
            f"{res.bytes / 1e6:.1f} MB, "
            f"sha256 {res.sha256}" + (f", signed by {res.signed_by}" if res.signed_by else ", unsigned")
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
    """Import solution packs (.kvpack), problem files (.jsonl) and documents (.txt, .md, .markdown,
    .rst, .text, .pdf); each pack is checked completely, then imported whole or refused (--rebuild
    too: every state is computed, then all are committed at once). A problem file's solutions are
    deposited (as `build` does), a document as `kvgraft deposit FILE` deposits it; any other file
    (one without a suffix too) is read as a pack.

    A state is opaque, so its origin is proven before it can be grafted: entries of a pack signed
    by a key you trust are taken as signed; every other entry is replayed here (one prefill each)
    and must reproduce its blob's SHA-256, or the whole pack is refused, naming the entry.

    Exit 0 when every file was imported (entries already in the library are skipped), 3 when any
    was refused (its reason on stderr, or in --json); the library is unchanged by a refused pack.
    The desktop window's drop runs the same import.
    """

    def show(done) -> None:
        if as_json:
            return
        if isinstance(done, Refusal):
            click.echo(f"refused {done.file}: {done.reason}", err=True)
        elif done.kind == "problems":
            click.echo(f"built {done.file}: {done.imported} solutions deposited, {done.skipped} already present")
        elif done.kind == "document":
            d = done.detail
            what = "unchanged" if d.unchanged else f"{len(d.entries)} sections, {done.imported} computed"
            click.echo(f"deposited {done.file} ({d.title}): {what}")
        else:
            click.echo(pack_import_line(done.file, done.detail))
            for line in pack_proof_lines(done.detail):
                click.echo(line)

    with open_library(cli_home()) as lib, LibraryService(state.engine(), lib) as service:
        summary = import_files(
            service,
            files,
            progress=stage_progress("import"),
            rebuild=rebuild,
            require_signed=require_signed,
            replay=not no_replay,
            on_file=show,
        )
    if as_json:
        emit_json(summary.as_dict())
    if summary.refused:
        sys.exit(EXIT_INPUT)


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
    with open_library(cli_home()) as lib, LibraryService(engine, lib) as service:
        res = build_pack(service, problems, output, progress=stage_progress("build"))
    if as_json:
        emit_json(res.as_dict())
    else:
        click.echo(f"built {res.file}: {counted(res.entries, 'entry')}, {res.bytes / 1e6:.1f} MB, sha256 {res.sha256}")


def pack_import_line(file: str, res: PackImport) -> str:
    return (
        f"imported {file}: {counted(res.imported, 'entry')}"
        + (f", {res.skipped} already present" if res.skipped else "")
        + (f" ({res.rebuilt} rebuilt here)" if res.rebuilt else "")
        + (
            f", signed by {res.signed_by}" + ("" if res.signer_trusted else " (not a key you trust)")
            if res.signed_by
            else ", unsigned"
        )
    )


def pack_proof_lines(res: PackImport) -> list[str]:
    lines = []
    if res.replayed:
        lines.append(
            f"  proof: {counted(res.replayed, 'entry')} replayed here ({res.replay_tokens:,} tokens prefilled in "
            f"{res.replay_s:.1f} s), each reproduced its blob's SHA-256"
        )
    if res.unproven:
        lines.append(
            f"  {counted(res.unproven, 'entry')} unproven "
            "(never grafted; kvgraft verify --library --replay proves them)"
        )
    return lines


COMMANDS = [export, import_, build]
