"""Run a script in a process with the batch invariance switched off (KVGRAFT_BATCH_INVARIANT=0, llama.cpp's
own row-count switches): the fallback, or a library as the build before the invariant one made it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvgraft.engine.switches import SWITCH, VARIABLES

REPO = Path(__file__).resolve().parent.parent


def run_without_invariance(script: str, *args: str) -> dict:
    """Run `script` (python -c) with `args` in the repository; the JSON object its last line prints."""
    out = run_in_mode("0", script, *args)
    assert out["invariant"] is False, "the engine found itself batch-invariant with invariance switched off"
    return out


def run_in_mode(mode: str, script: str, *args: str) -> dict:
    """`script` in a process whose engine takes `mode` (KVGRAFT_BATCH_INVARIANT: "0" for llama.cpp's own
    switches, or a mode of engine/switches.py, such as the one an earlier kvgraft used)."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env[SWITCH] = mode
    run = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
