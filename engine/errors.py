"""Typed errors raised by the engine. Every failure a user can cause maps to one of these."""


class EngineError(Exception):
    """Base class for every error the engine raises on purpose."""


class ConfigError(EngineError):
    """An EngineConfig value is out of range or inconsistent."""


class ModelLoadError(EngineError):
    """The model file is missing, unreadable or rejected by llama.cpp."""


class SnapshotError(EngineError):
    """Snapshot bytes are malformed, truncated, padded or for another model/layout."""


class FingerprintMismatch(EngineError):
    """A snapshot was made under a different engine fingerprint and cannot be grafted exactly."""


class DecodeError(EngineError):
    """llama_decode failed (context full, allocation failure, ...)."""


class ThreadOwnershipError(EngineError):
    """A session was used from a thread that does not own it."""


class Cancelled(EngineError):
    """A long operation was cancelled between chunks.

    The one cancel protocol of kvgraft: a progress or streaming callback that wants the work to
    stop raises Cancelled (no callback signals it by what it returns). A prefill lets it through
    to its caller; a generation catches it and returns what it decoded, stop_reason "callback"."""
