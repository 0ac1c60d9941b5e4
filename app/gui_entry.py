"""`kvgraft-app`: the desktop app's launcher (a GUI script: no console window on Windows)."""

from __future__ import annotations

import sys


def main() -> None:
    from ui.main_window import run

    sys.exit(run())
