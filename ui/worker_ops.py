"""The engine worker's conversation, server and disk operations (mixed into ui/worker.EngineWorker).

The window asks for one by its method (`WorkerClient.call(WorkerOps.chat_say, ...)`): a reference a
search finds, never a name in a string.

They run on the one engine thread like every other operation: a thread's reply, a turn's check, the
server's jobs (app/serve/embedded.py: the HTTP thread queues them and wakes this thread), and every
write to the index. The GUI thread reads the index on its own connection and never waits on these.
"""

from __future__ import annotations

import logging
import random
import time

from kvgraft.app.answer.chat import ChatService, regenerate_sampling
from kvgraft.app.maintain.disk import collect, remove_entries
from kvgraft.app.packs.rebuild import rebuild_entries
from kvgraft.app.serve.embedded import EmbeddedServer
from kvgraft.app.serve.run import ServeOptions, default_budget

log = logging.getLogger(__name__)


class WorkerOps:
    """Needs EngineWorker's signals, `_run`, `_service`, `_cancel` and `settings`."""

    _server: EmbeddedServer | None = None
    max_reply_tokens = 256

    # -- conversations ---------------------------------------------------------------------------
    def _chats(self) -> ChatService:
        return ChatService(self._service())

    def _reply(self, thread_id: int, say) -> None:
        def stream(piece: str) -> None:
            self.chat_token.emit(thread_id, piece)
            self._cancel.check()  # raises Cancelled: say keeps the part decoded, the thread stays consistent

        t0 = time.perf_counter()
        r = say(stream)
        self.chat_done.emit({**r.as_dict(), "wall_ms": round((time.perf_counter() - t0) * 1e3, 1)})

    def chat_say(self, thread_id: int, message: str, system: str) -> None:
        def go():
            tid = thread_id
            if tid < 0:  # the first message of a new thread
                tid = self._chats().new_thread(system=system or None, title=message[:60]).id
                self.chat_changed.emit(tid)
            chats = self._chats()
            self._reply(tid, lambda on_text: chats.say(tid, message, max_tokens=self.max_reply_tokens, on_text=on_text))

        self._run("chat", go)

    def chat_regenerate(self, thread_id: int) -> None:
        sampling = regenerate_sampling(random.randrange(2**31))

        def go():
            self._reply(
                thread_id,
                lambda on_text: self._chats().regenerate(
                    thread_id, max_tokens=self.max_reply_tokens, on_text=on_text, sampling=sampling
                ),
            )

        self._run("regenerate", go)

    def chat_new(self, system: str, from_entry: int, title: str) -> None:
        def go():
            t = self._chats().new_thread(
                system=system or None, from_entry=None if from_entry < 0 else from_entry, title=title or None
            )
            self.chat_changed.emit(t.id)

        self._run("new thread", go)

    def chat_fork(self, thread_id: int, turn: int) -> None:
        self._run("fork", lambda: self.chat_changed.emit(self._chats().fork(thread_id, turn).id))

    def chat_rename(self, thread_id: int, title: str) -> None:
        self._run(
            "rename", lambda: self.chat_changed.emit(self._service().library.threads.rename_thread(thread_id, title).id)
        )

    def chat_delete(self, thread_id: int) -> None:
        def go():
            self._chats().remove(thread_id)
            self.chat_changed.emit(-1)

        self._run("delete thread", go)

    def chat_check(self, thread_id: int, turn: int) -> None:
        self._run("check", lambda: self.turn_checked.emit(self._chats().check_turn(thread_id, turn)))

    def rebuild(self, ids: list) -> None:
        """Entries made under other settings computed again for these (Ask's offer, app/packs/rebuild.py)."""

        def go():
            out = rebuild_entries(self._service(), ids, self._cancel.reporting(self.progress.emit))
            self.library_changed.emit()
            self.rebuilt.emit(out)

        self._run("rebuild", go)

    # -- disk --------------------------------------------------------------------------------------
    def remove(self, ids: list) -> None:
        def go():
            out = remove_entries(self._service().library, ids)
            out.pop("removed")
            self.library_changed.emit()
            self.removed.emit(out)

        self._run("remove", go)

    def gc(self) -> None:
        def go():
            out = collect(self._service().library)
            self.library_changed.emit()
            self.collected.emit(out)

        self._run("gc", go)

    # -- the server --------------------------------------------------------------------------------
    def server_start(self, opts: dict) -> None:
        def go():
            if self._server is not None:
                self.server_state.emit({"running": True, "url": self._server.url})
                return
            service = self._service()
            o = ServeOptions(**opts)
            if o.budget_bytes is None:
                o.budget_bytes = default_budget(service.library.root)
            server = EmbeddedServer(service, o, wake=self.server_wake.emit, on_request=self.server_log.emit)
            server.start()
            self._server = server
            self.server_state.emit({"running": True, "url": server.url})

        self._run("server", go)

    def server_stop(self) -> None:
        def go():
            out = self.stop_server()
            self.server_state.emit({"running": False, **out})

        self._run("server", go)

    def drain_server(self) -> None:
        """The HTTP thread queued a job: run it here, on the engine thread (never cancelled by the window's Stop)."""
        if self._server is not None:
            self._server.drain()

    def stop_server(self) -> dict:
        server, self._server = self._server, None
        if server is None:
            return {}
        try:
            return server.stop()
        except Exception as exc:  # noqa: BLE001 (a stop must finish: the states it could not store are logged)
            log.warning("the server stopped with an error: %s", exc)
            return {}
