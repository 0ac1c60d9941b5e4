"""`kvgraft serve` inside a process that already has its one engine thread: the window's "Start server".

The HTTP side is the same Starlette app (app/serve/http.py) under uvicorn, on a thread of its own. What
differs from `kvgraft serve` is who runs the jobs: not a thread of the server's, but the caller's engine
thread (the window's worker, which also answers questions and threads), so there is one model load, one
llama.cpp caller and one writer to the index. `submit` (any thread) queues a job and calls `wake`; the
owner of the engine thread then calls `drain` there (app/core/jobs.py `JobQueue.drain`), which runs the
queued jobs through the one decode loop (app/serve/worker.py `serve_job`) and stores the states the
prompt cache captured.

`start`, `drain` and `stop` run on the engine thread; `submit` and the attributes http.py reads
(`ready`, `load_error`, `depth`, `service`, `cache`) are safe from the HTTP thread.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

import uvicorn

from kvgraft.app.core.jobs import JobQueue
from kvgraft.app.serve.http import Server, ServerConfig, build_app
from kvgraft.app.serve.prompt_cache import PromptCache
from kvgraft.app.serve.run import ServeError, ServeOptions, check_options
from kvgraft.app.serve.worker import ServeJob, refuse, serve_recorded, store_one
from kvgraft.app.service import LibraryService


class EmbeddedServer(JobQueue):
    def __init__(
        self,
        service: LibraryService,
        opts: ServeOptions,
        wake: Callable[[], None],
        on_request: Callable[[dict], None] | None = None,
    ) -> None:
        check_options(opts)
        super().__init__(opts.queue_size)
        self.service = service  # the caller's: it stays open when the server stops
        self.opts = opts
        self.cache = PromptCache(service, opts.budget_bytes or 0, opts.block)
        self._wake = wake
        self._on_request = on_request
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.port = opts.port
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.opts.host}]" if ":" in self.opts.host else self.opts.host
        return f"http://{host}:{self.port}/v1"

    # -- the HTTP thread -----------------------------------------------------------------------
    def submit(self, job: ServeJob) -> None:
        super().submit(job)
        self._wake()

    # -- the engine thread ---------------------------------------------------------------------
    def start(self, timeout_s: float = 10.0) -> None:
        """Bind the port (a port in use is a ServeError, at once), warm the context, serve."""
        family = socket.AF_INET6 if ":" in self.opts.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.opts.host, self.opts.port))
        except OSError as exc:
            sock.close()
            raise ServeError(f"cannot listen on {self.opts.host}:{self.opts.port}: {exc.strerror or exc}") from None
        self.port = sock.getsockname()[1]
        self.cache.warm_up()
        server = Server(
            self,
            ServerConfig(
                api_key=self.opts.api_key,
                max_body_bytes=self.opts.max_body_bytes,
                time_limit_s=self.opts.time_limit_s,
                on_answered=self._on_request,
            ),
        )
        config = uvicorn.Config(build_app(server), log_level="warning", timeout_graceful_shutdown=2, lifespan="off")
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [sock]}, name="kvgraft-http", daemon=True
        )
        self._thread.start()
        end = time.monotonic() + timeout_s
        while not self._uvicorn.started and self._thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        if not self._uvicorn.started:
            self._uvicorn.should_exit = True
            sock.close()
            raise ServeError(f"the server on {self.url} did not start")
        self.ready.set()

    # -- app/core/jobs.py JobQueue's hooks: `drain` runs the queued requests, then stores what waits --
    def run(self, job: ServeJob) -> None:
        record = serve_recorded(self.cache, job)
        if self._on_request is not None:
            self._on_request(record)

    def after(self) -> None:
        store_one(self.cache)

    def has_idle_work(self) -> bool:
        return bool(self.cache.pending)

    def idle(self) -> None:
        store_one(self.cache)

    def stop(self) -> dict:
        """Refuse what waits, stop the HTTP thread, store the pending states, free the cache's context."""
        refuse(self.waiting())
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self.ready.clear()
        stored = self.cache.flush()
        dropped = self.cache.pending
        self.cache.close_session()
        return {"stored": stored, "dropped": dropped}
