"""kvgraft: reuse a language model's KV cache as verified knowledge, byte-exactly.

The installed package maps the repository's top-level folders: kvgraft.engine (engine/, the only
importer of llama_cpp), kvgraft.library (library/), kvgraft.app (app/) and kvgraft.ui (ui/, Qt).
kvgraft.entry is the one entry point of the CLI, the window and the bundle.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvgraft")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"
