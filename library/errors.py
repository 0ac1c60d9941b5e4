"""Typed errors raised by the library."""

import sqlite3


class LibraryError(Exception):
    """Base class for library errors a user can cause or meet."""


class BlobMissing(LibraryError):
    """A blob the index references is not on disk."""


class BlobCorrupt(LibraryError):
    """A blob's bytes do not match its SHA-256 (damaged or tampered)."""


class EntryNotFound(LibraryError):
    """No entry with that id."""


class StorageFull(LibraryError):
    """The disk filled up while writing; nothing was committed."""


class BlobUnreadable(LibraryError):
    """A blob that is on disk but could not be read this time (an OS error: EIO, a permission, ...).

    Not damage: its bytes were never compared, so nothing is marked and a later read may work."""


# The index's own errors (a locked or unreadable index.db): callers above the library catch this
# name and never import the SQLite driver themselves.
IndexDatabaseError = sqlite3.Error


class RemoteError(LibraryError):
    """A remote store could not be reached or refused a request (endpoint, credentials, bucket, network)."""


class RemoteConflict(RemoteError):
    """A conditional write lost its race (the object changed, or already exists): read again and retry."""
