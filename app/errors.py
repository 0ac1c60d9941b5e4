"""The error types the app's callers (CLI, desktop UI) handle, in one place."""

from engine.errors import Cancelled, EngineError
from library.errors import LibraryError

from .gguf_check import NotAModel
from .model_store import ModelStoreError

__all__ = ["Cancelled", "EngineError", "LibraryError", "ModelStoreError", "NotAModel"]
