"""Answering and checking: ask, solve, verify."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kvgraft.library.errors import LibraryError

from ..ask import ask as run_ask
from ..library_service import LibraryService, open_library
from ..packs import state_size_limit, trust_store, trusted_name
from ..problems import read_jsonl
from ..solve import solve as run_solve
from ..verify import compare_receipts, library_items, pack_inputs, pack_items, receipts_sha256, run_verify
from .common import EXIT_CHECK_FAILED, EXIT_INPUT, emit_json, engine_options, handle_errors, stage_progress


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
    """Answer a question: by graft from a proven entry for it, from a stored prefix, or fresh.

    The answer streams to stdout as it is decoded, then its provenance follows on stderr.
    """
    engine = state.engine()
    context = context_file.read_text(encoding="utf-8") if context_file else None

    def stream(_tok: int, piece: str) -> None:
        click.echo(piece, nl=False)

    with open_library() as lib, LibraryService(engine, lib) as service:
        r = run_ask(
            service,
            question,
            context=context,
            budget=budget,
            use_library=not no_library,
            on_token=None if as_json else stream,
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
    with open_library() as lib, LibraryService(engine, lib) as service:
        out = run_solve(
            service, items, budget=budget, related=related, deposit=not no_deposit, progress=stage_progress("solve")
        )
    if as_json:
        emit_json(out)
        return
    for r in out["results"]:
        click.echo(
            f"{r['id']:<12} {r['source']:<6} {'ok' if r['checked'] else 'wrong':<5} {r['decode_tokens']:>5} decode "
            "tokens" + (f", {r['prefill_tokens_saved']:,} prefill tokens saved" if r["prefill_tokens_saved"] else "")
        )
    click.echo(
        f"{out['problems']} problems: {out['solved_from_library']} solved from the library, {out['solved_fresh']} "
        "fresh, "
        f"{out['unsolved']} unsolved; {out['decode_tokens']:,} decode tokens, {out['prefill_tokens_saved']:,} "
        "prefill tokens saved, "
        f"{out['wall_s']:.1f} s; {out['deposited']} new solutions deposited"
    )
    if related:
        h = out["held_out"]
        click.echo(
            f"held out ({h['problems']} with no stored entry): accuracy {h['accuracy_without_related']} without, "
            f"{h['accuracy_with_related']} with the best related entry grafted ({h['with_a_related_entry']} had one)"
        )


@click.command()
@click.argument("packs", type=click.Path(dir_okay=False, path_type=Path), nargs=-1)
@click.option("--library", "use_library", is_flag=True, help="Verify every entry in the library.")
@click.option(
    "--replay",
    is_flag=True,
    help="Recompute each blob fresh (must be bit-identical) and compare graft vs fresh logits.",
)
@click.option(
    "--samples",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Probe continuations per entry with --replay.",
)
@click.option(
    "--receipts",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write (or with --check, read) the receipts JSON.",
)
@click.option("--check", is_flag=True, help="Re-run the checks a receipts file records and compare every hash.")
@click.option("--json", "as_json", is_flag=True, help="Print ok, entries and failures as JSON.")
@engine_options
@handle_errors
def verify(state, packs, use_library, replay, samples, receipts, check, as_json) -> None:
    """Verify packs or the whole library: blob hashes, bit-exact replay, graft vs fresh logits, answers.

    Exit 0 only if every check passed. With --receipts FILE the inputs' and outputs' hashes and the
    engine fingerprint are written to FILE; `verify --receipts FILE --check` re-runs and compares.
    """
    if check:
        if not receipts or packs or use_library:
            raise click.UsageError("--check takes only --receipts FILE")
        old = json.loads(Path(receipts).read_text())
        if old.get("kind") != "kvgraft-verify-receipts":
            raise click.UsageError(f"{receipts} is not a kvgraft receipts file")
        packs = tuple(Path(i["path"]) for i in old["inputs"] if i["type"] == "pack")
        use_library = any(i["type"] == "library" for i in old["inputs"])
        replay, samples = old["options"]["replay"], old["options"]["samples"]
    elif bool(packs) == use_library:
        raise click.UsageError("give pack files or --library (one of them)")
    engine = state.engine()
    readers = []
    try:
        with open_library() as lib, LibraryService(engine, lib) as service:
            items, inputs = [], []
            for p in packs:
                inp, reader = pack_inputs(p)
                readers.append(reader)
                reader.max_blob_size = state_size_limit(engine)
                if check and inp["sha256"] != next(
                    i["sha256"] for i in old["inputs"] if i.get("path") == str(Path(p).resolve())
                ):
                    click.echo(f"error: {p} is not the pack the receipts name (its SHA-256 changed)", err=True)
                    sys.exit(EXIT_INPUT)
                inputs.append(inp)
                items += pack_items(reader, inp["sha256"], trusted_signer=trusted_name(reader, trust_store(lib.root)))
            if use_library:
                entries = lib.entries()
                if check:
                    refs = {r["ref"] for r in old["results"]}
                    entries = [e for e in entries if f"library#{e.id}" in refs]
                inputs.append({"type": "library", "path": str(lib.root), "entries": len(entries)})
                items += library_items(service, entries)
            if not items:
                raise LibraryError("nothing to verify: the library is empty")
            out = run_verify(service, items, inputs, replay, samples, progress=stage_progress("verify"))
    finally:
        for r in readers:
            r.close()
    if check:
        diffs = compare_receipts(old, out)
        recorded = old.get("failures") or ([{"entry": None, "check": "ok"}] if old.get("ok") is not True else [])
        res = {
            "ok": not diffs and not recorded,
            "entries": len(old["results"]),
            "failures": diffs,
            "recorded_failures": recorded,
            "hashes_reproduced": not diffs,
            "receipts_sha256": receipts_sha256(old),
        }
        if as_json:
            emit_json(res)
        else:
            click.echo(
                f"re-checked {receipts}: "
                + (
                    "every hash reproduced"
                    if not diffs
                    else f"{len(diffs)} differences:\n"
                    + "\n".join(f"  {d['entry']}: {d['check']}: {d['detail']}" for d in diffs)
                )
            )
            if recorded:
                click.echo(
                    f"but the recorded run had {len(recorded)} failed checks: "
                    + ", ".join(f"{f['entry']}: {f['check']}" for f in recorded),
                    err=True,
                )
        sys.exit(0 if res["ok"] else EXIT_CHECK_FAILED)
    if receipts:
        Path(receipts).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    if as_json:
        emit_json(
            {
                "ok": out["ok"],
                "entries": out["entries"],
                "failures": out["failures"],
                "fingerprint": out["fingerprint"],
                "receipts": str(receipts) if receipts else None,
                "receipts_sha256": receipts_sha256(out),
            }
        )
    else:
        for r in out["results"]:
            c = r["checks"]
            parts = ["blob ok" if c.get("blob_ok") else "BLOB BAD"]
            if "replay_ok" in c:
                parts.append("replay bit-identical" if c["replay_ok"] else "REPLAY DIFFERS (not the state of its text)")
                if c["probes"]:
                    parts.append(f"{sum(p['equal'] for p in c['probes'])}/{len(c['probes'])} probes byte-equal")
            parts.append(
                f"proof {c['proof']}" + (" -> replayed" if r["ref"] in out["proven_by_replay"] else "")
                if c["proven"]
                else f"proof {c['proof']} (never grafted; --replay can prove it)"
            )
            if "answer" in c:
                parts.append(f"answer {c['answer']['decoded']!r} " + ("ok" if c["answer"]["ok"] else "WRONG"))
            click.echo(f"{r['ref']:<28} " + ", ".join(parts))
        click.echo(
            f"{out['entries']} entries: "
            + ("all checks passed" if out["ok"] else f"{len(out['failures'])} failures")
            + (f"; receipts in {receipts} (sha256 {receipts_sha256(out)[:16]}...)" if receipts else "")
        )
    if not out["ok"]:
        sys.exit(EXIT_CHECK_FAILED)


COMMANDS = [ask, solve, verify]
