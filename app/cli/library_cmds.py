"""Library commands: list, search, show, rm, gc, fsck, stats (deposit: app/cli/deposit_cmd.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvgraft.app.cli.common import (
    EXIT_CHECK_FAILED,
    cli_home,
    emit_json,
    engine_options,
    handle_errors,
    stage_progress,
)
from kvgraft.app.cli.deposit_cmd import deposit
from kvgraft.app.core.words import counted
from kvgraft.app.maintain.disk import remove_entries
from kvgraft.app.maintain.repair import check_library
from kvgraft.app.packs.trust import signer_words, trust_store
from kvgraft.app.service import open_library
from kvgraft.engine.config import DEFAULT_N_CTX
from kvgraft.library.errors import LibraryError
from kvgraft.library.maintenance import free_blobs
from kvgraft.library.maintenance import gc as run_gc


@click.command(name="list")
@click.option("--kind", type=click.Choice(["solution", "document", "prefix"]), default=None, help="Only this kind.")
@click.option("--limit", type=click.IntRange(1), default=None, help="At most this many entries.")
@click.option(
    "--check",
    is_flag=True,
    help="Load the model and mark which entries this engine can graft (the rest need a rebuild).",
)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of entries.")
@engine_options
@handle_errors
def list_entries(state, kind, limit, check, as_json) -> None:
    """List the library's entries."""
    fingerprint = state.engine().fingerprint if check else None
    with open_library(cli_home()) as lib:
        entries = lib.entries(limit=limit, kind=kind)
    if as_json:
        emit_json([e.summary(fingerprint) | {"fingerprint": e.fingerprint} for e in entries])
    elif not entries:
        click.echo("the library is empty")
    else:
        click.echo(_table(entries, fingerprint))
        unproven = sum(not e.proven for e in entries)
        if unproven:
            click.echo(
                f"{unproven} unproven entries are never grafted; kvgraft verify --library --replay proves them",
                err=True,
            )


def _table(entries, fingerprint: str | None = None) -> str:
    graft = fingerprint is not None
    lines = [
        f"{'id':>5}  {'kind':<8}  {'tokens':>7}  {'answer':<8}  {'proof':<16}  "
        + ("graftable      " if graft else "")
        + f"{'blob':<16}  title"
    ]
    for e in entries:
        flag = "damaged" if e.damaged else ("verified" if e.verified else ("stated" if e.answer is not None else "-"))
        g = f"{_graftable_word(e, fingerprint):<15}" if graft else ""
        lines.append(
            f"{e.id:>5}  {e.kind:<8}  {e.n_tokens:>7,}  {flag:<8}  {e.proof[:16]:<16}  {g}{e.blob_sha256[:16]}  "
            f"{(e.title or '')[:60]}"
        )
    return "\n".join(lines)


def _graftable_word(e, fingerprint: str) -> str:
    if e.graftable(fingerprint):
        return "yes"
    if e.damaged:
        return "no (damaged)"
    return "no (unproven)" if not e.proven else "needs rebuild"


@click.command()
@click.argument("text")
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of matching entries, best first.")
@handle_errors
def search(text, limit, as_json) -> None:
    """Full-text search over titles, questions and texts (best match first)."""
    with open_library(cli_home()) as lib:
        entries = lib.search(text, limit=limit)
    if as_json:
        emit_json([e.summary() for e in entries])
    else:
        click.echo(_table(entries) if entries else "no match")


@click.command()
@click.argument("entry_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="The whole entry as JSON (text included).")
@handle_errors
def show(entry_id, as_json) -> None:
    """Show one entry: its provenance, hashes and text."""
    with open_library(cli_home()) as lib:
        e = lib.get(entry_id)
        pack = lib.pack(e.pack_id) if e.pack_id else None
        on_disk = lib.blobs.stored_size(e.blob_sha256)
        section = lib.sources.section_of(e.id)
    provenance = provenance_text(pack)
    if as_json:
        emit_json(
            e.as_dict()
            | {
                "provenance": provenance,
                "signed_by": pack["signer"] if pack else None,
                "blob_stored_size": on_disk,
                "verified": e.verified,
                "verified_by": e.vouched_by,
                "section": section.as_dict() if section else None,
            }
        )
        return
    rows = [
        ("entry", f"#{e.id} ({e.kind})"),
        ("title", e.title),
        ("question", e.question),
        ("answer", e.answer),
        ("tokens", f"{e.n_tokens:,} (sha256 {e.tokens_sha256})"),
        (
            "blob",
            f"{e.blob_sha256} ({e.blob_size:,} bytes, "
            + (f"{on_disk:,} on disk)" if on_disk is not None else "missing from disk)"),
        ),
        ("fingerprint", e.fingerprint),
        ("model", e.model_sha256),
        ("source", provenance),
        ("file", f"{section.path} ({section.words()})" if section else None),
        ("proof", proof_words(e.proof)),
        (
            "answer is",
            (f"verified by {e.vouched_by} at {e.verified_at}" if e.verified else "stated, not verified")
            if e.answer is not None
            else None,
        ),
        ("created", e.created_at),
        ("damaged", e.damaged),
    ]
    click.echo("\n".join(f"{k:<12} {v}" for k, v in rows if v is not None))
    click.echo("\n" + e.text)


def proof_words(proof: str) -> str:
    """What an entry's proof means, in words."""
    if proof == "local":
        return "local (its state was computed here)"
    if proof == "replayed":
        return "replayed (recomputed here: the same canonical SHA-256)"
    if proof.startswith("signed:"):
        return f"{proof} (from a pack signed by a key you trust)"
    return "unproven (never grafted; kvgraft verify --library --replay can prove it)"


def provenance_text(pack: dict | None) -> str:
    """'local deposit', or the pack it came from and whether that pack was signed."""
    if pack is None:
        return "local deposit"
    signed = signer_words(pack["signer"], trust_store(cli_home()))
    return f"pack {pack['file_name']} (#{pack['id']}, sha256 {pack['sha256'][:16]}...), {signed}"


@click.command()
@click.argument("entry_ids", type=int, nargs=-1)
@click.option(
    "--file",
    "files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Forget a deposited file (repeatable): the entries its deposit made go, unless something else holds them.",
)
@handle_errors
def rm(entry_ids, files) -> None:
    """Remove entries, or deposited files; their blobs go at once when nothing else uses them."""
    if not entry_ids and not files:
        raise click.UsageError("give entry ids, or --file PATH")
    with open_library(cli_home()) as lib:
        out = remove_entries(lib, entry_ids)
        for e in out["removed"]:
            click.echo(f"removed entry #{e.id} ({e.n_tokens:,} tokens)")
        for f in files:
            path = str(f.expanduser().resolve())  # the file itself may be gone: its path is its identity
            gone = lib.sources.forget_source(path)
            if gone is None:
                raise LibraryError(f"no deposited file at {path}")
            click.echo(
                f"forgot {path}: removed entries {', '.join(f'#{i}' for i in gone)}"
                if gone
                else f"forgot {path}: no entry removed (each was stored before it, or something else holds it)"
            )
        more = free_blobs(lib) if files else {"removed_bytes": 0, "removed_blobs": 0}
        freed = {k: out[k] + more[k] for k in ("removed_bytes", "removed_blobs")}
        click.echo(f"disk given back: {freed['removed_bytes']:,} bytes ({counted(freed['removed_blobs'], 'blob')})")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
@handle_errors
def gc(as_json) -> None:
    """Remove blobs no entry references (never one another process is still writing), and the older
    states of chat threads (never a thread's newest, never a fork point)."""
    with open_library(cli_home()) as lib:
        res = run_gc(lib)
    if as_json:
        emit_json(res)
    else:
        click.echo(
            f"removed {res['removed_sessions']} older thread states, {counted(res['removed_blobs'], 'blob')} "
            f"({res['removed_bytes'] / 1e6:.1f} MB), "
            f"{res['removed_temp_files']} temp files, {res['removed_pending']} stale pending records"
        )


@click.command()
@click.option(
    "--repair",
    is_flag=True,
    help="Repair what is safe: compact blobs from before compaction, reclaim leftovers, fix index rows, mark damage.",
)
@click.option("--quick", is_flag=True, help="Skip re-hashing every blob (sizes and presence only).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (ok, problems, reclaimable).")
@handle_errors
def fsck(repair, quick, as_json) -> None:
    """Check the library: missing or corrupt blobs, index rows that point nowhere, leftovers.

    Exit 0 when there are no problems (reclaimable leftovers of interrupted writes are not
    problems), 1 otherwise.
    """
    with open_library(cli_home()) as lib:
        res = check_library(lib, repair=repair, quick=quick, progress=stage_progress("fsck"))
    if as_json:
        emit_json(res.as_dict())
    else:
        for line in res.lines():
            click.echo(line)
    if not res.ok:
        sys.exit(EXIT_CHECK_FAILED)


@click.command()
@click.option(
    "--n-ctx",
    type=click.IntRange(16),
    default=DEFAULT_N_CTX,
    show_default=True,
    help="Context size to express the library's size against.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="entries, blobs, bytes on disk, tokens, bytes per token, context_multiple as JSON.",
)
@handle_errors
def stats(n_ctx, as_json) -> None:
    """Library size: entries, blobs, bytes on disk, bytes per stored token, and tokens as a multiple
    of the context window."""
    with open_library(cli_home()) as lib:
        res = lib.stats(n_ctx=n_ctx)
    if as_json:
        emit_json(res)
    else:
        bpt = f"{res['bytes_per_token']:,.0f}" if res["bytes_per_token"] else "-"
        cbpt = f"{res['canonical_bytes_per_token']:,.0f}" if res["canonical_bytes_per_token"] else "-"
        click.echo(
            f"{counted(res['entries'], 'entry')}, {counted(res['blobs'], 'blob')}, "
            f"{res['bytes'] / 1e6:,.1f} MB on disk, "
            f"{res['tokens']:,} tokens stored\n"
            f"bytes per stored token: {bpt} on disk ({cbpt} uncompacted)\n"
            f"usable context: {res['context_multiple']:,.2f} x n_ctx {n_ctx:,}"
            + (f"\n{res['damaged']} damaged entries (run kvgraft fsck)" if res["damaged"] else "")
            + (
                f"\n{res['unproven']} unproven entries, never grafted (kvgraft verify --library --replay proves them)"
                if res["unproven"]
                else ""
            )
            + (
                f"\n{counted(res['uncompacted_blobs'], 'blob')} from before compaction "
                "(run kvgraft fsck --repair to compact them)"
                if res["uncompacted_blobs"]
                else ""
            )
            + "".join(
                f"\nchat thread #{tid}: {n / 1e6:,.1f} MB of stored states"
                for tid, n in res["session_bytes_by_thread"].items()
            )
        )


@click.command()
@click.option("--limit", type=click.IntRange(1), default=None, help="At most this many entries this run.")
@click.option("--json", "as_json", is_flag=True, help="moved, same_bits and refused (id: why) as JSON.")
@engine_options
@handle_errors
def migrate(state, limit, as_json) -> None:
    """Move the entries made under this engine's earlier fingerprint onto it, each proven again.

    Each entry's state is computed here from its tokens and a graft of it is checked against the fresh
    run (app/maintain/migrate.py); only then does the entry move, with proof "replayed". Entries that
    fail stay where they are and are listed. Exit 0 when none failed."""
    from kvgraft.app.maintain.migrate import migrate as run_migrate
    from kvgraft.app.service import LibraryService

    progress = stage_progress("migrate")
    with open_library(cli_home()) as lib, LibraryService(state.engine(), lib) as service:
        report = run_migrate(service, on_progress=lambda done, total, _e: progress("entries", done, total), limit=limit)
    if as_json:
        emit_json(report.as_dict())
    elif not report.pending:
        click.echo("nothing to migrate: no entry of this model is under this engine's earlier fingerprint")
    else:
        click.echo(
            f"{len(report.moved):,} of {counted(report.pending, 'entry')} moved onto this engine "
            f"({len(report.same_bits):,} "
            f"kept their bits, {len(report.moved) - len(report.same_bits):,} were computed again); {report.left:,} left"
        )
        for eid, why in report.refused.items():
            click.echo(f"entry #{eid} stays: {why}", err=True)
    if report.refused:
        sys.exit(EXIT_CHECK_FAILED)


COMMANDS = [deposit, list_entries, search, show, rm, gc, fsck, stats, migrate]
