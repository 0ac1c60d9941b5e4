"""`kvgraft serve`: the OpenAI HTTP API over the library (app/serve/)."""

from __future__ import annotations

import logging

import click

from kvgraft.app.cli.common import cli_home, engine_options, handle_errors
from kvgraft.app.cli.keys_cmds import resolve_key
from kvgraft.app.serve.run import ServeError, ServeOptions, parse_size, serve


@click.command("serve")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind (other than loopback needs a key)."
)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="TCP port.")
@click.option(
    "--api-key",
    envvar="KVGRAFT_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1 and /metrics [env: KVGRAFT_API_KEY].",
)
@click.option(
    "--cache-budget",
    default=None,
    metavar="SIZE",
    help="Disk for automatic prompt states, least recently used evicted past it (e.g. 2G; 0 stores none) "
    "[default: 10% of the free disk, at most 20G].",
)
@click.option(
    "--queue-size",
    type=click.IntRange(1, 1024),
    default=16,
    show_default=True,
    help="Requests that may wait; past it a 429.",
)
@click.option(
    "--time-limit",
    type=click.FloatRange(1),
    default=600.0,
    show_default=True,
    help="Seconds a request may run (prompt and reply).",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Let a browser page from ORIGIN (e.g. http://localhost:3000, or *) call the API; repeatable "
    "[default: none, CORS off].",
)
@click.option(
    "--remote",
    default=None,
    metavar="NAME",
    help="Share the prompt cache with a fleet on this remote (kvgraft remote add): states stored here are "
    "uploaded signed, and a prompt is looked up there before it is prefilled (docs/server.md).",
)
@click.option(
    "--share-cache",
    type=click.Choice(["push", "pull", "both"]),
    default="both",
    show_default=True,
    help="With --remote: upload this instance's states, graft the fleet's, or both.",
)
@click.option(
    "--sign",
    "sign",
    default=None,
    metavar="KEY",
    help="With --remote: the key (a name in kvgraft keys list, or a file) that signs the states this instance "
    "uploads; the others graft them only when they trust it.",
)
@click.option(
    "--lookup-ms",
    type=click.FloatRange(1, 10000),
    default=50.0,
    show_default=True,
    help="With --remote: how long a lookup may take before the prompt is prefilled here.",
)
@engine_options
@handle_errors
def serve_cmd(
    host, port, api_key, cache_budget, queue_size, time_limit, cors_origins, remote, share_cache, sign, lookup_ms, state
) -> None:
    """Serve the OpenAI API (/v1/chat/completions with tools and response_format, /v1/completions,
    /v1/models, /health, /metrics) with a prompt cache that survives restarts: a request reuses the
    longest prefix the warm context or the library holds (after a restart too) and gets the same logits
    as a cold run; states are stored at message boundaries, the last 64-token block and after a
    conversation's reply (docs/server.md). On an engine whose bits depend on the batching, prompts are
    decoded in aligned blocks instead."""
    try:
        opts = ServeOptions(
            host=host,
            port=port,
            api_key=api_key,
            budget_bytes=None if cache_budget is None else parse_size(cache_budget),
            queue_size=queue_size,
            time_limit_s=time_limit,
            cors_origins=tuple(cors_origins),
            remote=remote,
            share_cache=share_cache,
            sign_key=resolve_key(sign) if sign else None,
            lookup_ms=lookup_ms,
        )
        level = "info" if logging.getLogger().level <= logging.INFO else "warning"
        serve(state.settings, cli_home(), opts, lambda m: click.echo(m, err=True), level)
    except ServeError as exc:
        raise click.UsageError(str(exc)) from None
