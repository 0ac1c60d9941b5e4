"""Where kvgraft keeps things: the data dir (library) and the model cache (shared by all data dirs)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "kvgraft"


def data_dir(home: Path | str | None = None) -> Path:
    """`home` when given (the CLI's `--home`), else `$KVGRAFT_HOME` if set, else the platform's
    user data dir. Created on demand."""
    env = os.environ.get("KVGRAFT_HOME")
    if home is not None:
        path = Path(home).expanduser()
    else:
        path = Path(env).expanduser() if env else Path(platformdirs.user_data_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def model_dir() -> Path:
    """`$KVGRAFT_MODEL_DIR` if set, else `<user cache dir>/kvgraft/models`. Created on demand."""
    env = os.environ.get("KVGRAFT_MODEL_DIR")
    path = Path(env).expanduser() if env else Path(platformdirs.user_cache_dir(APP_NAME)) / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
