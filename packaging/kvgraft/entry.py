"""The one entry point: the `kvgraft` CLI, the `kvgraft-app` window and the PyInstaller bundle.

The CLI group lives in kvgraft.app.cli; the window's `app` command lives in kvgraft.ui and is
added here, so that app/ never imports ui/ (an import contract checks it). Qt is imported only
when the window opens.
"""

from __future__ import annotations

import sys

from kvgraft.app.cli import cli
from kvgraft.ui.app_cmd import app_cmd

cli.add_command(app_cmd)

WINDOW_FILES = (".kvpack", ".jsonl", ".gguf")


def main() -> None:
    """`kvgraft ...`: the command line."""
    cli(prog_name="kvgraft")


def gui_main() -> None:
    """`kvgraft-app`: the desktop window (a GUI script: no console window on Windows)."""
    sys.exit(_run_window(sys.argv))


def bundle_main() -> None:
    """The bundle's executable: no arguments (or only files from a file manager) opens the window,
    anything else runs the CLI."""
    if len(sys.argv) == 1 or all(a.endswith(WINDOW_FILES) for a in sys.argv[1:]):
        sys.exit(_run_window(sys.argv))
    main()


def _run_window(argv: list[str]) -> int:
    import os

    from kvgraft.app.core.desktop_libs import missing_libraries_message, missing_window_libraries

    if os.environ.get("QT_QPA_PLATFORM", "xcb") == "xcb" and os.environ.get("DISPLAY"):
        missing = missing_window_libraries()  # Qt would abort (exit 134) naming the wrong package
        if missing:
            print(f"kvgraft: {missing_libraries_message(missing)}", file=sys.stderr)
            return 1
    from kvgraft.ui.main_window import run

    return run(argv)
