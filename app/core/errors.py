"""The error types the app's callers (CLI, desktop UI) handle, in one place."""

from kvgraft.app.core.gguf_check import NotAModel
from kvgraft.app.core.model_store import ModelStoreError
from kvgraft.engine.errors import Cancelled, EngineError
from kvgraft.library.errors import EntryNotFound, LibraryError

__all__ = ["Cancelled", "EngineError", "EntryNotFound", "LibraryError", "ModelStoreError", "NotAModel"]
