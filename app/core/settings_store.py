"""The settings of one data dir: `settings.json` beside its library, read by the window, the CLI and
`kvgraft serve` alike, so one library is not filled under two engine configurations by accident.

The window writes the whole Settings there once a model loaded with them; the CLI and the server take
them as their defaults (an option given on the command line wins for that run; the file is written only
by the window and `kvgraft settings --save`). A missing file means the built-in defaults; a damaged one
is read field by field (Settings.from_dict: a field of the wrong type keeps its default).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvgraft.app.core.runtime import Settings

SETTINGS_FILE = "settings.json"


def settings_path(home: Path) -> Path:
    return Path(home) / SETTINGS_FILE


def saved_settings(home: Path) -> Settings | None:
    """The data dir's saved settings, or None where it has none."""
    try:
        raw = json.loads(settings_path(home).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return Settings()
    return Settings.from_dict(raw) if isinstance(raw, dict) else Settings()


def save_settings(home: Path, settings: Settings) -> Path:
    """Write the whole Settings atomically (a crash leaves the old file or the new one, never half)."""
    path = settings_path(home)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(settings.to_dict(), indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
