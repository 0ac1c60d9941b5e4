"""Answering and checking: ask, solve, verify."""

from __future__ import annotations

from pathlib import Path

import click

from kvgraft.app.answer.ask import ask as run_ask
from kvgraft.app.answer.solve import solve as run_solve
from kvgraft.app.cli.common import cli_home, emit_json, engine_options, handle_errors, stage_progress
from kvgraft.app.ingest.documents import read_context_file
from kvgraft.app.proof.problems import read_jsonl
from kvgraft.app.service import LibraryService, open_library
from kvgraft.library.errors import LibraryError


@click.command()
@click.argument("question")
@click.option(
    "--context",
    "context_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A document the question is about: a stored prefix of it is grafted, the rest prefilled.",
)
@click.option(
    "--budget", type=click.IntRange(1), default=128, show_default=True, help="Decode-token budget when answering fresh."
)
@click.option("--no-library", is_flag=True, help="Answer fresh, without looking in the library.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result on stdout (no streaming).")
@engine_options
@handle_errors
def ask(state, question, context_file, budget, no_library, as_json) -> None:
    """Answer a question: by graft from a proven entry for it, from the stored document it is about
    (retrieved: the document containing most of its words, weighted by rarity, is grafted and named),
    from a stored prefix, or fresh.

    The answer streams to stdout as it is decoded, then its provenance follows on stderr.
    """
    engine = state.engine()
    context = read_context_file(context_file) if context_file else None  # read as a deposit reads it

    def stream(piece: str) -> None:
        click.echo(piece, nl=False)

    with open_library(cli_home()) as lib, LibraryService(engine, lib) as service:
        r = run_ask(
            service,
            question,
            context=context,
            budget=budget,
            use_library=not no_library,
            on_text=None if as_json else stream,
        )
    if as_json:
        emit_json(r.as_dict())
        return
    click.echo("")
    click.echo(r.provenance(), err=True)
    if r.verified_answer is not None:
        click.echo(
            f"verified answer ({r.verified_by}): {r.verified_answer} - decoded answer "
            f"{'matches' if r.answer_checked else 'DOES NOT match'}",
            err=True,
        )
    elif r.stored_answer is not None:
        click.echo(f"stored answer (stated, not verified): {r.stored_answer}", err=True)


@click.command()
@click.argument("problems", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--budget", type=click.IntRange(1), default=256, show_default=True, help="Decode-token budget per fresh attempt."
)
@click.option(
    "--related", is_flag=True, help="Also try each unsolved problem after grafting the best related proven solution."
)
@click.option("--no-deposit", is_flag=True, help="Do not deposit solutions the checker confirmed.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-problem and total results as JSON.")
@engine_options
@handle_errors
def solve(state, problems, budget, related, no_deposit, as_json) -> None:
    """The flywheel: answer each problem from the library or fresh, check it, deposit what verifies."""
    try:
        items = read_jsonl(problems)
    except ValueError as exc:
        raise LibraryError(str(exc)) from exc
    engine = state.engine()
    with open_library(cli_home()) as lib, LibraryService(engine, lib) as service:
        out = run_solve(
            service, items, budget=budget, related=related, deposit=not no_deposit, progress=stage_progress("solve")
        )
    if as_json:
        emit_json(out.as_dict())
        return
    for r in out.rows:
        rel = ""
        if r.related is not None:  # which sibling was grafted, and what the second try gave
            rel = (
                f"; with #{r.related.entry_id} grafted ({r.related.question[:48]}): "
                f"{'ok' if r.related.checked else 'wrong'}, {r.related.decode_tokens} decode tokens"
            )
        elif r.tried_related:
            rel = "; no related solution fitted"
        click.echo(
            f"{r.id:<12} {r.source:<6} {'ok' if r.checked else 'wrong':<5} {r.decode_tokens:>5} decode "
            "tokens" + (f", {r.prefill_tokens_saved:,} prefill tokens saved" if r.prefill_tokens_saved else "") + rel
        )
    click.echo(
        f"{out.problems} problems: {out.solved_from_library} solved from the library, {out.solved_fresh} "
        "fresh, "
        f"{out.unsolved} unsolved; {out.decode_tokens:,} decode tokens, {out.prefill_tokens_saved:,} "
        "prefill tokens saved, "
        f"{out.wall_s:.1f} s; {out.deposited} new solutions deposited"
    )
    h = out.held_out
    if h is not None:
        click.echo(
            f"held out ({h.problems} with no stored entry): accuracy {h.accuracy_without_related} without, "
            f"{h.accuracy_with_related} with the best related entry grafted ({h.with_a_related_entry} had one)"
        )


COMMANDS = [ask, solve]
