"""`kvgraft-app`: the desktop app's launcher."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from ui.main_window import run  # type: ignore[import-not-found]
    except ImportError:
        sys.stderr.write(
            "kvgraft-app: the desktop window is not part of this build yet; use the `kvgraft` command.\n"
        )
        sys.exit(2)
    sys.exit(run())
