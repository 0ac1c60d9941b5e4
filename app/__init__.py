"""kvgraft application layer: services, CLI and wiring shared by the CLI and the desktop app."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvgraft")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"
