"""Start and stop `kvgraft serve`: the engine thread, the Starlette app under uvicorn, a graceful stop.

Loopback by default; any other host needs an API key (a server reachable from the network that
anyone can drive is refused at start). The model loads on the engine thread while the server
already answers (/health says 503 until it is ready). Ctrl-C or SIGTERM stops taking requests,
finishes the one in progress, and stores the automatic states still pending (or says how many were
dropped).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import uvicorn

from kvgraft.app.core.runtime import Settings, open_engine
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.serve.http import Server, ServerConfig, build_app
from kvgraft.app.serve.schedule import BLOCK
from kvgraft.app.serve.shared_cache import SharedCache
from kvgraft.app.serve.worker import EngineWorker, request_line
from kvgraft.app.service import LibraryService, open_library

log = logging.getLogger(__name__)

DEFAULT_BUDGET_SHARE = 0.10  # of the free disk in the data dir at start
DEFAULT_BUDGET_CAP = 20 * 1024**3
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class ServeError(ValueError):
    """A server setting a user gave is refused (a usage error)."""


def parse_size(text: str) -> int:
    """ "0", "512M", "2G", "1.5GB", "1000000" as bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text.upper())
    if not m:
        raise ServeError(f"{text!r} is not a size: a number with an optional unit K, M, G or T (e.g. 2G)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def default_budget(home: Path) -> int:
    home.mkdir(parents=True, exist_ok=True)
    return min(int(shutil.disk_usage(home).free * DEFAULT_BUDGET_SHARE), DEFAULT_BUDGET_CAP)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    budget_bytes: int | None = None
    queue_size: int = 16
    time_limit_s: float = 600.0
    max_body_bytes: int = 8 * 1024 * 1024
    block: int = BLOCK
    cors_origins: tuple[str, ...] = ()
    remote: str | None = None  # a fleet's shared cache on this remote (app/serve/shared_cache.py)
    share_cache: str = "both"  # push, pull or both
    sign_key: Path | None = None  # the instance's key: signs what it pushes
    lookup_ms: float = 50.0


def check_options(opts: ServeOptions) -> None:
    if not is_loopback(opts.host) and not opts.api_key:
        raise ServeError(
            f"--host {opts.host} is reachable from other machines: set an API key (--api-key or KVGRAFT_API_KEY)"
        )
    if opts.api_key is not None and not opts.api_key.strip():
        raise ServeError("the API key is empty")
    if opts.share_cache not in ("push", "pull", "both"):
        raise ServeError(f"--share-cache is push, pull or both, not {opts.share_cache!r}")
    if opts.remote is not None and opts.share_cache != "pull" and opts.sign_key is None:
        raise ServeError(
            "--remote shares this instance's cache states: sign them with --sign KEY (or --share-cache pull)"
        )


def make_worker(settings: Settings, home: Path, opts: ServeOptions, on_message: Callable[[str], None]) -> EngineWorker:
    t0 = time.monotonic()

    def open_service() -> LibraryService:
        on_message(f"loading the model ({settings.model or 'the embedded 270M'}) ...")
        engine = open_engine(settings, on_progress=on_message)
        on_message(
            f"loaded {engine.model.info.name} in {time.monotonic() - t0:.1f} s; the invariance probe "
            "(is every batching's output the same bits? computed on a first start, then cached) ..."
        )
        t1 = time.monotonic()
        engine.fingerprint  # noqa: B018  (runs or reads the probe now, not in the first request)
        verdict = "batch-invariant" if engine.batch_invariant else "not batch-invariant: prompts go in aligned blocks"
        on_message(f"probe: {verdict} ({time.monotonic() - t1:.1f} s)")
        return LibraryService(engine, open_library(home))

    def ready() -> None:
        on_message(f"ready in {time.monotonic() - t0:.1f} s")

    shared = None
    if opts.remote is not None:

        def shared(service: LibraryService) -> SharedCache:
            return SharedCache(
                service.library.remotes.get(opts.remote),
                trust_store(home),
                push=opts.share_cache in ("push", "both"),
                pull=opts.share_cache in ("pull", "both"),
                sign_key=opts.sign_key,
                lookup_ms=opts.lookup_ms,
            )

    return EngineWorker(
        open_service,
        opts.budget_bytes or 0,
        opts.block,
        opts.queue_size,
        shared,
        on_request=lambda r: on_message(request_line(r)),
        on_ready=ready,
    )


def answered_line(r: dict) -> str:
    """The log line of a request answered without a job (the model list, a refusal before one ran)."""
    return f"{r['method']} {r['path']} {r['status']}" + (f": {r['message']}" if r.get("message") else "")


def serve(settings: Settings, home: Path, opts: ServeOptions, say: Callable[[str], None], log_level: str) -> dict:
    """Run until Ctrl-C or SIGTERM; returns what the stop did with the pending states."""
    check_options(opts)
    if opts.remote is not None:  # an unknown remote is refused before anything starts
        with open_library(home) as lib:
            lib.remotes.get(opts.remote)
    if opts.budget_bytes is None:
        opts.budget_bytes = default_budget(home)
    worker = make_worker(settings, home, opts, say)
    worker.start()
    server = Server(
        worker,
        ServerConfig(
            api_key=opts.api_key,
            max_body_bytes=opts.max_body_bytes,
            time_limit_s=opts.time_limit_s,
            cors_origins=opts.cors_origins,
            on_answered=lambda r: say(answered_line(r)),
        ),
    )
    config = uvicorn.Config(
        build_app(server),
        host=opts.host,
        port=opts.port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        lifespan="off",
    )
    say(
        f"kvgraft serve: http://{opts.host}:{opts.port}/v1 (data dir {home}; prompt cache budget "
        f"{opts.budget_bytes / 1024**3:.1f} GiB{', storing off' if not opts.budget_bytes else ''}; "
        f"cache blocks of {opts.block} tokens; {'API key required' if opts.api_key else 'no API key'}"
        + (f"; the cache shared on remote {opts.remote} ({opts.share_cache})" if opts.remote else "")
        + ")"
    )
    # uvicorn stops on SIGINT and SIGTERM, then raises the signal again with the handler it found:
    # a quiet one for SIGTERM lets the pending states be stored instead of the process dying there
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        uvicorn.Server(config).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        say("stopping: finishing the request in progress and storing the pending automatic states")
        stopped = worker.stop(store_pending=True)
        if worker.load_error is not None:
            say(f"the model could not be loaded: {worker.load_error}")
        elif stopped:
            say(f"stored {stopped['stored']} pending automatic states, dropped {stopped['dropped']}")
    return stopped
