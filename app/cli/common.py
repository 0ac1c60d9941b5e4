"""Shared CLI plumbing: the context object, JSON output, progress on stderr and exit codes.

Exit codes: EXIT_CODES below is the one table; docs/cli.md prints it (scripts/gen_cli_docs.py).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import click

from kvgraft.app.core.model_store import ModelStoreError
from kvgraft.app.core.paths import data_dir
from kvgraft.app.core.runtime import KV_TYPE_NAMES, Settings, open_engine
from kvgraft.app.core.settings_store import saved_settings
from kvgraft.engine.config import DEFAULT_LOOKUP, MAX_LOOKUP
from kvgraft.engine.errors import EngineError
from kvgraft.library.errors import IndexDatabaseError, LibraryError

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_INPUT = 0, 1, 2, 3
# every command's exit codes, as docs/cli.md states them (generated from this table)
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_CHECK_FAILED: "a check ran and failed: selftest or the demo not byte-exact, verify (--remote too) or "
    "fsck found a problem, chat --check found a difference",
    EXIT_USAGE: "usage error: the command line is wrong (an unknown option, a missing, conflicting or "
    "malformed argument or option value), click's one-line message",
    EXIT_INPUT: "bad input or environment: a file, text or pack the command read and refused (`import` and "
    "`deposit` when any file was refused, `pull` when any entry was), a missing or invalid model, an engine or "
    "library error, a remote that cannot be reached or refuses the credentials, with a one-line `error:` message",
}


@dataclass
class CliState:
    settings: Settings
    _engine: object = field(default=None, repr=False)

    def engine(self):
        if self._engine is None:
            self._engine = open_engine(self.settings, on_progress=lambda msg: click.echo(msg, err=True))
        return self._engine


def engine_options(f):
    """Options every command that runs the model accepts. What is not given on the command line comes
    from the data dir's saved settings (app/core/settings_store.py: what the window saved, or
    `kvgraft settings --save`), else the built-in defaults shown here."""
    d = Settings()
    opts = [
        click.option(
            "--model",
            "model",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            metavar="FILE|NAME",
            help="GGUF model file, a known model (`kvgraft models list`) or `embedded` (Gemma 3 270M). "
            "Default: the data dir's saved model, else the embedded one.",
        ),
        click.option(
            "--n-ctx", type=click.IntRange(16), default=None, help=f"Context size in tokens [default: {d.n_ctx}]."
        ),
        click.option("--threads", type=click.IntRange(1), default=None, help="CPU threads (default: physical cores)."),
        click.option(
            "--gpu-layers",
            type=click.IntRange(0),
            default=None,
            help="Layers to offload to the GPU (CUDA builds only) [default: 0].",
        ),
        click.option(
            "--batch-size",
            "n_batch",
            type=click.IntRange(1),
            default=None,
            help="Tokens per llama_decode call: part of the decode schedule each entry records (it decides "
            f"bits) [default: {d.n_batch}].",
        ),
        click.option(
            "--ubatch-size",
            "n_ubatch",
            type=click.IntRange(1),
            default=None,
            help="Tokens per compute step, at most --batch-size: also part of the recorded schedule "
            f"[default: {d.n_ubatch}, or --batch-size when smaller].",
        ),
        click.option(
            "--lookup",
            type=click.IntRange(0, MAX_LOOKUP),
            default=None,
            help="Greedy decoding checks this many tokens guessed from the context in each call "
            f"(prompt-lookup decoding; every call is recorded, so replays stay exact) [default: {DEFAULT_LOOKUP}].",
        ),
        click.option("--no-lookup", is_flag=True, help="Decode one token per call (the same as --lookup 0)."),
        click.option(
            "--flash-attn/--no-flash-attn",
            default=None,
            help="Flash attention (explicit: it changes the bits) [default: off].",
        ),
        click.option(
            "--type-k", type=click.Choice(KV_TYPE_NAMES), default=None, help="KV cache type of K [default: f16]."
        ),
        click.option(
            "--type-v",
            type=click.Choice(KV_TYPE_NAMES),
            default=None,
            help="KV cache type of V (a quantized one needs flash attention) [default: f16].",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)

    @functools.wraps(f)
    def wrapper(
        *args,
        model,
        n_ctx,
        threads,
        gpu_layers,
        n_batch,
        n_ubatch,
        lookup,
        no_lookup,
        flash_attn,
        type_k,
        type_v,
        **kwargs,
    ):
        base = saved_settings(cli_home()) or Settings()
        given = {
            "n_ctx": n_ctx,
            "n_threads": threads,
            "n_gpu_layers": gpu_layers,
            "flash_attn": flash_attn,
            "type_k": type_k,
            "type_v": type_v,
            "n_batch": n_batch,
            "lookup": 0 if no_lookup else lookup,
        }
        settings = replace(base, **{k: v for k, v in given.items() if v is not None})
        if model is not None:
            settings = replace(settings, model=None if str(model) == "embedded" else model)
        if n_ubatch is not None or n_batch is not None:
            # given: as given (the engine refuses one past the batch); else the saved one, at most the batch
            settings = replace(
                settings, n_ubatch=n_ubatch if n_ubatch is not None else min(base.n_ubatch, settings.n_batch)
            )
        return f(*args, state=CliState(settings), **kwargs)

    return wrapper


def handle_errors(f):
    """Turn the errors a user can cause into a one-line message and exit code 3 (EXIT_INPUT)."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except (EngineError, LibraryError, ModelStoreError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_INPUT)
        except UnicodeDecodeError as exc:
            click.echo(f"error: the file is not UTF-8 text ({exc.reason} at byte {exc.start})", err=True)
            sys.exit(EXIT_INPUT)
        except (OSError, ValueError, IndexDatabaseError) as exc:  # unreadable files, unwritable paths, a locked index
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_INPUT)

    return wrapper


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def cli_home() -> Path:
    """The data dir this command works in: the group's `--home`, else `$KVGRAFT_HOME`, else the
    platform's user data dir (app/core/paths.py). Passed explicitly to what opens the library."""
    ctx = click.get_current_context(silent=True)
    home = ctx.find_root().params.get("home") if ctx is not None else None
    return data_dir(home)


def setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


def token_progress(label: str, min_total: int = 512):
    """A prefill progress callback for stderr: a live counter on a terminal, one line otherwise."""
    tty = sys.stderr.isatty()

    def report(done: int, total: int) -> None:
        if total < min_total:
            return
        if tty:
            click.echo(f"\r{label} {done:,}/{total:,} tokens", err=True, nl=done == total)
        elif done == total:
            click.echo(f"{label} {total:,} tokens", err=True)

    return report


def stage_progress(prefix: str):
    """A (stage, done, total) progress callback for stderr: live on a terminal, sparse lines otherwise."""
    tty = sys.stderr.isatty()
    last = {}

    def report(stage: str, done: int, total: int) -> None:
        if tty:
            click.echo(f"\r{prefix}: {stage} {done:,}/{total:,}", err=True, nl=done == total)
        elif done == total or done - last.get(stage, 0) >= max(1, total // 10):
            last[stage] = done
            click.echo(f"{prefix}: {stage} {done:,}/{total:,}", err=True)

    return report
