"""The one worker thread that owns the engine: every llama.cpp call of the app happens here.

The GUI thread talks to it only through queued signals (WorkerClient) and never waits on it.
Long operations report progress and check a cancel flag between chunks/items: a callback raises
`Cancelled` once it is set (app/core/progress.py, the one cancel protocol).

A cancel applies to the operation running and to every request queued before it, never to one
made after it. `cancel()` (GUI thread) sets the flag and queues a marker behind the requests
already queued; requests run in the order queued, so every request found with the flag set was
queued before the marker, and the marker clears the flag once it is reached (unless a later
cancel is still pending).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from PySide6.QtCore import QMetaObject, QObject, Qt, QThread, Signal, Slot

from kvgraft.app.answer.ask import ask as run_ask
from kvgraft.app.core.errors import EngineError
from kvgraft.app.core.jobs import Cancelled, Errored, Started, run_job
from kvgraft.app.core.progress import CancelFlag
from kvgraft.app.core.runtime import Settings, open_engine
from kvgraft.app.ingest.import_files import import_files
from kvgraft.app.maintain.migrate import predecessors
from kvgraft.app.maintain.repair import check_library
from kvgraft.app.packs.export import export_pack
from kvgraft.app.service import LibraryService, open_library
from kvgraft.app.verify.batch import verify_targets

from .first_start import MODEL_STAGE
from .remote_ops import RemoteOps
from .worker_ops import WorkerOps

log = logging.getLogger(__name__)


class EngineWorker(QObject, WorkerOps, RemoteOps):
    ready = Signal(dict)  # model name, backend, fingerprint, n_ctx
    status = Signal(str)
    progress = Signal(str, int, int)  # stage, done, total
    token = Signal(str)
    answered = Signal(dict)
    deposited = Signal(dict)
    imported = Signal(dict)  # {imported, skipped, refused: [{file, reason}]}
    verified = Signal(dict)
    exported = Signal(dict)
    repaired = Signal(dict)  # RepairReport: {"ok", "lines", "report"}
    library_changed = Signal()
    failed = Signal(str, str)  # operation, message
    busy = Signal(bool)
    # conversations, disk and the server (ui/worker_ops.py)
    chat_token = Signal(int, str)  # thread, piece of the reply
    chat_done = Signal(dict)  # SayResult.as_dict() and wall_ms
    chat_changed = Signal(int)  # a thread made, renamed, forked (its id) or deleted (-1)
    turn_checked = Signal(dict)  # ChatService.check_turn
    removed = Signal(dict)  # {entries, removed_blobs, removed_bytes}
    collected = Signal(dict)  # gc's summary
    server_state = Signal(dict)  # {"running", "url"} or {"running": False, "stored", "dropped"}
    server_log = Signal(dict)  # one request the server answered (app/serve/embedded.py)
    server_wake = Signal()  # emitted by the HTTP thread: a job waits
    remote_done = Signal(dict)  # {"op": add/rm/push/pull, "name", ...} (ui/remote_ops.py)
    rebuilt = Signal(dict)  # rebuild_entries: {rebuilt, already_here, ids, from}

    def __init__(self, settings: Settings, engine=None) -> None:
        super().__init__()
        self.settings = settings
        self.engine = engine  # tests inject an already-loaded engine
        self._owns_engine = engine is None
        self._cancel = CancelFlag()
        self._cancels_pending = 0  # cancels whose marker the worker has not reached yet
        self._cancel_lock = threading.Lock()
        self._lib = None
        self._svc = None
        self._server = None
        self.server_wake.connect(self.drain_server, Qt.QueuedConnection)

    # -- called from the GUI thread directly: sets a flag, queues its end -------------------------
    def cancel(self) -> None:
        """Stop the operation running and every request queued so far (see the module doc)."""
        with self._cancel_lock:
            self._cancels_pending += 1
            self._cancel.set()
        # not a signal of the worker: WorkerClient.stop blocks those, and the flag must still end
        QMetaObject.invokeMethod(self, "_cancel_reached", Qt.QueuedConnection)

    @Slot()
    def _cancel_reached(self) -> None:
        """Every request queued before the matching cancel has run (or been skipped)."""
        with self._cancel_lock:
            self._cancels_pending -= 1
            if self._cancels_pending == 0:
                self._cancel.clear()

    # -- plumbing ---------------------------------------------------------------------------------
    def _service(self) -> LibraryService:
        """One service for the worker's life: its warm context is reused by every question."""
        if self._lib is None:
            self._lib = open_library()
        if self._svc is None or self._svc.engine is not self.engine:
            if self._svc is not None:
                self._svc.close()
            self._svc = LibraryService(self.engine, self._lib)
        return self._svc

    def _predecessors(self) -> list[str]:
        """The fingerprints this engine's entries were stored under by earlier versions (app/maintain/migrate.py)."""
        return predecessors(self.engine, self._service().library)

    def _progress(self, stage: str):
        def report(done: int, total: int) -> None:
            self.progress.emit(stage, done, total)
            self._cancel.check()  # raises Cancelled: the prefill stops after this chunk

        return report

    def _run(self, op: str, fn) -> None:
        """Run one operation through the one job runner (app/core/jobs.py): busy while it runs, and an
        ending that is not a result reaches the window as `failed(op, message)`."""
        if self.engine is None and op != "start":
            self.failed.emit(op, "the model is not loaded yet")
            return
        if op != "start" and self._cancel.is_set():  # queued before a cancel: never started (a load is not stopped)
            self.failed.emit(op, "cancelled")
            return
        run_job(op, fn, self._on_event)

    def _on_event(self, event) -> None:
        if isinstance(event, Started):
            self.busy.emit(True)
            return
        if isinstance(event, Cancelled):
            self.failed.emit(event.job, "cancelled")
        elif isinstance(event, Errored) and event.code == "internal":  # a bug: its words are for the log
            self.failed.emit(
                event.job,
                f"{event.job} stopped on an internal error ({event.kind}), a kvgraft bug; its traceback is in "
                "the log on stderr (`kvgraft -v app` shows more)",
            )
        elif isinstance(event, Errored):
            self.failed.emit(event.job, event.message)
        self.busy.emit(False)

    # -- operations (slots run in the worker thread) ------------------------------------------
    @Slot()
    def start(self) -> None:
        def go():
            if self.engine is None:
                self.status.emit("putting the model in place...")
                self.engine = open_engine(
                    self.settings,
                    on_progress=self.status.emit,
                    on_bytes=lambda done, total: self.progress.emit(MODEL_STAGE, done >> 20, total >> 20),
                )
            info = self.engine.model.info
            self.ready.emit(
                {
                    "model": info.name,
                    "path": info.path,
                    "backend": self.engine.backend,
                    "fingerprint": self.engine.fingerprint,
                    "fingerprint_info": self.engine.fingerprint_info,  # what differs from an entry's, in words
                    "n_ctx": self.engine.config.n_ctx,
                    # the settings that decide the bits besides the model, for the status bar
                    "flash_attn": self.engine.config.flash_attn,
                    "kv_types": f"{self.engine.config.type_k}/{self.engine.config.type_v}",
                    "model_sha256": info.sha256,
                    "predecessors": self._predecessors(),  # entries under these are left to migrate
                }
            )

        self._run("start", go)

    @Slot(str)
    def ask(self, question: str) -> None:
        def stream(piece: str) -> None:
            self.token.emit(piece)
            self._cancel.check()  # raises Cancelled: ask returns the part decoded, marked cancelled

        def go():
            t0 = time.perf_counter()
            r = run_ask(self._service(), question, on_text=stream)
            wall_ms = round((time.perf_counter() - t0) * 1e3, 1)
            self.answered.emit({**r.as_dict(), "provenance": r.provenance(), "wall_ms": wall_ms})

        self._run("ask", go)

    def _deposit(self, store) -> None:
        def go():
            res = store(self._service(), self._progress("prefill"))
            self.library_changed.emit()  # the table shows the change before the summary is shown
            self.deposited.emit(res.as_dict())

        self._run("deposit", go)

    @Slot(str, str, str)
    def deposit(self, text: str, question: str, answer: str) -> None:
        self._deposit(
            lambda svc, progress: svc.deposit(
                text, question=question or None, answer=answer or None, on_progress=progress
            )
        )

    @Slot(str, str, str)
    def deposit_solution(self, question: str, solution: str, answer: str) -> None:
        """An answer the user confirmed, stored in this model's solution format (app/proof/solution_format.py)."""
        self._deposit(
            lambda svc, progress: svc.deposit_solution(
                question, solution, answer, on_progress=progress, vouched_by="you"
            )
        )

    @Slot(list)
    def import_files(self, paths: list) -> None:
        def go():
            # the CLI's `kvgraft import` runs the same use case: packs whole or refused (unsigned entries
            # replayed before anything is written), problem files built; stopping midway changes no pack
            summary = import_files(self._service(), paths, progress=self._cancel.reporting(self.progress.emit))
            self.library_changed.emit()  # the table shows the change before the summary is shown
            self.imported.emit(summary.as_dict())

        self._run("import", go)

    @Slot(list, bool)
    def verify(self, ids: list, replay: bool) -> None:
        def go():
            service = self._service()
            entries = [service.library.get(int(i)) for i in ids] if ids else service.library.entries()
            report = self._cancel.reporting(lambda _stage, done, total: self.progress.emit("verify", done, total))
            # the same use case as `kvgraft verify --library`
            out = verify_targets(service, entries=entries, replay=replay, samples=1, progress=report)
            self.library_changed.emit()
            self.verified.emit(out.receipts)

        self._run("verify", go)

    @Slot()
    def repair(self) -> None:
        def go():
            # the same use case as `kvgraft fsck --repair`
            res = check_library(
                self._service().library, repair=True, progress=self._cancel.reporting(self.progress.emit)
            )
            self.library_changed.emit()
            self.repaired.emit({"ok": res.ok, "lines": res.lines(), "report": res.as_dict()})

        self._run("repair", go)

    @Slot(list, str)
    def export(self, ids: list, path: str) -> None:
        def go():
            service = self._service()
            self.exported.emit(export_pack(service, [service.library.get(int(i)) for i in ids], Path(path)).as_dict())

        self._run("export", go)

    @Slot(object, list)
    def call(self, method, args: list) -> None:
        """Run a WorkerOps or RemoteOps method here, on the engine thread (`WorkerClient.call`)."""
        method(self, *args)

    @Slot()
    def drain_server(self) -> None:
        WorkerOps.drain_server(self)

    def release_contexts(self) -> None:
        """Stop the server and free the warm contexts (called in the worker thread as it finishes)."""
        self.stop_server()
        if self._svc is not None:
            self._svc.close()
            self._svc = None

    @Slot()
    def shutdown(self) -> None:
        """Close the worker's library, and the engine if this worker loaded it (call once its thread has stopped)."""
        if self._svc is not None:
            try:
                self._svc.close()  # normally already done on the worker thread (release_contexts)
            except EngineError as exc:  # still owned by a live thread: leave it, close what else can be closed
                log.warning("the worker's warm context was not freed: %s", exc)
            self._svc = None
        if self._lib is not None:
            self._lib.close()
            self._lib = None
        if self._owns_engine and self.engine is not None:
            self.engine.close()
            self.engine = None


class WorkerClient(QObject):
    """Lives in the GUI thread; its signals queue requests to the worker thread."""

    request_start = Signal()
    request_ask = Signal(str)
    request_deposit = Signal(str, str, str)
    request_deposit_solution = Signal(str, str, str)
    request_import = Signal(list)
    request_verify = Signal(list, bool)
    request_export = Signal(list, str)
    request_repair = Signal()
    request_call = Signal(object, list)  # a WorkerOps/RemoteOps method and its arguments: run on the worker

    def __init__(self, worker: EngineWorker) -> None:
        super().__init__()
        self.worker = worker
        self.thread = QThread()
        self.thread.setObjectName("kvgraft-engine")
        worker.moveToThread(self.thread)
        self.request_start.connect(worker.start)
        self.request_ask.connect(worker.ask)
        self.request_deposit.connect(worker.deposit)
        self.request_deposit_solution.connect(worker.deposit_solution)
        self.request_import.connect(worker.import_files)
        self.request_verify.connect(worker.verify)
        self.request_export.connect(worker.export)
        self.request_repair.connect(worker.repair)
        self.request_call.connect(worker.call)
        # run in the worker thread as it ends: its warm context is freed by the thread that owns it
        self.thread.finished.connect(worker.release_contexts, Qt.DirectConnection)
        self.thread.start()

    def call(self, method, *args) -> None:
        """Queue `method(worker, *args)` for the engine thread: a WorkerOps or RemoteOps method, by reference."""
        self.request_call.emit(method, list(args))

    def stop(self, timeout_ms: int = 60_000) -> bool:
        """Cancel what runs, stop the thread, then release the worker's library and engine.

        Returns False when the thread did not stop in time; its resources are then left alone
        (the caller must keep this client alive: destroying a running QThread aborts the process).
        """
        self.worker.blockSignals(True)  # nothing it still emits reaches the window
        self.worker.cancel()
        self.thread.quit()
        if not self.thread.wait(timeout_ms):
            return False
        self.worker.shutdown()  # its thread has finished: safe to call from here
        return True
