"""The engine worker's team-library operations (mixed into ui/worker.EngineWorker): add and forget a
remote, push entries, pull. They run on the engine thread like every write to the index; push and pull
report progress and stop at Cancel (a cancelled pull has imported nothing of the manifest it was on)."""

from __future__ import annotations

from kvgraft.app.remote.manage import add_checked, forget, pull_named, push_named


class RemoteOps:
    """Needs EngineWorker's signals (`remote_done`, `library_changed`, `progress`), `_run`, `_service`, `_cancel`."""

    def remote_add(self, name: str, url: str, endpoint: str) -> None:
        def go():
            spec = add_checked(self._service().library, name, url, endpoint or None)
            self.remote_done.emit({"op": "add", **spec})

        self._run("remote", go)

    def remote_rm(self, name: str) -> None:
        def go():
            forget(self._service().library, name)
            self.remote_done.emit({"op": "rm", "name": name})

        self._run("remote", go)

    def remote_push(self, name: str, ids: list) -> None:
        def go():
            report = self._cancel.reporting(self.progress.emit)
            res = push_named(self._service().library, name, [int(i) for i in ids] or None, progress=report)
            self.remote_done.emit({"op": "push", "name": name, **res.as_dict()})

        self._run("remote", go)

    def remote_pull(self, name: str, require_signed: bool) -> None:
        def go():
            report = self._cancel.reporting(self.progress.emit)
            try:
                res = pull_named(self._service(), name, require_signed=bool(require_signed), progress=report)
            finally:
                self.library_changed.emit()  # whole manifests may have gone in before a cancel
            self.remote_done.emit({"op": "pull", "name": name, **res.as_dict()})

        self._run("remote", go)
