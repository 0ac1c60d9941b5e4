"""`kvgraft deposit`: texts and files (.txt, .md, .pdf, ...) into the library (app/ingest/documents.py for files)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvgraft.app.cli.common import (
    EXIT_INPUT,
    cli_home,
    emit_json,
    engine_options,
    handle_errors,
    stage_progress,
    token_progress,
)
from kvgraft.app.ingest.documents import SECTION_TOKENS, DocumentError, deposit_file, read_document
from kvgraft.app.proof.checkers import CHECKERS, UnknownChecker, check_name
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.errors import EngineError
from kvgraft.library.errors import LibraryError


def _read_text(text: str | None, source: str | None, as_text: bool) -> str:
    if text is not None:
        return text
    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    if not path.is_file():
        raise DocumentError(f"no such file: {source}")  # bad input (exit 3), as for several files
    # as every deposited file is read: a document suffix (or --as-text), UTF-8 (BOM dropped, "\n" line
    # ends) or a PDF's text
    return read_document(path, as_text=as_text)


def _checker_option(_ctx, _param, value: str | None) -> str | None:
    """--checker, validated where every checker name is (app/proof/checkers.py)."""
    if value is None:
        return None
    try:
        return check_name(value)
    except UnknownChecker as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.argument("sources", nargs=-1)
@click.option("--text", help="The text to deposit (instead of file paths or -).")
@click.option("--question", help="The question this text answers (exact-match key).")
@click.option("--answer", help="The answer, if any (makes it a solution); stated, not verified, unless --confirmed.")
@click.option("--confirmed", is_flag=True, help="You vouch that --answer is right: it is stored as verified by you.")
@click.option(
    "--checker",
    callback=_checker_option,
    help=f"How a decoded answer is compared with --answer: {', '.join(sorted(CHECKERS))} [default: numeric].",
)
@click.option(
    "--kind",
    type=click.Choice(["solution", "document", "prefix"]),
    default=None,
    help="Entry kind (default: solution when --answer is given, else document).",
)
@click.option("--title", help="A title (default: a markdown file's first heading, the question or the first line).")
@click.option(
    "--section-tokens",
    type=click.IntRange(128),
    default=SECTION_TOKENS,
    show_default=True,
    help="A file longer than the context is split into sections of at most this many tokens.",
)
@click.option(
    "--as-text",
    is_flag=True,
    help="Read each file as UTF-8 text whatever its suffix (a file without one, a .log).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the entry (one file) or {deposited: [...]} as JSON.")
@engine_options
@handle_errors
def deposit(
    state, sources, text, question, answer, kind, title, confirmed, checker, section_tokens, as_text, as_json
) -> None:
    """Read texts into the model and store their KV states in the library.

    SOURCES are .txt, .md, .markdown, .rst, .text or .pdf files (any other file only with
    --as-text), or - for stdin; or pass --text. A file that fits the context is stored verbatim
    (so `ask --context FILE` grafts it); a longer one is split into sections at paragraph
    boundaries, each starting with the document's title and its section line.
    A file is known by its resolved path: depositing an unchanged file again computes nothing, a
    changed one has its sections replaced in one transaction. The same text twice is one blob.
    """
    if confirmed and answer is None:
        raise click.UsageError("--confirmed vouches for an --answer: give one")
    if checker is not None and answer is None:
        raise click.UsageError("--checker says how an --answer is checked: give one")
    if text is not None and sources:
        raise click.UsageError("give the text with --text TEXT, or file paths, or - for stdin, not both")
    if text is None and not sources:
        raise click.UsageError("give the text with --text TEXT, or file paths, or - for stdin")
    keyed = question is not None or answer is not None or kind in ("solution", "prefix")
    if len(sources) > 1 and (keyed or title is not None or "-" in sources):
        raise click.UsageError("--question, --answer, --kind, --title and - apply to one text: give one SOURCE")
    if text is not None or sources == ("-",) or keyed:
        body = _read_text(text, sources[0] if sources else None, as_text)
        _deposit_text(state, body, question, answer, kind, title, confirmed, checker, as_json)
        return
    engine = state.engine()
    done, refused = [], []
    with open_library(cli_home()) as lib, LibraryService(engine, lib) as service:
        for source in sources:
            try:
                fd = deposit_file(
                    service,
                    Path(source),
                    title=title,
                    section_tokens=section_tokens,
                    progress=_file_progress(),
                    as_text=as_text,
                )
            except (LibraryError, EngineError, OSError, ValueError) as exc:
                if len(sources) == 1:
                    raise
                refused.append({"file": source, "reason": str(exc)})
                click.echo(f"refused {source}: {exc}", err=True)
                continue
            done.append(fd)
            if not as_json:
                click.echo(_file_words(fd))
    if as_json:
        emit_json(
            done[0].as_dict() if len(sources) == 1 else {"deposited": [d.as_dict() for d in done], "refused": refused}
        )
    if refused:
        sys.exit(EXIT_INPUT)


def _deposit_text(state, body, question, answer, kind, title, confirmed, checker, as_json) -> None:
    engine = state.engine()
    with open_library(cli_home()) as lib, LibraryService(engine, lib) as service:
        res = service.deposit(
            body,
            question=question,
            answer=answer,
            kind=kind,
            title=title,
            on_progress=token_progress("prefill"),
            checker=checker,
            vouched_by="you" if confirmed else None,
        )
    if as_json:
        emit_json(res.as_dict())
    else:
        verb = "deposited" if res.created else "already stored as"
        click.echo(
            f"{verb} entry #{res.entry.id}: {res.entry.n_tokens:,} tokens, blob {res.entry.blob_sha256[:16]}... "
            f"({res.entry.blob_size / 1e6:.1f} MB)" + (f", prefill {res.prefill_s:.2f} s" if res.created else "")
        )


def _file_words(fd) -> str:
    name = Path(fd.file).name
    if fd.unchanged:
        return (
            f"{name}: unchanged since its last deposit (entr{'ies' if fd.sectioned else 'y'} "
            + ", ".join(f"#{e.id}" for e in fd.entries)
            + ")"
        )
    made = sum(fd.created)
    if not fd.sectioned:
        e = fd.entries[0]
        verb = "deposited" if made else "already stored as"
        return (
            f"{name}: {verb} entry #{e.id}: {e.n_tokens:,} tokens, blob {e.blob_sha256[:16]}... "
            f"({e.blob_size / 1e6:.1f} MB)" + (f", prefill {fd.prefill_s:.2f} s" if made else "")
        )
    tokens = sum(e.n_tokens for e in fd.entries)
    ids = [e.id for e in fd.entries]
    span = f"#{ids[0]}-#{ids[-1]}" if ids == list(range(ids[0], ids[0] + len(ids))) else ", ".join(f"#{i}" for i in ids)
    line = f"{name}: {len(ids)} sections ({span}), {tokens:,} tokens, {made} computed" + (
        f", prefill {fd.prefill_s:.1f} s" if made else ""
    )
    gone = len(fd.removed)
    return line + (f"; {gone} old section{'s' if gone != 1 else ''} removed" if gone else "")


def _file_progress():
    """Section progress on stderr: a live line on a terminal, a line per section otherwise."""
    tty = sys.stderr.isatty()
    live = stage_progress("deposit")

    def report(stage: str, done: int, total: int) -> None:
        if tty:
            live(stage, done, total)
        elif stage.endswith(": sections") and total > 1:
            click.echo(f"deposit: {stage} {done:,}/{total:,}", err=True)

    return report
