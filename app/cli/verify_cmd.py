"""`kvgraft verify`: packs or the library in batch, with a receipts file anyone can re-check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kvgraft.app.cli.common import EXIT_CHECK_FAILED, cli_home, emit_json, engine_options, handle_errors, stage_progress
from kvgraft.app.core.words import counted
from kvgraft.app.remote.manage import verify_named
from kvgraft.app.service import LibraryService, open_library
from kvgraft.app.verify.batch import recheck_receipts, verify_targets
from kvgraft.app.verify.items import receipts_sha256


@click.command()
@click.argument("packs", type=click.Path(dir_okay=False, path_type=Path), nargs=-1)
@click.option("--library", "use_library", is_flag=True, help="Verify every entry in the library.")
@click.option(
    "--remote",
    "remote_name",
    metavar="NAME",
    help="Check a remote in place (no model loaded): every manifest's hash and signature, every named blob.",
)
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
def verify(state, packs, use_library, remote_name, replay, samples, receipts, check, as_json) -> None:
    """Verify packs or the whole library: blob hashes, bit-exact replay, graft vs fresh logits, answers.

    Exit 0 only if every check passed. With --receipts FILE the inputs' and outputs' hashes and the
    engine fingerprint are written to FILE; `verify --receipts FILE --check` re-runs and compares.
    """
    if remote_name is not None:
        if packs or use_library or check or receipts or replay:
            raise click.UsageError("--remote NAME takes no packs, --library, --replay, --receipts or --check")
        _verify_remote(remote_name, as_json)
        return
    if check:
        if not receipts or packs or use_library:
            raise click.UsageError("--check takes only --receipts FILE")
        old = json.loads(Path(receipts).read_text())
        if old.get("kind") != "kvgraft-verify-receipts":
            raise click.UsageError(f"{receipts} is not a kvgraft receipts file")
    elif bool(packs) == use_library:
        raise click.UsageError("give pack files or --library (one of them)")
    with open_library(cli_home()) as lib, LibraryService(state.engine(), lib) as service:
        if check:
            res = recheck_receipts(service, old, progress=stage_progress("verify"))
        else:
            out = verify_targets(
                service,
                packs=packs,
                entries=lib.entries() if use_library else None,
                replay=replay,
                samples=samples,
                progress=stage_progress("verify"),
            ).receipts
    if check:
        if as_json:
            emit_json(res.as_dict())
        else:
            diffs = res.differences
            click.echo(
                f"re-checked {receipts}: "
                + (
                    "every hash reproduced"
                    if not diffs
                    else f"{len(diffs)} differences:\n"
                    + "\n".join(f"  {d['entry']}: {d['check']}: {d['detail']}" for d in diffs)
                )
            )
            if res.recorded_failures:
                click.echo(
                    f"but the recorded run had {len(res.recorded_failures)} failed checks: "
                    + ", ".join(f"{f['entry']}: {f['check']}" for f in res.recorded_failures),
                    err=True,
                )
        sys.exit(0 if res.ok else EXIT_CHECK_FAILED)
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
            f"{counted(out['entries'], 'entry')}: "
            + ("all checks passed" if out["ok"] else f"{len(out['failures'])} failures")
            + (f"; receipts in {receipts} (sha256 {receipts_sha256(out)[:16]}...)" if receipts else "")
        )
    if not out["ok"]:
        sys.exit(EXIT_CHECK_FAILED)


def _verify_remote(name: str, as_json: bool) -> None:
    with open_library(cli_home()) as lib:
        res = verify_named(lib, name, progress=stage_progress("verify"))
    if as_json:
        emit_json(res.as_dict())
    else:
        signed = ", ".join(f"{n} signed by {k}" for k, n in res.signed.items())
        click.echo(
            f"remote {name}: {counted(res.manifests, 'manifest')}, {counted(res.entries, 'entry')}, "
            f"{counted(res.blobs, 'blob')} "
            f"({res.bytes / 1e6:.1f} MB)" + (f"; {signed}" if signed else "")
        )
        for n in res.notes:
            click.echo(f"  note: {n['object']}: {n['note']}")
        for p in res.problems:
            click.echo(f"  PROBLEM: {p['object']}: {p['problem']}")
        click.echo("all checks passed" if res.ok else f"{len(res.problems)} problems")
    if not res.ok:
        sys.exit(EXIT_CHECK_FAILED)
