"""The error types the app's callers (CLI, desktop UI) handle, in one place."""

from kvgraft.engine.errors import Cancelled, EngineError
from kvgraft.library.errors import LibraryError

from .gguf_check import NotAModel
from .model_store import ModelStoreError

__all__ = ["Cancelled", "EngineError", "LibraryError", "ModelStoreError", "NotAModel"]
