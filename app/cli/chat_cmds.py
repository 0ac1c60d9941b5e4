"""`kvgraft chat`: conversations that resume exactly after a restart (app/answer/chat.py)."""

from __future__ import annotations

import signal
import sys

import click

from kvgraft.app.answer.chat import DEFAULT_MAX_TOKENS, ChatService, thread_listing, thread_view
from kvgraft.app.cli.common import EXIT_CHECK_FAILED, cli_home, emit_json, engine_options, handle_errors
from kvgraft.app.core.errors import Cancelled
from kvgraft.app.core.words import counted
from kvgraft.app.service import LibraryService, open_library


@click.group(invoke_without_command=True)
@engine_options
@click.option("--system", default=None, help="System prompt of the thread the interactive loop starts.")
@click.option("--max-tokens", type=click.IntRange(1), default=DEFAULT_MAX_TOKENS, show_default=True)
@click.pass_context
@handle_errors
def chat(ctx, state, system, max_tokens) -> None:
    """Threads that resume instantly and exactly. Without a subcommand: an interactive loop.

    In the loop, /new starts a thread, /fork N forks the current one at turn N, /quit leaves;
    Ctrl-C stops a reply (the part decoded so far is kept, and the thread stays consistent).
    """
    if ctx.invoked_subcommand is not None:
        return
    _loop(state, system, max_tokens)


def _loop(state, system: str | None, max_tokens: int) -> None:
    stop = {"now": False}

    def on_sigint(_sig, _frame) -> None:
        stop["now"] = True

    def stream(piece: str) -> None:
        click.echo(piece, nl=False)
        if stop["now"]:
            raise Cancelled("Ctrl-C")  # say keeps the part decoded (stop_reason "callback")

    with open_library(cli_home()) as lib, LibraryService(state.engine(), lib) as service:
        chats = ChatService(service)
        thread = chats.new_thread(system=system)
        click.echo(f"thread #{thread.id} (/new, /fork N, /quit)", err=True)
        while True:
            try:
                line = click.prompt("you", prompt_suffix="> ", default="", show_default=False)
            except (EOFError, click.Abort):
                break
            if line.strip() in ("/quit", "/exit"):
                break
            if line.strip() == "/new":
                thread = chats.new_thread(system=system)
                click.echo(f"thread #{thread.id}", err=True)
                continue
            if line.startswith("/fork"):
                try:
                    thread = chats.fork(thread.id, int(line.split()[1]))
                    click.echo(f"thread #{thread.id} (forked)", err=True)
                except (IndexError, ValueError) as exc:
                    click.echo(f"usage: /fork N ({exc})", err=True)
                continue
            if not line.strip():
                continue
            stop["now"] = False
            old = signal.signal(signal.SIGINT, on_sigint)
            try:
                r = chats.say(thread.id, line, max_tokens=max_tokens, on_text=stream)
            finally:
                signal.signal(signal.SIGINT, old)
            click.echo("")
            click.echo(
                f"[turn {r.turn}: {r.tokens_restored:,} tokens restored in {r.resume_ms:.0f} ms, "
                f"{r.tokens_prefilled:,} prefilled, {r.tokens_decoded} decoded"
                + (", stopped" if r.stop_reason == "callback" else "")
                + "]",
                err=True,
            )


@chat.command("new")
@click.option("--system", default=None, help="System prompt.")
@click.option("--from-entry", type=int, default=None, help="Start after a proven library entry (a document).")
@click.option("--title", default=None, help="A title for the thread.")
@click.option("--json", "as_json", is_flag=True, help='Print {"thread": ID} as JSON.')
@engine_options
@handle_errors
def chat_new(state, system, from_entry, title, as_json) -> None:
    """Start a thread (its prompt format and engine fingerprint are recorded)."""
    with open_library(cli_home()) as lib, LibraryService(state.engine(), lib) as service:
        thread = ChatService(service).new_thread(system=system, from_entry=from_entry, title=title)
    if as_json:
        emit_json({"thread": thread.id, "format": thread.format})
    else:
        click.echo(f"thread #{thread.id} ({thread.format})")


@chat.command("say")
@click.argument("thread", type=int)
@click.argument("message")
@click.option(
    "--check", is_flag=True, help="Compare the logits before the reply with a replay of the thread's schedule."
)
@click.option("--max-tokens", type=click.IntRange(1), default=DEFAULT_MAX_TOKENS, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result on stdout (no streaming).")
@engine_options
@handle_errors
def chat_say(state, thread, message, check, max_tokens, as_json) -> None:
    """Send MESSAGE to THREAD: graft its latest state, prefill only the message, reply.

    With --check, exit 0 when the logits before the reply equal a replay of the thread's own decode
    schedule in a new context (exact: true), 1 when they differ.
    """

    def stream(piece: str) -> None:
        click.echo(piece, nl=False)

    with open_library(cli_home()) as lib, LibraryService(state.engine(), lib) as service:
        r = ChatService(service).say(
            thread, message, check=check, max_tokens=max_tokens, on_text=None if as_json else stream
        )
    if as_json:
        emit_json(r.as_dict())
    else:
        click.echo("")
        exact = {None: "not checked", True: "exact", False: "NOT exact"}[r.exact]
        if r.replay_ms is not None:
            exact += f" (a replay of its schedule in a new context: {r.replay_ms:,.0f} ms)"
        click.echo(
            f"turn {r.turn}: {r.tokens_restored:,} tokens restored in {r.resume_ms:.1f} ms, {r.tokens_prefilled:,} "
            f"prefilled in {r.prefill_ms:.1f} ms, {r.tokens_decoded} decoded; {exact}",
            err=True,
        )
    if r.exact is False:
        sys.exit(EXIT_CHECK_FAILED)


@chat.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the threads as JSON.")
@handle_errors
def chat_list(as_json) -> None:
    """Threads with their turns, tokens and session bytes."""
    with open_library(cli_home()) as lib:
        rows = thread_listing(lib)
    if as_json:
        emit_json({"threads": rows})
        return
    for r in rows:
        fork = f", fork of #{r['forked_from']}" if r["forked_from"] else ""
        click.echo(
            f"#{r['thread']}  {counted(r['turns'], 'turn')}, {r['tokens']:,} tokens, {r['session_bytes']:,} B{fork}  "
            f"{r['title'] or ''}"
        )


@chat.command("show")
@click.argument("thread", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the thread as JSON.")
@handle_errors
def chat_show(thread, as_json) -> None:
    """A thread's turns with their token counts and snapshot addresses."""
    with open_library(cli_home()) as lib:
        out = thread_view(lib, thread)
    if as_json:
        emit_json(out)
        return
    click.echo(f"thread #{out['id']} ({out['format']}){' - ' + out['title'] if out['title'] else ''}")
    for t in out["turns"]:
        click.echo(f"[{t['n']}] you: {t['user']}")
        click.echo(f"    model: {t['reply'].strip()}")
        click.echo(f"    {t['tokens']:,} tokens, state {t['blob_sha256'][:16]} (entry #{t['entry_id']})")


@chat.command("fork")
@click.argument("thread", type=int)
@click.option("--turn", type=click.IntRange(0), required=True, help="The last turn the new thread keeps.")
@click.option("--json", "as_json", is_flag=True, help='Print {"thread": ID} as JSON.')
@handle_errors
def chat_fork(thread, turn, as_json) -> None:
    """A new thread from turn N of THREAD (its stored state is grafted when the fork goes on)."""
    with open_library(cli_home()) as lib:
        new = lib.threads.fork_thread(thread, turn)
    if as_json:
        emit_json({"thread": new.id, "forked_from": thread, "turn": turn})
    else:
        click.echo(f"thread #{new.id}: turns 1..{turn} of #{thread}")


@chat.command("rm")
@click.argument("thread", type=int)
@handle_errors
def chat_rm(thread) -> None:
    """Delete a thread (its states are reclaimed by kvgraft gc once no thread uses them)."""
    with open_library(cli_home()) as lib:
        lib.threads.remove_thread(thread)
    click.echo(f"removed thread #{thread}")
