"""A clean exit: the window quits without a fatal error, however long the session was.

The crash on File > Quit ("Fatal Python error: bool_dealloc ... finalizing", exit 134) came from
PySide6 6.12.0: SignalInstance.emit() returned True without a new reference, so every signal
the app emitted (one per streamed token) dropped one reference to True until teardown freed it.
pyproject.toml keeps PySide6 below 6.12; these tests fail on a PySide6 with that bug.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import shiboken6
from PySide6.QtCore import QObject, QSettings, Signal

from kvgraft.ui.main_window import MainWindow, close_window

HERE = Path(__file__).resolve().parent


class _Emitter(QObject):
    text = Signal(str)
    numbers = Signal(str, int, int)


def test_signal_emit_keeps_the_reference_count_of_true():
    """The cause, checked directly: 2,000 emits must not change how many references True has."""
    e = _Emitter()
    got = []
    e.text.connect(got.append)
    before = sys.getrefcount(True)
    for i in range(1000):
        e.text.emit("x")
        e.numbers.emit("stage", i, 1000)
    after = sys.getrefcount(True)
    assert len(got) == 1000
    assert abs(after - before) < 20, f"True lost {before - after} references over 2,000 emits"


def test_window_quits_from_the_menu_many_times(qtbot, engine, tmp_path):
    """Open, answer, quit by File > Quit and tear down as `run` does, three times in one process: the
    engine thread stops each time and the window's objects are gone."""
    for k in range(3):
        w = MainWindow(QSettings(str(tmp_path / f"s{k}.ini"), QSettings.IniFormat), engine=engine)
        w.show_message = lambda title, text, error: None
        w.show()
        qtbot.waitUntil(lambda w=w: bool(w.engine_info), timeout=60_000)
        w.question.setText("What is the capital of France?")
        w.ask()
        qtbot.waitUntil(lambda w=w: w.last_answer is not None and not w.progress.isVisible(), timeout=120_000)
        quit_action = next(a for a in w.menuBar().actions()[0].menu().actions() if a.text() == "Quit")
        quit_action.trigger()
        assert w._closed and not w.client.thread.isRunning(), "the engine thread was left running"
        close_window(w)
        assert not shiboken6.isValid(w), "the window was not deleted"


def test_long_session_then_quit_exits_cleanly(tmp_path):
    """A real session in its own process (fresh answers, the deposit dialog, a settings change that
    restarts the engine, another answer), then File > Quit: exit code 0, no fatal error at teardown."""
    env = {**os.environ, "KVGRAFT_HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env["QT_QPA_PLATFORM"] = "offscreen"
    proc = subprocess.run(
        [sys.executable, str(HERE / "quit_session.py")], capture_output=True, text=True, env=env, timeout=600
    )
    assert "Fatal Python error" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["depositable"] and seen["answers"] == 2 and seen["exit_code"] == 0
    assert abs(seen["true_refs_at_quit"] - seen["true_refs_at_start"]) < 50
